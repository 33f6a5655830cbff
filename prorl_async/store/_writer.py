"""One writer thread with group commit, so the event loop never waits for an fsync.

The loop appends statements to the current batch; the batch is handed to the thread
at the end of the loop iteration. The thread takes every batch waiting, runs them in
one transaction and commits once (one fsync for all of them), then hands the batches
back to the loop in one call, which resolves each batch's future and runs the
callbacks registered for after its commit. ``sync()`` waits for the batch holding
every statement issued so far: an HTTP answer sent after it is backed by the disk.

The thread gives up the interpreter lock around every SQLite call, and while the loop
is busy, taking it back costs up to a switch interval each time: what a commit costs
the submits waiting on it is mostly the number of statements it runs, not their size.
So the rows of each kind (``RowKind``: job accepted, job finished, result expired) are
gathered across the transaction and written by one statement of exactly that many rows
(up to 256 a statement), moved past rows of other kinds only where no id of theirs is
in between (any other statement is a barrier); and a statement that only keeps a
high-water mark (``write_last``) is run once per transaction with its latest
parameters. A commit of a few hundred results and submits is about six statements.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import sqlite3
import threading
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["RowKind", "Writer"]

log = logging.getLogger(__name__)

Statement = tuple[str, tuple[Any, ...]]
# Rows per multi-row statement at most: 256 rows of 6 parameters stay far below SQLite's
# limit of 32,766 (999 before 3.32, where there is no multi-row form).
_MAX_ROWS = 256
# Each kind prepares one statement per row count: room for all of them in the
# connection's statement cache, so none is parsed twice.
STATEMENT_CACHE = 4 * _MAX_ROWS


class RowKind:
    """A one-row statement that may be written for many rows at once: ``sql`` is what
    ``Writer.write`` is given, ``many(n)`` the same for ``n`` rows (parameters of the
    rows one after the other), ``key`` the index of the row's id in its parameters.
    Rows of one kind for distinct ids commute (each touches only its own id)."""

    def __init__(self, sql: str, many: Callable[[int], str] | None, key: int) -> None:
        self.sql = sql
        self.key = key
        self._make = many
        self._many: dict[int, str] = {}

    def many(self, n: int) -> str | None:
        if self._make is None or not 1 < n <= _MAX_ROWS:
            return None
        sql = self._many.get(n)
        if sql is None:
            sql = self._many[n] = self._make(n)
        return sql


class _Batch:
    __slots__ = ("statements", "waiters", "after", "done", "error")

    def __init__(self) -> None:
        self.statements: list[Statement] = []
        # One future per ``sync`` caller: a caller that goes away cancels only its own.
        self.waiters: list[asyncio.Future[None]] = []
        self.done = False
        self.error: BaseException | None = None
        # (callback, always): called on the loop after the commit (always: even if it failed)
        self.after: list[tuple[Callable[[bool], None], bool]] = []


class Writer:
    """Owns the write connection and its thread; ``aclose`` commits what is queued."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        loop: asyncio.AbstractEventLoop,
        kinds: Sequence[RowKind] = (),
    ) -> None:
        self._conn = conn
        self._loop = loop
        self._kinds = {kind.sql: kind for kind in kinds}
        self._order = {kind: i for i, kind in enumerate(kinds)}
        self._queue: queue.SimpleQueue[tuple[_Batch, dict[str, Statement]] | None] = (
            queue.SimpleQueue()
        )
        self._batch: _Batch | None = None
        self._last: dict[str, Statement] = {}
        self._handed: _Batch | None = None  # the last batch handed to the thread
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="jobstore-writer", daemon=True)
        self._thread.start()

    def _current(self) -> _Batch:
        if self._closed:
            raise RuntimeError("job store is closed")
        batch = self._batch
        if batch is None:
            batch = self._batch = _Batch()
            self._loop.call_soon(self._hand_over)
        return batch

    def write(self, sql: str, params: tuple[Any, ...]) -> None:
        """Queue one statement; it is committed with its batch."""
        self._current().statements.append((sql, params))

    def write_last(self, key: str, sql: str, params: tuple[Any, ...]) -> None:
        """Queue a statement run once per transaction, after the others, with the
        parameters of the latest call for ``key`` (an upsert of a high-water mark)."""
        self._current()
        self._last[key] = (sql, params)

    def after_commit(self, callback: Callable[[bool], None], *, always: bool = False) -> None:
        """Call ``callback(committed)`` on the loop once everything queued so far is
        committed (``always``: also, with False, if that commit failed)."""
        self._current().after.append((callback, always))

    async def sync(self) -> None:
        """Return once every statement queued so far is committed; raise if the commit failed."""
        batch = self._batch if self._batch is not None else self._handed
        if batch is None:
            return
        if not batch.done:
            waiter = self._loop.create_future()
            batch.waiters.append(waiter)
            await waiter
        if batch.error is not None:
            raise batch.error

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
            self._handed = batch
            last, self._last = self._last, {}
            self._queue.put((batch, last))

    # -- the writer thread -------------------------------------------------------------------

    def _run(self) -> None:
        stop = False
        while not stop:
            first = self._queue.get()
            if first is None:
                break
            taken = [first]
            while True:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                taken.append(nxt)
            self._commit(taken)
        self._conn.close()

    def _commit(self, taken: list[tuple[_Batch, dict[str, Statement]]]) -> None:
        error: BaseException | None = None
        last: dict[str, Statement] = {}
        statements: list[Statement] = []
        for batch, batch_last in taken:
            statements += batch.statements
            last.update(batch_last)
        try:
            with self._conn:  # one transaction, one commit for every batch waiting
                self._execute(statements)
                for sql, params in last.values():
                    self._conn.execute(sql, params)
        except Exception as exc:  # not only sqlite3.Error: the thread must answer every batch
            log.error("job store commit of %d batches failed: %r", len(taken), exc)
            error = exc
        self._loop.call_soon_threadsafe(_resolve, [batch for batch, _ in taken], error)

    def _execute(self, statements: list[Statement]) -> None:
        # The rows of each kind since the last barrier, in the kinds' order; ``seen`` has
        # the latest kind (its position) each id has a row of. A row may join its kind's
        # rows only if its id has none of the same or a later kind pending (those would
        # run before it); else what is pending is written first.
        order = self._order
        pending: dict[RowKind, list[tuple[Any, ...]]] = {}
        seen: dict[Any, int] = {}
        for sql, params in statements:
            kind = self._kinds.get(sql)
            if kind is None:  # a barrier
                if pending:
                    self._flush(pending)
                    pending, seen = {}, {}
                self._conn.execute(sql, params)
                continue
            at, key = order[kind], params[kind.key]
            if seen.get(key, -1) >= at:
                self._flush(pending)
                pending, seen = {}, {}
            seen[key] = at
            rows = pending.get(kind)
            if rows is None:
                rows = pending[kind] = []
            rows.append(params)
        if pending:
            self._flush(pending)

    def _flush(self, pending: dict[RowKind, list[tuple[Any, ...]]]) -> None:
        for kind in sorted(pending, key=self._order.__getitem__):
            self._rows(kind, pending[kind])

    def _rows(self, kind: RowKind, rows: list[tuple[Any, ...]]) -> None:
        if kind.many(2) is None:  # no multi-row form: one executemany for the run
            self._conn.executemany(kind.sql, rows)
            return
        for at in range(0, len(rows), _MAX_ROWS):
            chunk = rows[at : at + _MAX_ROWS]
            sql = kind.many(len(chunk))
            if sql is None:
                self._conn.execute(kind.sql, chunk[0])
            else:
                self._conn.execute(sql, [v for row in chunk for v in row])


def _resolve(batches: list[_Batch], error: BaseException | None) -> None:
    for batch in batches:
        batch.done, batch.error = True, error
        for waiter in batch.waiters:
            if not waiter.done():
                waiter.set_result(None)
        for callback, always in batch.after:
            if error is None or always:
                try:
                    callback(error is None)
                except Exception:
                    log.exception("job store: a callback after the commit failed")
