"""The server-wide parts a handler may use through ``job.shared``, and setting them up:
tokenizer, LLM backend pool, sandbox runtime (with its budget and warm sandboxes)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import msgspec

from prorl_async.capacity import default_max_sandboxes
from prorl_async.config import ServerConfig
from prorl_async.core.metrics import Metrics
from prorl_async.llm.pool import BackendPool
from prorl_async.llm.tokenizer import ChatTokenizer, load_tokenizer
from prorl_async.sandbox import Runtime, SandboxRecords, SandboxSpec, WarmPool, get_runtime

__all__ = ["Shared", "open_shared"]

log = logging.getLogger(__name__)


class Shared:
    """Shared resources set up once per server (see ``open_shared``).

    ``pool`` is the LLM backend pool, ``runtime`` the sandbox runtime and
    ``tokenizer`` the chat tokenizer; each is ``None`` until the server sets it up.
    """

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.pool: BackendPool | None = None
        self.runtime: Runtime | None = None
        self.tokenizer: ChatTokenizer | None = None
        self.metrics: Metrics | None = None


@asynccontextmanager
async def open_shared(shared: Shared) -> AsyncIterator[Shared]:
    """Open the shared parts in order, close them in reverse (after every job is released)."""
    config = shared.config
    shared.tokenizer = load_tokenizer(config.tokenizer)
    runtime_config = msgspec.structs.replace(
        config.sandbox, state_dir=config.state_dir, image=config.sandbox.image or config.image
    )
    # Killing and waiting for what a dead server left blocks: not on the event loop.
    reaped = await asyncio.to_thread(SandboxRecords(config.state_dir).reap_stale)
    if reaped:
        log.warning("reaped %d sandboxes left by a previous run", len(reaped))
    async with AsyncExitStack() as stack:
        shared.pool = await stack.enter_async_context(BackendPool(config.pool))
        shared.pool.observer = shared.metrics
        runtime = get_runtime(config.runtime, runtime_config)
        stack.push_async_callback(runtime.aclose)
        limits = config.sandbox_limits
        runtime.budget.resize(config.max_sandboxes or default_max_sandboxes(limits))
        log.info("sandbox budget: %d live sandboxes at most", runtime.budget.capacity)
        shared.runtime = runtime
        log.info("sandbox limits enforced: %s", runtime.enforcement())
        if config.warm_sandboxes > 0:
            # The spec math/code/swe INIT asks for: it does not depend on the instance.
            warm = WarmPool(runtime, SandboxSpec(limits=limits), config.warm_sandboxes)
            await stack.enter_async_context(warm)
            warm.start()
        try:
            yield shared
        finally:
            shared.pool = None
            shared.runtime = None
