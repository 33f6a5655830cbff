"""Just-in-time INIT with one slow LLM backend: sandboxes do not pile up in RUN's queue.

The server tests check what the admission decided (the room it gave RUN, that it held INIT back
while RUN's pool had free workers), never timings: how many sandboxes JIT saves against
eager INIT, in peak and idle sandbox-seconds, is measured by ``bench/capacity.py``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import pytest

from prorl_async.core.pipeline import Pipeline
from prorl_async.schemas import Stage
from prorl_async.scripted_llm import LatencyModel, ScriptedLLM
from prorl_async.stages import jit as jit_module
from prorl_async.stages.jit import JitAdmission, run_queue_target
from prorl_async.stages.stats import StageStats
from prorl_async.util.pulse import Pulse
from prorl_async.util.timer import PausableTimer
from tests.capacity.timers import entered
from tests.handlers.policies import require_bwrap
from tests.helpers import ServerFactory

INIT_WORKERS = 8


@dataclass(frozen=True)
class Decision:
    """One ``JitAdmission.open()`` call: the pipeline as the admission saw it, and its answer."""

    init: int  # jobs in INIT
    queued_run: int
    waiting: int  # RUN jobs waiting for a backend
    busy_run: int
    run_workers: int
    declared: int | None  # the backends' max_inflight sum
    learned: int | None  # backend_slots after this decision
    target: int  # RUN queue target
    admitted: bool

    def room(self) -> int:
        """RUN workers the rule may count as free room (the pool, capped by the backends)."""
        room = self.run_workers
        if self.declared is not None:
            return min(room, self.declared)
        return room if self.learned is None else min(room, self.learned + 1)

    def follows_the_rule(self) -> bool:
        free = max(self.room() - self.busy_run, 0) if self.waiting == 0 else 0
        ahead = self.queued_run + self.waiting + self.init
        return self.admitted == (ahead < free + self.target)


def _record(pipe: Pipeline, monkeypatch: pytest.MonkeyPatch) -> list[Decision]:
    """Record every decision of the pipeline's JIT admission, with the target it computed."""
    jit, decisions, targets = pipe.jit, list[Decision](), list[int]()

    def target_and_record(*args: Any) -> int:
        targets.append(run_queue_target(*args))
        return targets[-1]

    monkeypatch.setattr(jit_module, "run_queue_target", target_and_record)
    decide = jit.open

    def open_and_record() -> bool:
        seen = functools.partial(  # the pipeline before the decision
            Decision,
            init=pipe.active[Stage.INIT],
            queued_run=pipe.queued[Stage.RUN],
            waiting=pipe.stats["run"].paused(),
            busy_run=pipe.active[Stage.RUN],
            run_workers=pipe.pools[Stage.RUN].size,
            declared=jit.backend_capacity(),
        )
        targets.clear()
        admitted = decide()
        decisions.append(seen(learned=jit.backend_slots, target=targets[-1], admitted=admitted))
        return admitted

    jit.open = open_and_record  # type: ignore[method-assign]
    return decisions


async def _jit_run(
    make_server: ServerFactory,
    monkeypatch: pytest.MonkeyPatch,
    *,
    jobs: int,
    run_workers: int,
    inflight: int | None,
    ttft: float,
) -> tuple[list[Decision], dict[str, Any]]:
    # One backend, slow and able to decode two requests at a time: RUN is the bottleneck.
    latency = LatencyModel(ttft_s=ttft, capacity=2)
    async with (
        ScriptedLLM(policy="finish", latency=latency) as llm,
        make_server(
            runtime="bwrap",
            init_workers=INIT_WORKERS,
            run_workers=run_workers,
            max_sandboxes=64,
            jit_init=True,
        ) as srv,
    ):
        decisions = _record(srv.service.pipeline, monkeypatch)
        await srv.client.add_llm_server(llm.address, max_inflight=inflight)
        batch = [{"task": "sandbox", "instance": {"prompt": f"p{i}"}} for i in range(jobs)]
        ids = await srv.client.submit_batch(batch)
        results = [await srv.client.result(j, wait=60) for j in ids]
        assert [r["status"] for r in results if r] == ["done"] * jobs
        return decisions, await srv.client.status()


async def test_jit_init_keeps_live_sandboxes_near_run_concurrency(
    make_server: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RUN has 2 workers: INIT starts a job only while RUN's 2 plus its queue target have
    room, and holds the rest back in its queue (no sandbox) although its own 8 are free."""
    require_bwrap()
    decisions, status = await _jit_run(
        make_server, monkeypatch, jobs=8, run_workers=2, inflight=None, ttft=1.5
    )
    assert decisions and all(d.follows_the_rule() for d in decisions), decisions
    assert all(d.room() <= 2 for d in decisions)
    # The first wave alone: 8 INIT workers, room for 2 + a target of 1 before RUN finished.
    refused = [d for d in decisions if not d.admitted]
    assert refused and min(d.init for d in refused) < INIT_WORKERS, refused
    assert status["idle_sandbox_seconds"]["init"] == 0.0


async def test_jit_init_follows_the_backends_not_a_large_run_pool(
    make_server: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RUN's 64 workers are free, but the backend serves 2 at once (``max_inflight``):
    the admission counts the declared 2 as RUN's room from the first job on, not the 64
    workers, so INIT keeps only a queue covering its own latency ahead of those 2."""
    require_bwrap()
    decisions, status = await _jit_run(
        make_server, monkeypatch, jobs=30, run_workers=64, inflight=2, ttft=0.5
    )
    assert status["pools"]["run"]["configured"] == 64
    assert decisions and all(d.declared == 2 for d in decisions), decisions
    assert all(d.follows_the_rule() for d in decisions), decisions
    # Held back while 60 or more RUN workers were free: the backend set the pace.
    assert any(not d.admitted and d.run_workers - d.busy_run >= 60 for d in decisions)


def _jit(busy: dict[str, int], run_workers: int) -> tuple[JitAdmission, dict[str, StageStats]]:
    """A JIT admission over fresh stage stats, an empty RUN queue and ``busy`` workers per stage."""
    stats = {s: StageStats() for s in ("init", "run", "eval")}
    jit = JitAdmission(
        changed=Pulse(),
        queued_run=lambda: 0,
        busy=busy.__getitem__,
        run_workers=lambda: run_workers,
        stats=stats,
    )
    return jit, stats


def test_run_jobs_waiting_for_a_backend_count_as_queued() -> None:
    """Free RUN workers do not open the admission while RUN jobs wait for a backend: the
    backends set the pace then, and a new sandbox would only wait inside RUN."""
    busy = {"init": 0, "run": 4, "eval": 0}
    jit, stats = _jit(busy, run_workers=64)
    stats["run"].finished(2.0, 1.0)  # RUN: 1 s active (2 s wall); INIT: 0.1 s active
    stats["init"].finished(0.1, 0.1)
    timers: dict[int, PausableTimer] = {
        key: entered(stats["run"], key, active=0.5) for key in range(4)
    }
    # Little's law on the 4 RUN jobs making progress: 4 jobs/s, 0.1 s of INIT ahead.
    assert jit.target() == math.ceil(4 / 1.0 * 0.1) + 1 == 2
    busy["init"] = 59 + jit.target()  # 60 free RUN workers + the target, minus one
    assert jit.open()
    timers[0].pause()  # two RUN jobs wait for a backend now
    timers[1].pause()
    # Backend-bound: RUN's measured departures (1 so far) set the pace.
    assert jit.target() == math.ceil(stats["run"].departures.rate() * 0.1) + 1 == 2
    assert not jit.open()
    busy["init"] = 0  # the two waiting count as RUN's queue, at the target already
    assert not jit.open()
    timers[1].resume()
    assert jit.open()
    # Served while others waited: 4 busy - 1 waiting (it was 4 - 2 a moment before).
    assert jit.backend_slots == 3

    # A wave of RUN jobs ends at once: 1 left, none waiting, 63 RUN workers free. INIT
    # refills only up to the backends' 3 slots (+ 1 to probe for more), plus the target.
    for key in (1, 2, 3):
        stats["run"].leave(key, timers[key])
    busy["run"] = 1
    timers[0].resume()
    target = jit.target()
    busy["init"] = (3 + 1 - 1) + target - 1
    assert jit.open()
    busy["init"] += 1
    assert not jit.open()
    # More served at once than seen, none waiting: the backends grew; so does the estimate.
    for key in (4, 5, 6, 7):
        timers[key] = entered(stats["run"], key, active=0.1)
    busy["run"] = 5
    assert not jit.open() and jit.backend_slots == 5
    # A checkpoint swap: no backend, every RUN job waits, none served. That says nothing
    # of the backends' capacity: the estimate stays.
    for key in (0, 4, 5, 6, 7):
        timers[key].pause()
    assert not jit.open() and jit.backend_slots == 5


def test_a_slot_goes_to_init_only_while_runs_backlog_is_short() -> None:
    """``slot_open``: asked for an INIT job waiting for a sandbox slot; INIT jobs that are
    themselves waiting for a slot (timer paused) are not counted, those preparing are."""
    busy = {"init": 3, "run": 2, "eval": 0}
    # RUN full: only the target (1 before RUN finished) is room.
    jit, stats = _jit(busy, run_workers=2)
    # two INIT jobs wait for a slot, one prepares
    timers = {key: entered(stats["init"], key, paused=key < 2) for key in range(3)}
    assert jit.target() == 1
    assert not jit.open()  # three in INIT already
    assert not jit.slot_open()  # the one preparing fills the target
    timers[2].pause()  # it waits too now: nobody prepares
    assert jit.slot_open()
    jit.enabled = False
    timers[2].resume()
    assert jit.slot_open()


def test_declared_backend_capacity_bounds_run_from_the_first_job() -> None:
    """Backends that declare ``max_inflight`` bound RUN's free workers before any RUN job
    has waited (nothing learned yet)."""
    busy = {"init": 0, "run": 0, "eval": 0}
    jit, stats = _jit(busy, run_workers=64)
    declared: int | None = None
    jit.backend_capacity = lambda: declared
    busy["init"] = 10
    assert jit.open()  # 64 free RUN workers, nothing declared
    declared = 4
    assert jit.backend_slots is None and not jit.open()  # 10 >= 4 + the target of 1
    busy["init"] = 4
    assert jit.open()
