from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from prorl_async.llm.pool import Backend, BackendPool, PoolConfig
from prorl_async.scripted_llm import ScriptedLLM

StartLLM = Callable[..., Awaitable[ScriptedLLM]]


def backend(pool: BackendPool, address: str) -> Backend:
    """The pool's backend at ``address`` (registered)."""
    found = pool.get(address)
    assert found is not None, f"{address} is not registered"
    return found


# Fast failover and probing so the health tests take milliseconds, not seconds.
FAST = PoolConfig(
    failure_threshold=2,
    probe_interval_s=0.02,
    probe_timeout_s=0.5,
    retries=3,
    retry_backoff_s=0.0,
    request_timeout_s=5.0,
)


@pytest.fixture
async def start_llm() -> AsyncIterator[StartLLM]:
    """Start ScriptedLLM servers on loopback; all are closed at teardown."""
    async with contextlib.AsyncExitStack() as stack:

        async def start(**kw: Any) -> ScriptedLLM:
            return await stack.enter_async_context(ScriptedLLM(**kw))

        yield start


@pytest.fixture
async def pool() -> AsyncIterator[BackendPool]:
    async with BackendPool(FAST) as p:
        yield p
