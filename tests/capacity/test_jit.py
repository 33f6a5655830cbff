"""Just-in-time INIT with one slow LLM backend: sandboxes do not pile up in RUN's queue."""

from __future__ import annotations

from typing import Any

from prorl_async.scripted_llm import LatencyModel, ScriptedLLM
from tests.handlers.policies import require_bwrap
from tests.serverutil import ServerFactory

JOBS = 8
RUN_WORKERS = 2
INIT_WORKERS = 8


async def _peak_live(make_server: ServerFactory, jit: bool) -> tuple[int, dict[str, Any]]:
    # One backend, slow and able to decode two requests at a time: RUN is the bottleneck.
    latency = LatencyModel(ttft_s=1.5, capacity=RUN_WORKERS)
    async with (
        ScriptedLLM(policy="finish", latency=latency) as llm,
        make_server(
            runtime="bwrap",
            init_workers=INIT_WORKERS,
            run_workers=RUN_WORKERS,
            max_sandboxes=32,
            jit_init=jit,
        ) as srv,
    ):
        await srv.client.add_llm_server(llm.address)
        jobs = [{"task": "sandbox", "instance": {"prompt": f"p{i}"}} for i in range(JOBS)]
        ids = await srv.client.submit_batch(jobs)
        results = [await srv.client.result(j, wait=60) for j in ids]
        assert [r["status"] for r in results if r] == ["done"] * JOBS
        budget = srv.service.services.runtime.budget
        return budget.peak, await srv.client.status()


async def test_jit_init_keeps_live_sandboxes_near_run_concurrency(
    make_server: ServerFactory,
) -> None:
    require_bwrap()
    peak_jit, status_jit = await _peak_live(make_server, jit=True)
    peak_eager, status_eager = await _peak_live(make_server, jit=False)
    # JIT: RUN's two workers, a RUN queue of about one INIT latency, one INIT in flight.
    assert peak_jit <= RUN_WORKERS + 3, peak_jit
    # Without it INIT fills its whole pool and the sandboxes wait in RUN's queue.
    assert peak_eager == JOBS, peak_eager
    idle_jit = status_jit["idle_sandbox_seconds"]["run"]
    idle_eager = status_eager["idle_sandbox_seconds"]["run"]
    assert idle_eager > 2 * idle_jit and idle_eager > 1.0, (idle_jit, idle_eager)
    assert status_jit["idle_sandbox_seconds"]["init"] == 0.0
