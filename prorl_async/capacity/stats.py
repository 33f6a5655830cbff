"""What the capacity controls measure: per-stage service times, arrivals, idle sandboxes."""

from __future__ import annotations

import asyncio
import collections
import contextvars
import math
import statistics
import time
from collections.abc import Callable

from prorl_async.util.timer import PausableTimer

__all__ = [
    "CURRENT_STAGE",
    "Ewma",
    "Pulse",
    "RateMeter",
    "StageScope",
    "StageStats",
    "current_timer",
]


class StageScope:
    """The stage of one job running in the current task: its name, the job's timer, and
    the sandbox-budget slots the job took in it (counted by the budget)."""

    __slots__ = ("name", "timer", "slots")

    def __init__(self, name: str | None, timer: PausableTimer | None = None) -> None:
        self.name = name
        self.timer = timer
        self.slots = 0


# The stage whose task is running, set by the pipeline in each stage's own context (one
# context variable, not one per field: a set and reset cost ~1,300 instructions), so the
# sandbox budget can tell which stage took a slot and pause the job's timer while it waits.
CURRENT_STAGE: contextvars.ContextVar[StageScope | None] = contextvars.ContextVar(
    "prorl_current_stage", default=None
)


def current_timer() -> PausableTimer | None:
    """The timer of the job whose stage runs in the current task, if any."""
    scope = CURRENT_STAGE.get()
    return None if scope is None else scope.timer


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
        # The newest bucket and when it ends: most events land in it (one comparison).
        self._last: list[float] = [0.0, 0]
        self._last_ends = -math.inf

    def add(self, n: int = 1, now: float | None = None) -> None:
        """Count ``n`` events (``now``: the caller's ``time.monotonic()``, if it has it)."""
        if now is None:
            now = time.monotonic()
        if now < self._last_ends:
            self._last[1] += n
        else:
            self._last = [now, n]
            self._last_ends = now + self.tick_s
            self._buckets.append(self._last)
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
    without waits for a backend or a sandbox slot) and departures of one stage.

    ``sandboxed`` is the recent share of the stage's jobs that took a sandbox-budget slot
    in the stage and ``sandboxed_active`` those jobs' own active time: in a mix of jobs
    with and without a sandbox, the sandbox-seconds per job are their product (the mean
    active time of all jobs would count the sandbox-free ones' short times too)."""

    def __init__(self) -> None:
        self.service = Ewma()
        self.active = Ewma()
        self.sandboxed = Ewma()
        self.sandboxed_active = Ewma()
        self.departures = RateMeter()
        self.arrivals = RateMeter()
        self.idle_sandbox_seconds = 0.0
        # Jobs in the stage now: their active seconds so far, by a key of the caller's.
        self._running: dict[object, tuple[PausableTimer, float]] = {}
        # Jobs in the stage whose timer is paused now (waiting for a backend), kept by the
        # timers themselves (``enter``): ``paused()`` is asked at every INIT admission,
        # with hundreds of jobs in RUN.
        self._paused_now = 0
        self._watch = self._pause_changed  # one bound method, not one per entry

    def enter(self, key: object, timer: PausableTimer, before: float | None = None) -> None:
        """A job entered the stage with ``timer`` (its active time from here on counts;
        ``before``: the timer's active seconds at the entry, if the caller has them)."""
        self._running[key] = (timer, timer.elapsed() if before is None else before)
        timer.watcher = self._watch
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

    def finished(
        self, wall_s: float, active_s: float, slots: int = 0, now: float | None = None
    ) -> None:
        """A job left the stage (``now``: the caller's ``time.monotonic()``, if it has it)."""
        self.service.add(wall_s)
        self.active.add(active_s)
        self.sandboxed.add(1.0 if slots else 0.0)
        if slots:
            self.sandboxed_active.add(active_s)
        self.departures.add(1, now)


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
