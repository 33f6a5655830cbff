"""One writer thread with group commit, so the event loop never waits for an fsync.

The loop appends statements to the current batch; the batch is handed to the thread
at the end of the loop iteration. The thread takes every batch waiting, runs them in
one transaction and commits once (one fsync for all of them), then resolves each
batch's future on the loop. ``sync()`` waits for the batch holding every statement
issued so far: an HTTP answer sent after it is backed by the disk.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import sqlite3
import threading
from typing import Any

__all__ = ["Writer"]

log = logging.getLogger(__name__)

Statement = tuple[str, tuple[Any, ...]]


class _Batch:
    __slots__ = ("statements", "future")

    def __init__(self, future: asyncio.Future[BaseException | None]) -> None:
        self.statements: list[Statement] = []
        self.future = future


class Writer:
    """Owns the write connection and its thread; ``aclose`` commits what is queued."""

    def __init__(self, conn: sqlite3.Connection, loop: asyncio.AbstractEventLoop) -> None:
        self._conn = conn
        self._loop = loop
        self._queue: queue.SimpleQueue[_Batch | None] = queue.SimpleQueue()
        self._batch: _Batch | None = None
        self._last: asyncio.Future[BaseException | None] | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="jobstore-writer", daemon=True)
        self._thread.start()

    def write(self, sql: str, params: tuple[Any, ...]) -> None:
        """Queue one statement; it is committed with its batch."""
        if self._closed:
            raise RuntimeError("job store is closed")
        if self._batch is None:
            self._batch = _Batch(self._loop.create_future())
            self._loop.call_soon(self._hand_over)
        self._batch.statements.append((sql, params))

    def pending(self) -> asyncio.Future[BaseException | None]:
        """The future of the batch the next statement joins (resolved after its commit)."""
        if self._batch is None:
            raise RuntimeError("no statement queued")
        return self._batch.future

    async def sync(self) -> None:
        """Return once every statement queued so far is committed; raise if the commit failed."""
        fut = self._batch.future if self._batch is not None else self._last
        if fut is None:
            return
        error = await asyncio.shield(fut)
        if error is not None:
            raise error

    async def aclose(self) -> None:
        """Commit what is queued, end the thread. Idempotent."""
        if self._closed:
            return
        self._hand_over()
        self._closed = True
        self._queue.put(None)
        await asyncio.shield(asyncio.to_thread(self._thread.join))

    def _hand_over(self) -> None:
        batch, self._batch = self._batch, None
        if batch is not None:
            self._last = batch.future
            self._queue.put(batch)

    # -- the writer thread -------------------------------------------------------------------

    def _run(self) -> None:
        stop = False
        while not stop:
            first = self._queue.get()
            if first is None:
                break
            batches = [first]
            while True:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                batches.append(nxt)
            self._commit(batches)
        self._conn.close()

    def _commit(self, batches: list[_Batch]) -> None:
        error: BaseException | None = None
        try:
            with self._conn:  # one transaction, one commit for every batch waiting
                for batch in batches:
                    for sql, params in batch.statements:
                        self._conn.execute(sql, params)
        except sqlite3.Error as exc:
            log.error("job store commit of %d batches failed: %s", len(batches), exc)
            error = exc
        for batch in batches:
            self._loop.call_soon_threadsafe(_resolve, batch.future, error)


def _resolve(fut: asyncio.Future[BaseException | None], error: BaseException | None) -> None:
    if not fut.done():
        fut.set_result(error)
