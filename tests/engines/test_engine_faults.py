"""A real vLLM under the things that go wrong: a job cancelled mid-generation, a job asking
more than the engine's window, and an engine stopped (SIGTERM), killed or frozen while
generating. Nothing may wait out ``request_timeout_s`` (600 s here, far past the bounds)."""

from __future__ import annotations

import asyncio
import collections
import signal
import time
from typing import Any

import pytest

from prorl_async.vllm_cpu import VllmProcess
from tests.engines.conftest import (
    ENGINE_TIMEOUT,
    MAX_MODEL_LEN,
    EngineServer,
    running_requests,
)
from tests.helpers import Server, eventually

pytestmark = ENGINE_TIMEOUT


def long_job(i: int, max_tokens: int = 400, **instance: Any) -> dict[str, Any]:
    # An unscripted seed: the random model rarely ends a turn, so it decodes max_tokens.
    return {
        "task": "math",
        "instance": {"problem": f"Count to {i}.", "answer": str(i), "max_turns": 1, **instance},
        "sampling_params": {"seed": 500 + i, "max_tokens": max_tokens},
    }


async def wait_running(engine: VllmProcess, at_least: int = 1, bound_s: float = 120) -> None:
    """Until the engine is decoding ``at_least`` requests (bounded poll of its metrics,
    every 0.1 s: each is real work for the engine's API server)."""

    async def busy() -> bool:
        return await running_requests(engine) >= at_least

    def state() -> str:
        alive = engine.proc is not None and engine.proc.poll() is None
        return (
            f"{engine.address} decoding {at_least} requests "
            f"(process alive: {alive}); its log ends:\n{engine.log_tail()}"
        )

    await eventually(busy, timeout=bound_s, what=state, interval=0.1)


async def test_cancel_mid_generation_frees_the_engine(
    vllm: VllmProcess, engine_server: EngineServer
) -> None:
    async with engine_server(vllm) as srv:
        ids = await srv.client.submit_batch([long_job(i, max_tokens=1500) for i in range(3)])
        await wait_running(vllm, 3)
        out = await srv.client.cancel(ids)
        assert sorted(out["cancelled"]) == sorted(ids)
        t0 = time.monotonic()

        async def idle() -> bool:
            return await running_requests(vllm) == 0

        await eventually(idle, timeout=30)  # the bound; the figure is in the note
        freed_s = time.monotonic() - t0
        docs = [await srv.client.result(i) for i in ids]
    assert [d["status"] for d in docs if d] == ["cancelled"] * 3
    print(f"engine idle {freed_s:.2f} s after cancel returned")  # noqa: T201


async def test_a_job_asking_more_than_the_room_ends_length_not_400(
    vllm: VllmProcess, engine_server: EngineServer
) -> None:
    # max_tokens 3000 against a 2048-token engine: the turn is cut to the room left.
    filler = "Count the words of this sentence carefully. " * 180
    job = long_job(1, max_tokens=3000, problem=filler)
    async with engine_server(vllm, max_tokens=3000) as srv:
        status = await srv.client.status()
        assert [b["max_model_len"] for b in status["backends"]] == [MAX_MODEL_LEN]
        [jid] = await srv.client.submit_batch([job])
        doc = await srv.client.result(jid, wait=280)
    assert doc is not None and doc["status"] == "done", doc and doc["error"]
    total = len(doc["prompt_ids"]) + len(doc["response_ids"])
    assert doc["finish"] in ("length", "context_exhausted") and total <= MAX_MODEL_LEN


async def test_least_in_flight_spreads_jobs_over_two_engines(
    vllm: VllmProcess, victim: VllmProcess, engine_server: EngineServer
) -> None:
    async with engine_server(vllm, victim) as srv:
        ids = await srv.client.submit_batch([long_job(i, max_tokens=32) for i in range(8)])
        docs = [await srv.client.result(i, wait=280) for i in ids]
    used = collections.Counter(d["turns"][0]["backend"] for d in docs if d and d["turns"])
    assert set(used) == {vllm.address, victim.address}
    assert abs(used[vllm.address] - used[victim.address]) <= 2, used


# SIGSTOP first: the engine comes back after SIGCONT and the next test reuses it.
@pytest.mark.parametrize("sig", [signal.SIGSTOP, signal.SIGTERM, signal.SIGKILL])
async def test_an_engine_stopped_mid_generation_moves_its_jobs(
    vllm: VllmProcess, victim: VllmProcess, engine_server: EngineServer, sig: signal.Signals
) -> None:
    async with engine_server(vllm, victim) as srv:
        ids = await srv.client.submit_batch([long_job(i, max_tokens=300) for i in range(4)])
        await wait_running(victim, 1)
        victim.signal(sig)
        try:
            docs = await asyncio.wait_for(_all(srv, ids), 240)
        finally:
            victim.signal(signal.SIGCONT)
        backends = [b for b in (await srv.client.status())["backends"]]
    assert [d["status"] for d in docs] == ["done"] * 4, [d["error"] for d in docs]
    # The victim was decoding when it stopped; every turn came back from the live engine
    # (a partial turn is regenerated there from the same prompt ids, never kept).
    assert all(t["backend"] == vllm.address for d in docs for t in d["turns"] if "backend" in t)
    assert [b["healthy"] for b in backends if b["address"] == victim.address] in ([False], [True])
    if sig == signal.SIGKILL:  # killed: nothing of it removed its own files
        tmp = victim.tmp_dir
        assert tmp is not None and any(tmp.iterdir()), "vLLM's sockets are not in its tmp_dir"
        await asyncio.to_thread(victim.stop)  # the pool would, before the next engine
        assert not tmp.exists()


async def _all(srv: Server, ids: list[str]) -> list[dict[str, Any]]:
    docs = []
    for i in ids:
        doc = await srv.client.result(i, wait=240)
        assert doc is not None
        docs.append(doc)
    return docs
