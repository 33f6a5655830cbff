"""Real rollout servers in their own processes plus a scripted LLM test double."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

from prorl_async.scripted_llm.latency import LatencyModel
from prorl_async.scripted_llm.server import ScriptedLLM
from tests.helpers import server_process


class Rig:
    """``urls`` of the rollout servers, their processes, and the scripted LLM."""

    def __init__(self, urls: list[str], procs: list[asyncio.subprocess.Process], llm: ScriptedLLM):
        self.urls = urls
        self.procs = procs
        self.llm = llm


@asynccontextmanager
async def rig(
    tmp_path: Path, servers: int = 2, run_workers: int = 16, ttft_s: float = 0.001
) -> AsyncIterator[Rig]:
    """``servers`` rollout servers (subprocesses) and one scripted LLM (finish policy)."""
    async with AsyncExitStack() as stack:
        llm = await stack.enter_async_context(
            ScriptedLLM(policy="finish", latency=LatencyModel(ttft_s=ttft_s))
        )
        started = await asyncio.gather(
            *(
                stack.enter_async_context(
                    server_process(tmp_path / f"server{i}", {}, "--run-workers", str(run_workers))
                )
                for i in range(servers)
            )
        )
        yield Rig([url for _, url in started], [p for p, _ in started], llm)


def planted(outcome: str, **fields: Any) -> dict[str, Any]:
    """A job of the planted task (outcome known in advance)."""
    return {"task": "planted", "instance": {"outcome": outcome, **fields}}


def mixed_prompts(count: int, **fields: Any) -> list[dict[str, Any]]:
    """right / wrong / random(0.5) in turn: only random prompts pass ``nonzero_std``."""
    kinds = ["right", "wrong", "random"]
    return [planted(kinds[i % 3], seed=i, **fields) for i in range(count)]
