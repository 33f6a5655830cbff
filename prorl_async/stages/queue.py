"""A stage's queue: an unbounded FIFO that the stage's workers drain."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, Protocol, TypeVar

__all__ = ["Fifo", "StageQueue"]

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
