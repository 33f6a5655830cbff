"""A job's pausable activity timer.

The timer runs only while the job is inside a stage and pauses while it waits in
a queue or for an LLM backend. Its budget (``timeout_s``) is enforced through an
``asyncio.Timeout`` that the timer reschedules on every pause and resume, so a
stage is cancelled exactly when the *active* time runs out.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

__all__ = ["PausableTimer", "current_timer"]

# The timer of the stage running in this task (set by ``deadline``), so code deep in a
# handler (a sandbox start waiting for budget) can pause it without being handed the job.
_CURRENT: contextvars.ContextVar[PausableTimer | None] = contextvars.ContextVar(
    "prorl_current_timer", default=None
)


def current_timer() -> PausableTimer | None:
    """The timer of the job whose stage runs in the current task, if any."""
    return _CURRENT.get()


class PausableTimer:
    """Counts active seconds against a budget; paused by default."""

    __slots__ = ("budget", "_active", "_since", "_timeout", "_clock")

    def __init__(self, budget: float | None) -> None:
        self.budget = budget
        self._active = 0.0
        self._since: float | None = None
        self._timeout: asyncio.Timeout | None = None
        self._clock = time.monotonic

    @property
    def running(self) -> bool:
        return self._since is not None

    def elapsed(self) -> float:
        """Active seconds so far, including the current running stretch."""
        if self._since is None:
            return self._active
        return self._active + (self._clock() - self._since)

    def remaining(self) -> float | None:
        if self.budget is None:
            return None
        return self.budget - self.elapsed()

    def expired(self) -> bool:
        left = self.remaining()
        return left is not None and left <= 0

    def resume(self) -> None:
        if self._since is None:
            self._since = self._clock()
            self._reschedule()

    def pause(self) -> None:
        if self._since is not None:
            self._active += self._clock() - self._since
            self._since = None
            self._reschedule()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Pause while waiting for something outside the job (a backend, a queue)."""
        was_running = self.running
        self.pause()
        try:
            yield
        finally:
            if was_running:
                self.resume()

    @asynccontextmanager
    async def deadline(self) -> AsyncIterator[asyncio.Timeout]:
        """Run the body as active time; cancel it when the budget runs out.

        Raises ``TimeoutError`` when the budget is exhausted (``Timeout.expired()``
        tells it apart from a ``TimeoutError`` raised by the body itself).
        """
        async with asyncio.timeout(None) as tm:
            self._timeout = tm
            token = _CURRENT.set(self)
            self.resume()
            try:
                yield tm
            finally:
                self.pause()
                self._timeout = None
                _CURRENT.reset(token)

    def _reschedule(self) -> None:
        tm = self._timeout
        if tm is None or tm.expired():
            return
        left = self.remaining()
        if self._since is None or left is None:
            tm.reschedule(None)
        else:
            tm.reschedule(asyncio.get_running_loop().time() + max(left, 0.0))
