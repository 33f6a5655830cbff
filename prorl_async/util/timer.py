"""A job's pausable activity timer.

The timer runs only while the job is inside a stage and pauses while it waits in
a queue or for an LLM backend. Its budget (``timeout_s``) is enforced through a
``Deadline`` (``asyncio.Timeout``'s semantics) that the timer reschedules on every
pause and resume, so a stage is cancelled exactly when the *active* time runs out.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any

__all__ = ["Deadline", "PausableTimer"]


class PausableTimer:
    """Counts active seconds against a budget; paused by default."""

    __slots__ = ("budget", "_active", "_since", "_timeout", "_clock", "watcher")

    def __init__(self, budget: float | None) -> None:
        self.budget = budget
        self._active = 0.0
        self._since: float | None = None
        self._timeout: Deadline | None = None
        self._clock = time.monotonic
        # Told +1 on every pause and -1 on every resume (a stage's count of paused jobs).
        self.watcher: Callable[[int], None] | None = None

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

    def resume(self) -> float:
        """Run (if paused); returns the clock's reading. The deadline in force (if any)
        is armed for when the budget runs out."""
        now = self._clock()
        if self._since is None:
            self._since = now
            if self._timeout is not None:
                self._timeout.arm()
            if self.watcher is not None:
                self.watcher(-1)
        return now

    def pause(self) -> float:
        """Pause (if running); returns the clock's reading. The deadline in force (if
        any) is disarmed until the timer runs again."""
        now = self._clock()
        if self._since is not None:
            self._active += now - self._since
            self._since = None
            if self._timeout is not None:
                self._timeout.disarm()
            if self.watcher is not None:
                self.watcher(1)
        return now

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

    def deadline(self, task: asyncio.Task[Any] | None = None) -> Deadline:
        """``async with timer.deadline():`` runs the body as active time and cancels it
        (``task``: the current task, if the caller has it at hand) when the budget runs out.

        Raises ``TimeoutError`` when the budget is exhausted (``Deadline.expired()``
        tells it apart from a ``TimeoutError`` raised by the body itself).
        """
        return Deadline(self, task)


_ENTERED, _EXPIRING, _EXPIRED, _EXITED = range(4)

# Deadlines to arm at the next step of their loop: one loop callback for all of them,
# which removes the loop's entry. A plain dict, not a WeakKeyDictionary (whose lookup
# costs ~1,800 instructions a stage): an entry outlives its loop only if the loop closed
# before its next step, and such entries are dropped when the next one is made.
_DUE: dict[asyncio.AbstractEventLoop, list[Deadline]] = {}


def _arm_due(loop: asyncio.AbstractEventLoop) -> None:
    for deadline in _DUE.pop(loop, ()):
        if deadline._state == _ENTERED:  # most have exited by now (their stage ended)
            deadline._arm()


def _due(loop: asyncio.AbstractEventLoop) -> list[Deadline]:
    """The list of deadlines ``loop`` arms at its next step (made, and the step's callback
    scheduled, on first use)."""
    if _DUE:
        for closed in [other for other in _DUE if other.is_closed()]:
            del _DUE[closed]
    due = _DUE[loop] = []
    loop.call_soon(_arm_due, loop)
    return due


class Deadline:
    """A ``PausableTimer``'s budget around one stage: ``asyncio.Timeout``'s semantics
    (the task is cancelled when the active time runs out, and ``TimeoutError`` raised at
    the exit), rescheduled on every pause and resume.

    The loop timer is armed one loop step after a resume, for the same absolute time: a
    stage that ends without waiting (most stages of a load test) never allocates one, and
    the deadlines resumed in one loop step share one callback. Entered with ``with``
    (nothing in it waits) or ``async with``, as ``asyncio.Timeout``.
    """

    __slots__ = (
        "_timer",
        "_task",
        "_cancelling",
        "_state",
        "_handle",
        "_arming",
        "entered_at",
        "exited_at",
    )

    def __init__(self, timer: PausableTimer, task: asyncio.Task[Any] | None = None) -> None:
        self._timer = timer
        self._task = task
        self._cancelling = 0
        self._state = _ENTERED
        self._handle: asyncio.TimerHandle | None = None
        self._arming = False
        # The timer's clock when the deadline was entered and exited (the stage's wall
        # time, with no clock reading of the caller's own).
        self.entered_at = 0.0
        self.exited_at = 0.0

    def expired(self) -> bool:
        """Whether the budget ran out (the body was cancelled for it)."""
        return self._state == _EXPIRING or self._state == _EXPIRED

    def arm(self) -> None:
        """The timer runs: cancel the body when its budget runs out (armed one loop step
        later, for the time the budget runs out then: the same instant)."""
        if self._state != _ENTERED or self._timer.budget is None:
            return
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if not self._arming:
            self._arming = True
            loop = asyncio.get_running_loop()
            (_DUE.get(loop) or _due(loop)).append(self)

    def disarm(self) -> None:
        """The timer is paused: no deadline until it runs again."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _arm(self) -> None:
        """Armed at the step after a resume (``_arm_due``: only while entered)."""
        self._arming = False
        timer = self._timer
        if not timer.running or self._handle is not None:
            return  # paused again, or armed already
        left = timer.remaining()
        if left is None:
            return
        if left <= 0:
            self._on_timeout()
        else:
            loop = asyncio.get_running_loop()
            self._handle = loop.call_at(loop.time() + left, self._on_timeout)

    def _on_timeout(self) -> None:
        assert self._task is not None
        self._task.cancel()
        self._state = _EXPIRING
        self._handle = None

    async def __aenter__(self) -> Deadline:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)

    def __enter__(self) -> Deadline:
        task = self._task or asyncio.current_task()
        if task is None:
            raise RuntimeError("a Deadline must be entered inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        timer = self._timer
        timer._timeout = self
        self.entered_at = timer.resume()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        timer = self._timer
        self.exited_at = timer.pause()
        timer._timeout = None
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._state == _EXPIRING:
            self._state = _EXPIRED
            assert self._task is not None
            if self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
                raise TimeoutError from exc
        elif self._state == _ENTERED:
            self._state = _EXITED
