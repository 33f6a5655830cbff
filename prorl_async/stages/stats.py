"""What a stage measures: service times, arrivals, departures, idle sandbox-seconds."""

from __future__ import annotations

import collections
import math
import statistics
import time

from prorl_async.util.timer import PausableTimer

__all__ = ["Ewma", "RateMeter", "StageStats"]


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
