"""``StageRun``: what one stage of one job times and counts.

A stage runs its job inside the job's ``Deadline`` (the timer runs only in there).
``enter`` (inside the deadline) registers the job with the stage's statistics; ``leave``
(after it) takes the stage's wall and active seconds from the deadline's own clock
readings, so measuring costs no extra clock calls, and records them.
"""

from __future__ import annotations

import asyncio
from typing import Any

from prorl_async.stages.scope import StageScope
from prorl_async.stages.stats import StageStats
from prorl_async.util.timer import PausableTimer

__all__ = ["StageRun"]


class StageRun:
    """One job's time in one stage: its scope, its deadline, and the stage's statistics.

    ``wall`` is the stage's wall time; ``active`` what the timer counted (waits for a
    backend or a sandbox slot paused it). Both are set by ``leave``."""

    __slots__ = ("name", "timer", "stats", "scope", "deadline", "before", "wall", "active")

    def __init__(
        self, name: str, timer: PausableTimer, stats: StageStats, worker: asyncio.Task[Any]
    ) -> None:
        self.name = name
        self.timer = timer
        self.stats = stats
        self.scope = StageScope(name, timer)
        self.before = timer.elapsed()
        self.deadline = timer.deadline(worker)
        self.wall = 0.0
        self.active = 0.0

    def enter(self, key: object) -> None:
        """The job starts its stage (call inside ``deadline``: its timer runs)."""
        self.stats.enter(key, self.timer, self.before)

    def leave(self, key: object) -> None:
        """The job left its stage (call after ``deadline`` has exited)."""
        now = self.deadline.exited_at
        self.active = self.timer.elapsed() - self.before
        self.wall = now - self.deadline.entered_at
        # The deadline's pause counted the job paused; ``leave`` uncounts it.
        self.stats.leave(key, self.timer)
        self.stats.finished(self.wall, self.active, self.scope.slots, now)

    def timed_out(self) -> bool:
        """Whether the job's active-time budget ran out in this stage."""
        return self.deadline.expired()
