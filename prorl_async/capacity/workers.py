"""A resizable pool of worker tasks draining one queue, and that queue.

The number of workers *is* the stage's concurrency. Growing starts workers at once.
Shrinking never cancels a job: workers waiting for a job are cancelled (they hold
nothing: an ``asyncio.Queue.get`` cancelled before it returns leaves the item in the
queue), and busy workers over the new size leave after their current job.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Generic, Protocol, TypeVar

__all__ = ["Fifo", "StageQueue", "WorkerPool"]

T = TypeVar("T")


class Fifo(Protocol[T]):
    """What a ``StageQueue`` keeps its items in (a ``deque``, or ``FairQueue``'s rounds)."""

    def append(self, item: T) -> None: ...
    def popleft(self) -> T: ...
    def __len__(self) -> int: ...


class StageQueue(Generic[T]):
    """An unbounded FIFO that a stage's workers drain: ``asyncio.Queue``'s ``get``,
    ``put_nowait``, ``get_nowait`` and ``qsize``, without what a stage never uses
    (a bound, putters, ``task_done``/``join``). Every job passes three of these, so
    each call saved here is saved three times a job.

    As in ``asyncio.Queue``: a ``get`` cancelled before it returns leaves the item in
    the queue, and a getter woken for an item but cancelled before it took it passes
    the wake on to the next getter.
    """

    __slots__ = ("_items", "_getters")

    def __init__(self, items: Fifo[T] | None = None) -> None:
        self._items: Fifo[T] = deque() if items is None else items
        self._getters: deque[asyncio.Future[None]] = deque()

    def qsize(self) -> int:
        return len(self._items)

    def empty(self) -> bool:
        return not self._items

    def put_nowait(self, item: T) -> None:
        self._items.append(item)
        self._wake()

    def get_nowait(self) -> T:
        if not self._items:
            raise asyncio.QueueEmpty
        return self._items.popleft()

    async def get(self) -> T:
        items = self._items
        while not items:
            getter = asyncio.get_running_loop().create_future()
            self._getters.append(getter)
            try:
                await getter
            except BaseException:
                getter.cancel()
                try:
                    self._getters.remove(getter)
                except ValueError:
                    pass  # already woken
                if items and not getter.cancelled():
                    self._wake()  # woken for an item it will not take: the next getter
                raise
        return items.popleft()

    def _wake(self) -> None:
        getters = self._getters
        while getters:
            getter = getters.popleft()
            if not getter.done():
                getter.set_result(None)
                return


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
