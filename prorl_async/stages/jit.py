"""Just-in-time INIT: start a sandbox only when RUN will take it soon.

A job INIT prepares holds its sandbox until RUN ends; if it then waits in the RUN
queue, the sandbox sits idle holding memory and budget. By Little's law RUN takes
``rate = progressing_run / A_run`` jobs per second (its jobs making progress, over its
active seconds per job), so a RUN queue of ``rate * W_init`` jobs covers the time INIT
needs to prepare the next one. INIT may therefore start a job while

    queued_run + busy_init < free_run_workers + ceil(rate * W_init) + 1

(the ``+ 1`` absorbs jitter; before RUN has finished anything the target is 1).

RUN jobs that wait for an LLM backend now (every backend at its ``max_inflight``,
timer paused) count as queued, RUN then has no free workers, and ``rate`` is RUN's
measured completion rate: the backends, not RUN's pool, set the pace, and a sandbox
started for a free RUN worker would only wait inside RUN instead of in its queue.
The number the backends served while others waited is remembered: RUN's free workers
count only up to it (plus one, to find added capacity), so that when a wave of RUN
jobs ends at once INIT does not refill every freed worker for jobs that would wait.
When every backend declares its ``max_inflight``, their sum is used instead, from the
first job on.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from prorl_async.stages.stats import StageStats
from prorl_async.util.pulse import Pulse

__all__ = ["JitAdmission", "run_queue_target"]


def run_queue_target(
    run: StageStats, init: StageStats, busy_run: int, waiting: int | None = None
) -> int:
    """RUN queue depth that covers INIT's latency at RUN's departure rate (``waiting``:
    RUN jobs waiting for a backend now, if the caller has counted them already)."""
    # INIT's active time: how long preparing a job takes once it has its sandbox slot (a
    # wait for a slot is not covered by queueing: that slot frees only as RUN finishes).
    a_run, w_init = run.active.value, init.active.value
    waiting = run.paused() if waiting is None else waiting
    if not a_run or w_init is None or busy_run - waiting <= 0:
        return 1
    # Backend-bound: RUN's measured departure rate is the backends' pace. Else Little's
    # law on the RUN jobs making progress.
    rate = run.departures.rate() if waiting else (busy_run - waiting) / a_run
    return math.ceil(rate * w_init) + 1


class JitAdmission:
    """INIT workers wait here (holding the next job, still queued) until it is time."""

    def __init__(
        self,
        *,
        changed: Pulse,
        queued_run: Callable[[], int],
        busy: Callable[[str], int],
        run_workers: Callable[[], int],
        stats: dict[str, StageStats],
        enabled: bool = True,
    ) -> None:
        self.enabled = enabled
        self.waiting = 0
        # RUN jobs the LLM backends serve at once (None: never seen one wait for them).
        self.backend_slots: int | None = None
        # What the backends declare they serve at once (their max_inflight), when known:
        # used instead of the learned number (set by the server when it has a pool).
        self.backend_capacity: Callable[[], int | None] = lambda: None
        self._changed = changed
        self._queued_run = queued_run
        self._busy = busy
        self._run_workers = run_workers
        self._stats = stats

    def target(self) -> int:
        return run_queue_target(self._stats["run"], self._stats["init"], self._busy("run"))

    def open(self) -> bool:
        """Whether INIT may start one more job now."""
        return not self.enabled or self._admits(self._busy("init"))

    def slot_open(self) -> bool:
        """Whether an INIT job may take a sandbox-budget slot now (asked with the asking
        job's timer paused): the same rule, counting as INIT's share only the INIT jobs
        preparing on a slot (not paused waiting for one). An INIT job that passed
        ``open`` and then waited for a slot would otherwise take the next free one
        whatever RUN's state by then."""
        if not self.enabled:
            return True
        return self._admits(self._busy("init") - self._stats["init"].paused())

    def _admits(self, init_jobs: int) -> bool:
        waiting = self._stats["run"].paused()  # for a backend
        busy = self._busy("run")
        self._learn_backends(busy - waiting, waiting)
        room = self._run_workers()
        declared = self.backend_capacity()
        if declared is not None:
            room = min(room, declared)
        elif self.backend_slots is not None:
            # Plus one, a probe for more: added backends are found. (A probe of an eighth
            # more made 20 idle sandbox-s where this made 16, bench/capacity.py shift.)
            room = min(room, self.backend_slots + 1)
        free_run = max(room - busy, 0) if waiting == 0 else 0
        target = run_queue_target(self._stats["run"], self._stats["init"], busy, waiting)
        return self._queued_run() + waiting + init_jobs < free_run + target

    def _learn_backends(self, served: int, waiting: int) -> None:
        """``backend_slots``: how many RUN jobs the backends serve at once, as last seen:
        exactly those served while others waited; at least those served when none did
        (so the estimate follows added backends up). All waiting and none served is no
        backend at all (a checkpoint swap), not a capacity: the estimate is kept."""
        if waiting and served:
            self.backend_slots = served
        elif self.backend_slots is not None:
            self.backend_slots = max(self.backend_slots, served)

    async def wait(self, skip: Callable[[], bool] = lambda: False) -> None:
        """Return once INIT may start a job (re-checked on every pipeline change) or ``skip()``."""
        if self.open() or skip():
            return
        self.waiting += 1
        try:
            while not self.open() and not skip():
                await self._changed.wait()
        finally:
            self.waiting -= 1
