"""What the capacity controls measure: per-stage service times, arrivals, idle sandboxes."""

from __future__ import annotations

import asyncio
import collections
import contextvars
import statistics
import time
from collections.abc import Callable

from prorl_async.util.timer import PausableTimer

__all__ = ["CURRENT_STAGE", "STAGE_SLOTS", "Ewma", "Pulse", "RateMeter", "StageStats"]

# The stage whose task is running (set by the pipeline in each stage task's own context),
# so the sandbox budget can tell which stage took a slot.
CURRENT_STAGE: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "prorl_current_stage", default=None
)
# Sandbox-budget slots taken by the job whose stage is running, counted by the budget
# into a fresh one-item list the pipeline sets for each stage of each job.
STAGE_SLOTS: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "prorl_stage_slots", default=None
)


class Ewma:
    """Exponentially weighted mean; ``value`` is ``None`` until the first sample."""

    __slots__ = ("alpha", "value", "count")

    def __init__(self, alpha: float = 0.05) -> None:
        self.alpha = alpha
        self.value: float | None = None
        self.count = 0

    def add(self, sample: float) -> None:
        self.count += 1
        if self.value is None:
            self.value = sample
        else:
            self.value += self.alpha * (sample - self.value)


class RateMeter:
    """Events per second over a sliding window of ``window_s`` (counts kept per
    ``tick_s`` bucket: constant cost per event at any rate)."""

    def __init__(self, window_s: float = 5.0, tick_s: float = 0.25) -> None:
        self.window_s = window_s
        self.tick_s = tick_s
        self._buckets: collections.deque[list[float]] = collections.deque()  # [start, n]
        self._started = time.monotonic()

    def add(self, n: int = 1) -> None:
        now = time.monotonic()
        if self._buckets and now - self._buckets[-1][0] < self.tick_s:
            self._buckets[-1][1] += n
        else:
            self._buckets.append([now, n])
            self._trim(now)

    def rate(self) -> float:
        now = time.monotonic()
        self._trim(now)
        span = min(self.window_s, max(now - self._started, 1.0))
        return sum(n for _, n in self._buckets) / span

    def _trim(self, now: float) -> None:
        cut = now - self.window_s
        while self._buckets and self._buckets[0][0] < cut:
            self._buckets.popleft()


class StageStats:
    """Service time (wall seconds in the stage; ``active``: timer-running seconds, i.e.
    without waits for a backend or a sandbox slot) and completions of one stage.

    ``sandboxed`` is the recent share of the stage's jobs that took a sandbox-budget slot
    in the stage and ``sandboxed_active`` those jobs' own active time: in a mix of jobs
    with and without a sandbox, the sandbox-seconds per job are their product (the mean
    active time of all jobs would count the sandbox-free ones' short times too)."""

    def __init__(self) -> None:
        self.service = Ewma()
        self.active = Ewma()
        self.sandboxed = Ewma()
        self.sandboxed_active = Ewma()
        self.completions = RateMeter()
        self.arrivals = RateMeter()
        self.idle_sandbox_seconds = 0.0
        # Jobs in the stage now: their active seconds so far, by a key of the caller's.
        self._running: dict[object, tuple[PausableTimer, float]] = {}
        # Jobs in the stage whose timer is paused now (waiting for a backend), kept by the
        # timers themselves (``enter``): ``paused()`` is asked at every INIT admission,
        # with hundreds of jobs in RUN.
        self._paused_now = 0

    def enter(self, key: object, timer: PausableTimer) -> None:
        """A job entered the stage with ``timer`` (its active time from here on counts)."""
        self._running[key] = (timer, timer.elapsed())
        timer.watcher = self._pause_changed
        if not timer.running:
            self._paused_now += 1

    def leave(self, key: object, timer: PausableTimer) -> None:
        self._running.pop(key, None)
        timer.watcher = None
        if not timer.running:
            self._paused_now -= 1

    def _pause_changed(self, delta: int) -> None:
        self._paused_now += delta

    def paused(self) -> int:
        """How many jobs in the stage are paused now (e.g. waiting for an LLM backend)."""
        return self._paused_now

    def running_age(self) -> float | None:
        """Median active seconds so far of the jobs in the stage (``None``: none).

        Completed jobs alone lag when the jobs get longer: few of the long ones finish,
        and the fewer workers, the fewer. The median (not the mean) ignores a straggler.
        """
        if not self._running:
            return None
        return statistics.median(t.elapsed() - before for t, before in self._running.values())

    def finished(self, wall_s: float, active_s: float, slots: int = 0) -> None:
        self.service.add(wall_s)
        self.active.add(active_s)
        self.sandboxed.add(1.0 if slots else 0.0)
        if slots:
            self.sandboxed_active.add(active_s)
        self.completions.add()


class Pulse:
    """Wakes every current waiter when something changed (no state, no lost wake-ups for
    waiters that re-check their condition after each wake)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._listeners: list[Callable[[], None]] = []
        self._waiting = 0
        self._soon: asyncio.Handle | None = None

    def on_fire(self, callback: Callable[[], None]) -> None:
        """Also call ``callback`` (synchronously) on every ``fire``."""
        self._listeners.append(callback)

    def fire(self) -> None:
        if self._waiting:  # a new event only when someone waits on the current one
            self._event.set()
            self._event = asyncio.Event()
        for callback in self._listeners:
            callback()

    def fire_soon(self) -> None:
        """``fire`` once at the end of this loop iteration, however many changes come
        before it: jobs moving in bulk wake waiters and listeners once, not per job."""
        if self._soon is None:
            self._soon = asyncio.get_running_loop().call_soon(self._fire_now)

    def _fire_now(self) -> None:
        self._soon = None
        self.fire()

    async def wait(self) -> None:
        self._waiting += 1
        try:
            await self._event.wait()
        finally:
            self._waiting -= 1
