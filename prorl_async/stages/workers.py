"""A resizable pool of worker tasks draining one stage queue.

The number of workers *is* the stage's concurrency. Growing starts workers at once.
Shrinking never cancels a job: workers waiting for a job are cancelled (they hold
nothing: a ``StageQueue.get`` cancelled before it returns leaves the item in the
queue), and busy workers over the new size leave after their current job.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from prorl_async.stages.queue import StageQueue

__all__ = ["WorkerPool"]

T = TypeVar("T")


class WorkerPool(Generic[T]):
    """``size`` workers, each looping ``item = await queue.get(); await handle(item, me)``
    (``me``: the worker's own task, which a handler would otherwise look up per item)."""

    def __init__(
        self,
        name: str,
        queue: StageQueue[T],
        handle: Callable[[T, asyncio.Task[None]], Awaitable[None]],
        size: int,
    ) -> None:
        self.name = name
        self.size = size
        self._queue = queue
        self._handle = handle
        self._serial = 0
        self._members: set[asyncio.Task[None]] = set()  # counted against size
        self._idle: set[asyncio.Task[None]] = set()
        self._tasks: set[asyncio.Task[None]] = set()  # every task not yet ended

    @property
    def live(self) -> int:
        """Workers alive now, including busy ones that will leave after their job."""
        return len(self._tasks)

    @property
    def idle(self) -> int:
        return len(self._idle)

    def start(self) -> None:
        self._spawn_up_to(self.size)

    def resize(self, size: int) -> None:
        """Set the concurrency; effective at once for growth and idle workers."""
        if size < 0:
            raise ValueError(f"{self.name} workers must be >= 0, got {size}")
        self.size = size
        if not self._tasks:
            return  # not started: start() uses the new size
        self._spawn_up_to(size)
        for task in list(self._idle):
            if len(self._members) <= size:
                break
            self._members.discard(task)
            self._idle.discard(task)
            task.cancel()

    def _spawn_up_to(self, size: int) -> None:
        while len(self._members) < size:
            self._serial += 1
            task = asyncio.create_task(self._run(), name=f"worker-{self.name}-{self._serial}")
            self._members.add(task)
            self._tasks.add(task)
            task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._members.discard(task)
        self._idle.discard(task)

    async def _run(self) -> None:
        me = asyncio.current_task()
        assert me is not None
        while me in self._members and len(self._members) <= self.size:
            self._idle.add(me)
            try:
                item = await self._queue.get()
            finally:
                self._idle.discard(me)
            await self._handle(item, me)
        self._members.discard(me)  # over size: leave after the job just finished

    async def aclose(self) -> None:
        """Cancel every worker and wait for them (the handler decides what a job does)."""
        self._members.clear()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
