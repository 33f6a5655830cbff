"""Event-loop plumbing of the manager: the feed loop's wake-ups and the loop-lag probe.

The feed loop must yield to the event loop on every pass and must not wake itself
without something to do: a coroutine that never yields blocks every timeout, watchdog
and cancellation on its loop. ``Waker`` wakes it on an event (``set``) or at a time
(``at``, one timer); ``LoopLag`` measures how late a periodic heartbeat runs, which is
how long some step held the loop.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

__all__ = ["LoopLag", "Waker"]


class Waker:
    """Wakes one loop now (``set``) or at a monotonic time (``at``), with one timer."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self) -> None:
        """Until woken, then consume the wake-up; always yields to the loop, even if woken."""
        await asyncio.sleep(0)
        await self._event.wait()
        self._event.clear()

    def at(self, when: float, now: float | None = None) -> None:
        """Wake at ``when``: the timer only ever moves earlier.

        The pass it wakes re-arms it for whatever still waits, also when the loop's clock
        fired it a little before ``when``.
        """
        if self._timer is not None:
            if self._timer_at <= when:
                return  # the armed timer fires first
            self._timer.cancel()
        delay = when - (time.monotonic() if now is None else now)
        self._timer = asyncio.get_running_loop().call_later(max(delay, 0.0), self._fired)
        self._timer_at = when

    def _fired(self) -> None:
        self._timer = None
        self._event.set()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class LoopLag:
    """How late a heartbeat every ``period_s`` wakes up: the event loop's lag, in ms."""

    def __init__(self, period_s: float = 0.1, window: int = 50) -> None:
        self.period_s = period_s
        self.max_ms = 0.0
        self.recent: deque[float] = deque(maxlen=window)

    async def run(self) -> None:
        while True:
            start = time.monotonic()
            await asyncio.sleep(self.period_s)
            self.record(time.monotonic() - start - self.period_s)

    def record(self, late_s: float) -> None:
        ms = max(late_s, 0.0) * 1000
        self.max_ms = max(self.max_ms, ms)
        self.recent.append(ms)

    def to_dict(self) -> dict[str, float]:
        """``max`` since the start; ``recent``: the largest of the last ``window`` beats."""
        return {"max": round(self.max_ms, 1), "recent": round(max(self.recent, default=0.0), 1)}
