"""Just-in-time INIT with one slow LLM backend: sandboxes do not pile up in RUN's queue."""

from __future__ import annotations

import math
from typing import Any

from prorl_async.capacity.jit import JitGate
from prorl_async.capacity.stats import Pulse, StageStats
from prorl_async.scripted_llm import LatencyModel, ScriptedLLM
from tests.handlers.policies import require_bwrap
from tests.serverutil import ServerFactory

JOBS = 8
RUN_WORKERS = 2
INIT_WORKERS = 8


async def _peak_live(
    make_server: ServerFactory, jit: bool, *, run_workers: int = RUN_WORKERS, inflight: int = 0
) -> tuple[int, dict[str, Any]]:
    # One backend, slow and able to decode two requests at a time: RUN is the bottleneck.
    latency = LatencyModel(ttft_s=1.5, capacity=2)
    async with (
        ScriptedLLM(policy="finish", latency=latency) as llm,
        make_server(
            runtime="bwrap",
            init_workers=INIT_WORKERS,
            run_workers=run_workers,
            max_sandboxes=32,
            jit_init=jit,
        ) as srv,
    ):
        await srv.client.add_llm_server(llm.address, max_inflight=inflight or None)
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


async def _run_idle(make_server: ServerFactory, jit: bool) -> tuple[float, int]:
    """30 jobs, RUN at the default 64 workers, one backend registered with
    ``max_inflight=2``: RUN's idle sandbox-seconds (alive, waiting for the backend) and
    the jobs INIT started while RUN jobs waited for the backend."""
    latency = LatencyModel(ttft_s=0.5, capacity=2)
    async with (
        ScriptedLLM(policy="finish", latency=latency) as llm,
        make_server(
            runtime="bwrap", init_workers=INIT_WORKERS, max_sandboxes=64, jit_init=jit
        ) as srv,
    ):
        await srv.client.add_llm_server(llm.address, max_inflight=2)
        jobs = [{"task": "sandbox", "instance": {"prompt": f"p{i}"}} for i in range(30)]
        ids = await srv.client.submit_batch(jobs)
        results = [await srv.client.result(j, wait=60) for j in ids]
        assert [r["status"] for r in results if r] == ["done"] * len(ids)
        status = await srv.client.status()
        assert status["pools"]["run"]["configured"] == 64
        return status["idle_sandbox_seconds"]["run"], srv.service.services.runtime.budget.peak


async def test_jit_init_follows_the_backends_not_a_large_run_pool(
    make_server: ServerFactory,
) -> None:
    """RUN's 64 workers are free, but the backend serves 2 at once (``max_inflight``):
    INIT keeps only a queue covering its own latency ahead of those 2; eager INIT starts
    every job and they wait for the backend inside RUN."""
    require_bwrap()
    idle_jit, peak_jit = await _run_idle(make_server, jit=True)
    idle_eager, peak_eager = await _run_idle(make_server, jit=False)
    # The backend declares 2: from the first job on, RUN is given 2 plus a queue of about
    # one INIT latency (measured: peak 6-7, idle 10 against 72-88 sandbox-s eager).
    assert idle_jit < 0.3 * idle_eager, (idle_jit, idle_eager)
    assert peak_jit <= 2 + 6 and peak_eager >= 20, (peak_jit, peak_eager)


def _gate(busy: dict[str, int], run_workers: int) -> tuple[JitGate, dict[str, StageStats]]:
    """A gate over fresh stage stats, an empty RUN queue and ``busy`` workers per stage."""
    stats = {s: StageStats() for s in ("init", "run", "eval")}
    gate = JitGate(
        changed=Pulse(),
        queued_run=lambda: 0,
        busy=busy.__getitem__,
        run_workers=lambda: run_workers,
        stats=stats,
    )
    return gate, stats


def test_run_jobs_waiting_for_a_backend_count_as_queued() -> None:
    """Free RUN workers do not open the gate while RUN jobs wait for a backend: the
    backends set the pace then, and a new sandbox would only wait inside RUN."""
    busy = {"init": 0, "run": 4, "eval": 0}
    gate, stats = _gate(busy, run_workers=64)
    stats["run"].finished(2.0, 1.0)  # RUN: 1 s active (2 s wall); INIT: 0.1 s active
    stats["init"].finished(0.1, 0.1)
    waiting = dict.fromkeys(range(4), False)
    for key in waiting:
        stats["run"].started(key, lambda: 0.5, lambda key=key: waiting[key])
    # Little's law on the 4 RUN jobs making progress: 4 jobs/s, 0.1 s of INIT ahead.
    assert gate.target() == math.ceil(4 / 1.0 * 0.1) + 1 == 2
    busy["init"] = 59 + gate.target()  # 60 free RUN workers + the target, minus one
    assert gate.open()
    waiting[0] = waiting[1] = True  # two RUN jobs wait for a backend now
    # Backend-bound: RUN's measured completions (1 so far) set the pace.
    assert gate.target() == math.ceil(stats["run"].completions.rate() * 0.1) + 1 == 2
    assert not gate.open()
    busy["init"] = 0  # the two waiting count as RUN's queue, at the target already
    assert not gate.open()
    waiting[1] = False
    assert gate.open()
    # Served while others waited: 4 busy - 1 waiting (it was 4 - 2 a moment before).
    assert gate.backend_slots == 3

    # A wave of RUN jobs ends at once: 1 left, none waiting, 63 RUN workers free. INIT
    # refills only up to the backends' 3 slots (+ 1 to probe for more), plus the target.
    for key in (1, 2, 3):
        stats["run"].ended(key)
    busy["run"] = 1
    waiting.clear()
    waiting[0] = False
    target = gate.target()
    busy["init"] = (3 + 1 - 1) + target - 1
    assert gate.open()
    busy["init"] += 1
    assert not gate.open()
    # More served at once than seen, none waiting: the backends grew; so does the estimate.
    for key in (4, 5, 6, 7):
        stats["run"].started(key, lambda: 0.1, lambda: False)
    busy["run"] = 5
    assert not gate.open() and gate.backend_slots == 5
    # A checkpoint swap: no backend, every RUN job waits, none served. That says nothing
    # of the backends' capacity: the estimate stays.
    for key in (0, 4, 5, 6, 7):
        stats["run"].started(key, lambda: 0.1, lambda: True)
    assert not gate.open() and gate.backend_slots == 5


def test_a_slot_goes_to_init_only_while_runs_backlog_is_short() -> None:
    """``slot_open``: asked for an INIT job waiting for a sandbox slot; INIT jobs that are
    themselves waiting for a slot (timer paused) are not counted, those preparing are."""
    busy = {"init": 3, "run": 2, "eval": 0}
    # RUN full: only the target (1 before RUN finished) is room.
    gate, stats = _gate(busy, run_workers=2)
    paused = {0: True, 1: True, 2: False}  # two INIT jobs wait for a slot, one prepares
    for key in paused:
        stats["init"].started(key, lambda: 0.0, lambda key=key: paused[key])
    assert gate.target() == 1
    assert not gate.open()  # three in INIT already
    assert not gate.slot_open()  # the one preparing fills the target
    paused[2] = True  # it waits too now: nobody prepares
    assert gate.slot_open()
    gate.enabled = False
    paused[2] = False
    assert gate.slot_open()


def test_declared_backend_capacity_bounds_run_from_the_first_job() -> None:
    """Backends that declare ``max_inflight`` bound RUN's free workers before any RUN job
    has waited (nothing learned yet)."""
    busy = {"init": 0, "run": 0, "eval": 0}
    gate, stats = _gate(busy, run_workers=64)
    declared: int | None = None
    gate.backend_capacity = lambda: declared
    busy["init"] = 10
    assert gate.open()  # 64 free RUN workers, nothing declared
    declared = 4
    assert gate.backend_slots is None and not gate.open()  # 10 >= 4 + the target of 1
    busy["init"] = 4
    assert gate.open()
