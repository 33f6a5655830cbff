"""The three-stage pipeline: INIT -> RUN -> EVAL on one event loop.

Each stage is a queue (``stages.StageQueue``; INIT's a ``stages.FairQueue``) drained by a
resizable pool of worker coroutines (``stages.WorkerPool``: the worker count is the
stage's concurrency); INIT workers start a job only when RUN will take it soon
(``stages.JitAdmission``), and ``stages.StageRun`` times and counts each job's stage.
A worker runs a job's stage in its own task: no task per stage and job. A cancel
(cancel, stop) cancels the worker and waits until the stage has unwound; the worker
takes that cancellation back (``Task.uncancel``) and goes on to the next job. Only a
cancellation of the worker itself (shutdown) ends it.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from prorl_async.core.job import INIT, RUN, Job, Stage
from prorl_async.core.jobstore import JobStore
from prorl_async.core.result import encode_result
from prorl_async.schemas import ErrorInfo
from prorl_async.stages import (
    FairQueue,
    JitAdmission,
    Shares,
    StageQueue,
    StageRun,
    StageStats,
    WorkerPool,
)
from prorl_async.util.pulse import Pulse

__all__ = ["JobListener", "Pipeline", "PipelineObserver"]

log = logging.getLogger(__name__)

_NEXT = {Stage.INIT: Stage.RUN, Stage.RUN: Stage.EVAL}
_BY_NAME = {s._value_: s for s in Stage}


def _take_back(worker: asyncio.Task[Any], job: Job) -> bool:
    """Withdraw the cancellations ``_cancel`` sent the worker for ``job``'s stage; True if
    the worker is still being cancelled (it is being shut down)."""
    for _ in range(job.stage_cancels):
        worker.uncancel()
    job.stage_cancels = 0
    return worker.cancelling() > 0


class Outcome(enum.Enum):
    OK = "ok"
    FAILED = "failed"
    TIMED_OUT = "timed_out"


_OK, _FAILED, _TIMED_OUT = Outcome.OK, Outcome.FAILED, Outcome.TIMED_OUT  # see core.job.INIT


class PipelineObserver(Protocol):
    """Receives events for metrics (counters and histograms only)."""

    def stage_finished(self, stage: str, seconds: float) -> None: ...
    def job_finished(self, status: str) -> None: ...


class JobListener(Protocol):
    """Told of every job admitted (queued, or failed at once) and of its end."""

    def job_added(self, job: Job) -> None: ...
    def job_ended(self, job: Job) -> None: ...
    def job_withdrawn(self, job: Job) -> None: ...


def _tenant(job: Job) -> str:
    return job.tenant


class Pipeline:
    """Owns the stage queues and workers; moves jobs through the stages."""

    def __init__(
        self,
        *,
        store: JobStore,
        workers: dict[Stage, int],
        observer: PipelineObserver | None = None,
        stop_grace_s: float = 30.0,
        jit_init: bool = True,
        shares: Shares | None = None,
    ) -> None:
        self.store = store
        self.observer = observer
        self.stop_grace_s = stop_grace_s
        self.accepting = False
        # INIT admits by weighted fair share across tenants (``shares``: weights, loads).
        self.queues: dict[Stage, StageQueue[Job]] = {
            s: FairQueue(_tenant, shares) if s is Stage.INIT else StageQueue() for s in Stage
        }
        self.listeners: list[JobListener] = []
        self.queued: dict[Stage, int] = dict.fromkeys(Stage, 0)
        self.active: dict[Stage, int] = dict.fromkeys(Stage, 0)
        self._tasks: set[asyncio.Task[Any]] = set()
        self.stats = {s.value: StageStats() for s in Stage}
        self.changed = Pulse()
        self.pools = {s: self._pool(s, workers[s]) for s in Stage}
        self.jit = JitAdmission(
            changed=self.changed,
            queued_run=lambda: self.queued[RUN],
            busy=lambda s: self.active[_BY_NAME[s]],
            run_workers=lambda: self.pools[RUN].size,
            stats=self.stats,
            enabled=jit_init,
        )
        # RUN jobs waiting for a sandbox-budget slot now (the service sets it from the
        # budget), and the jobs in RUN's queue holding a running sandbox: ``rescue_run``.
        self.slot_waiting: Callable[[], int] = lambda: 0
        self._holding: set[Job] = set()
        self._started = False

    def _pool(self, stage: Stage, size: int) -> WorkerPool[Job]:
        work = functools.partial(self._work, stage)  # positional: no keyword dict per call
        return WorkerPool(stage._value_, self.queues[stage], work, size)

    @property
    def workers(self) -> dict[Stage, int]:
        """Configured concurrency per stage."""
        return {s: p.size for s, p in self.pools.items()}

    def resize(self, stage: Stage, size: int) -> None:
        """Set a stage's concurrency now; shrinking lets busy workers finish their job."""
        self.pools[stage].resize(size)
        self.changed.fire()

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Start the workers (once) and accept jobs."""
        if not self._started:
            self._started = True
            for pool in self.pools.values():
                pool.start()
        self.accepting = True

    async def stop(self) -> None:
        """Refuse new jobs, cancel every unfinished one and wait until all are released."""
        self.accepting = False
        jobs = self.store.unfinished()
        if not jobs:
            return
        tasks = [self._spawn(self._cancel(job)) for job in jobs]
        done, pending = await asyncio.wait(tasks, timeout=self.stop_grace_s)
        if pending:
            log.error(
                "%d jobs did not release their resources within %.0fs",
                len(pending),
                self.stop_grace_s,
            )

    async def aclose(self) -> None:
        """Stop, then end the workers and any helper task."""
        await self.stop()
        await asyncio.gather(*(pool.aclose() for pool in self.pools.values()))
        if self._tasks:
            await asyncio.wait(list(self._tasks))

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- intake and cancel -----------------------------------------------------------------

    def submit(self, job: Job) -> None:
        self.store.add(job)
        self._added(job)
        self._enqueue(job, INIT)

    def fail_now(self, job: Job, error: ErrorInfo) -> None:
        """Record ``job`` as accepted and finish it ``failed`` at once (never queued)."""
        self.store.add(job)
        self._added(job)
        self._finish(job, "failed", error)

    def _added(self, job: Job) -> None:
        for listener in self.listeners:
            listener.job_added(job)

    async def cancel(self, job: Job) -> bool:
        """Cancel a job wherever it is; returns False if it finished otherwise.

        Returns only after the job's stage task has ended and everything it held is
        released. Shielded: a caller that goes away does not leave a half-cancelled job.
        """
        if job.terminal:
            return False
        await asyncio.shield(self._spawn(self._cancel(job)))
        # The job may have finished on its own before the cancel task ran.
        return job.status == "cancelled"

    async def _cancel(self, job: Job) -> None:
        if job.terminal:
            return
        await self._stop_stage(job)
        self._finish(job, "cancelled")

    async def _stop_stage(self, job: Job) -> None:
        """Take ``job`` out of its queue or stop its stage task, then release what it holds."""
        job.cancel_requested = True
        self._dequeue(job)
        worker = job.stage_task
        if worker is not None:
            # The worker running the job's stage: it takes this cancellation back once the
            # stage has unwound (``_take_back``) and resolves ``stage_done``.
            if job.stage_done is None:
                job.stage_done = asyncio.get_running_loop().create_future()
            done = job.stage_done
            job.stage_cancels += 1
            worker.cancel()
            await asyncio.wait((done,))
        # Also covers a stage that had just succeeded (INIT keeps what it holds).
        await self._release(job)

    async def withdraw(self, job: Job) -> None:
        """Take back a job whose admission was not acknowledged (its commit did not come
        in time): it is stopped wherever it is and forgotten as if never submitted (no
        result, no seq, no tombstone: the same ``job_id`` may be submitted again)."""
        await asyncio.shield(self._spawn(self._withdraw(job)))

    async def _withdraw(self, job: Job) -> None:
        if not job.terminal:
            await self._stop_stage(job)
        if not job.terminal:
            job.leave_queue()
            job.status = "cancelled"
            job.instance = job.trajectory = job.request = None
            job.state.clear()
            for listener in self.listeners:
                listener.job_withdrawn(job)
            job.wake_waiters()
        self.store.delete(job.id)

    # -- workers ---------------------------------------------------------------------------

    def _enqueue(self, job: Job, stage: Stage) -> None:
        job.enter_queue(stage)
        job.queue_stage = stage
        self.queued[stage] += 1
        self.queues[stage].put_nowait(job)
        self.stats[stage._value_].arrivals.add()
        self.changed.fire_soon()
        if stage is RUN and job.holds_live:
            self._holding.add(job)
            self.rescue_run()

    def _dequeue(self, job: Job) -> bool:
        stage = job.queue_stage
        if stage is None:
            return False
        job.queue_stage = None
        self.queued[stage] -= 1
        if self._holding:
            self._holding.discard(job)
        waited = job.queued_s
        job.leave_queue()
        if job.holds_live:  # a sandbox alive and waiting: idle sandbox-seconds
            self.stats[stage._value_].idle_sandbox_seconds += job.queued_s - waited
        self.changed.fire_soon()
        return True

    async def _work(self, stage: Stage, job: Job, worker: asyncio.Task[Any]) -> None:
        """Run ``job``'s ``stage`` in this worker, then move the job on (``_advance``).

        One coroutine for the whole stage (each coroutine here is paid three times a
        job); the bookkeeping is in ``_begin``, ``_account`` and ``_end``.
        """
        if stage is INIT and not self.jit.open():
            # The job stays queued (timer paused) until RUN will take it soon.
            await self.jit.wait(lambda: job.cancel_requested)
        if job.queue_stage is not stage or not self._dequeue(job) or job.cancel_requested:
            return  # cancelled while queued (the cancel finishes it), or rescued from RUN's
        run = self._begin(stage, job, worker)
        # A sandbox running as the stage begins idles through the stage's waits (one
        # started on first use in the stage was not there for the waits before it).
        idles = job.holds_live
        outcome: tuple[Outcome, BaseException | None] | None = None
        keep = False  # a successful INIT keeps what the job holds for RUN
        try:
            try:
                with run.deadline:  # the timer runs inside
                    run.enter(job)
                    await getattr(job.handler, run.name)(job)
                keep = stage is INIT
                result: tuple[Outcome, BaseException | None] = (_OK, None)
            except TimeoutError as exc:
                self._notify(job, run.name, exc)
                result = (_TIMED_OUT if run.timed_out() else _FAILED), exc
            except Exception as exc:
                self._notify(job, run.name, exc)
                result = _FAILED, exc
            finally:
                self._account(job, stage, run, idles)
                if not keep and job.holds_resources:  # after RUN, and on any failure
                    await self._release(job)
            outcome = result
        except asyncio.CancelledError:
            if _take_back(worker, job):
                # The worker itself is being shut down: the job goes with it.
                job.cancel_requested = True
                self._finish(job, "cancelled")
                raise
        else:
            if job.stage_cancels:
                _take_back(worker, job)  # a cancel the stage swallowed
        finally:
            self._end(stage, job)
        self._advance(job, stage, outcome)

    def rescue_run(self) -> None:
        """While RUN jobs wait for a sandbox slot, the jobs in RUN's queue that hold a
        running sandbox start RUN at once, each on a task of its own: they may hold every
        slot, the waiters (sandboxes started on first use) every RUN worker, and nothing
        else would end that wait. At most one such extra RUN job per slot."""
        if self._holding and self.slot_waiting():
            holding, self._holding = self._holding, set()
            for job in holding:
                self._spawn(self._rescued(job))

    async def _rescued(self, job: Job) -> None:
        task = asyncio.current_task()
        assert task is not None
        await self._work(RUN, job, task)  # its entry in RUN's queue is skipped later

    def _begin(self, stage: Stage, job: Job, worker: asyncio.Task[Any]) -> StageRun:
        """The job enters ``stage`` in ``worker``: counted active, its scope set."""
        job.status = stage._value_
        self.active[stage] += 1
        self.changed.fire_soon()
        job.stage_task = worker
        run = StageRun(stage._value_, job.timer, self.stats[stage._value_], worker)
        job.scope = run.scope
        return run

    def _account(self, job: Job, stage: Stage, run: StageRun, idles: bool) -> None:
        """The stage's times, into the stage's statistics, the job's and the metrics
        (``idles``: a sandbox of the job ran through the stage)."""
        run.leave(job)
        job.scope = None
        wall, active = run.wall, run.active
        job.stage_active[stage] = job.stage_active.get(stage, 0.0) + active
        job.stage_wall[stage] = job.stage_wall.get(stage, 0.0) + wall
        if stage is not INIT and idles:
            # Waiting (timer paused, e.g. for a backend) holding a sandbox: idle too.
            run.stats.idle_sandbox_seconds += max(wall - active, 0.0)
        if self.observer is not None:
            self.observer.stage_finished(run.name, active)

    def _end(self, stage: Stage, job: Job) -> None:
        """The worker is done with the job's stage: a cancel waiting for it goes on."""
        self.active[stage] -= 1
        job.stage_task = None
        done, job.stage_done = job.stage_done, None
        if done is not None and not done.done():
            done.set_result(None)
        self.changed.fire_soon()

    def _advance(
        self, job: Job, stage: Stage, outcome: tuple[Outcome, BaseException | None] | None
    ) -> None:
        if job.terminal:
            return
        if outcome is None or job.cancel_requested:
            self._finish(job, "cancelled")
            return
        result, exc = outcome
        if result is _OK:
            nxt = _NEXT.get(stage)
            if nxt is None:
                self._finish(job, "done")
            else:
                self._enqueue(job, nxt)
        elif result is _TIMED_OUT:
            msg = f"active time budget of {job.timer.budget:g}s ran out during {stage._value_}"
            self._finish(job, "timed_out", ErrorInfo(stage._value_, "TimeoutError", msg))
        else:
            self._finish(job, "failed", ErrorInfo(stage._value_, type(exc).__name__, str(exc)))

    @staticmethod
    def _notify(job: Job, stage: str, exc: BaseException) -> None:
        try:
            getattr(job.handler, f"{stage}_exception")(job, exc)
        except Exception:
            log.exception("%s_exception of task %r raised", stage, job.task)

    @staticmethod
    async def _release(job: Job) -> None:
        try:
            await job.release()
        except Exception:
            log.exception("releasing resources of job %s failed", job.id)

    def _finish(self, job: Job, status: str, error: ErrorInfo | None = None) -> None:
        if job.terminal:
            return
        job.leave_queue()
        job.status = status
        job.error = error
        job.finished_at = time.monotonic()
        job.seq = self.store.log.assign()  # in the result document, and its log position
        job.result = encode_result(job)
        # The encoded result is all that is kept: drop the heavy live state.
        job.instance = job.trajectory = job.request = None
        job.state.clear()
        self.store.finished(job)
        for listener in self.listeners:
            listener.job_ended(job)
        if self.observer is not None:
            self.observer.job_finished(status)
        job.wake_waiters()
