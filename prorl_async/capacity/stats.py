"""What the capacity controls measure: per-stage service times, arrivals, idle sandboxes."""

from __future__ import annotations

import asyncio
import contextvars
import time

__all__ = ["CURRENT_STAGE", "Ewma", "Pulse", "RateMeter", "StageStats"]

# The stage whose task is running (set by the pipeline in each stage task's own context),
# so the sandbox budget can tell which stage took a slot.
CURRENT_STAGE: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "prorl_current_stage", default=None
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
    """Events per second over a sliding window of ``window_s`` (at least one second old)."""

    def __init__(self, window_s: float = 5.0) -> None:
        self.window_s = window_s
        self._stamps: list[float] = []
        self._started = time.monotonic()

    def add(self, n: int = 1) -> None:
        now = time.monotonic()
        self._stamps.extend([now] * n)
        if len(self._stamps) > 4096:
            self._trim(now)

    def rate(self) -> float:
        now = time.monotonic()
        self._trim(now)
        span = min(self.window_s, max(now - self._started, 1.0))
        return len(self._stamps) / span

    def _trim(self, now: float) -> None:
        cut = now - self.window_s
        i = 0
        while i < len(self._stamps) and self._stamps[i] < cut:
            i += 1
        del self._stamps[:i]


class StageStats:
    """Service time (wall seconds in the stage; ``active``: timer-running seconds, i.e.
    without waits for a backend or a sandbox slot) and completions of one stage."""

    def __init__(self) -> None:
        self.service = Ewma()
        self.active = Ewma()
        self.completions = RateMeter()
        self.arrivals = RateMeter()
        self.idle_sandbox_seconds = 0.0

    def finished(self, wall_s: float, active_s: float) -> None:
        self.service.add(wall_s)
        self.active.add(active_s)
        self.completions.add()


class Pulse:
    """Wakes every current waiter when something changed (no state, no lost wake-ups for
    waiters that re-check their condition after each wake)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def fire(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self) -> None:
        await self._event.wait()
