"""The durable callback outbox: a table in the job database, written with the results.

A row is inserted in the same transaction as its job's result (``SqliteJobStore.finished``),
so a crash never loses a delivery; attempts update it through the same writer. Reads
(what is due, one job's state) run on the store's reader connection in a worker
thread and see committed rows only: ids whose update is not yet committed are skipped,
so a delivery is never taken twice. Memory holds the pending count and those ids.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any, Protocol, TypeVar, cast

from prorl_async.notify.breaker import host_of
from prorl_async.notify.sender import RESULT_GONE, Delivery
from prorl_async.schemas import CallbackInfo
from prorl_async.store._commit import RowKind

__all__ = ["FORGET_ROWS", "OUTBOX_SCHEMA", "SqliteOutbox"]

T = TypeVar("T")

OUTBOX_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    job_id TEXT PRIMARY KEY,
    url TEXT NOT NULL,
    host TEXT NOT NULL,             -- the url's host:port (its receiver's circuit breaker)
    state TEXT NOT NULL,            -- pending, delivered, failed
    attempts INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,       -- wall clock: when the job ended
    next_at REAL NOT NULL,          -- wall clock: the next attempt while pending
    last_error TEXT
);
CREATE INDEX IF NOT EXISTS outbox_due ON outbox(next_at) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS outbox_host ON outbox(host) WHERE state = 'pending';
"""
_ADD = (
    "INSERT OR REPLACE INTO outbox"
    "(job_id, url, host, state, attempts, created_at, next_at, last_error) "
    "VALUES (?, ?, ?, 'pending', 0, ?, ?, NULL)"
)
_RETIME = "UPDATE outbox SET next_at = ? WHERE state = 'pending' AND host = ?"
_SETTLE = "UPDATE outbox SET state = ?, attempts = ?, next_at = ?, last_error = ? WHERE job_id = ?"
_DROP = "DELETE FROM outbox WHERE job_id = ?"
_FORGET = "DELETE FROM outbox WHERE job_id = ? AND state != 'pending'"
# Every expired result forgets its delivery (most have none): many in one statement.
FORGET_ROWS = RowKind(
    _FORGET, 0, ("DELETE FROM outbox WHERE job_id IN (", "?", ") AND state != 'pending'")
)
_DUE = (
    "SELECT job_id, url, attempts, created_at, next_at FROM outbox "
    "WHERE state = 'pending' ORDER BY next_at LIMIT ?"
)
_INFO = "SELECT url, state, attempts, last_error, next_at FROM outbox WHERE job_id = ?"


class _Store(Protocol):
    """What the outbox uses of ``SqliteJobStore``."""

    def write(self, sql: str, params: tuple[Any, ...]) -> None: ...
    def write_rows(self, sql: str, rows: list[tuple[Any, ...]]) -> None: ...
    def write_then(self, sql: str, params: tuple[Any, ...], done: Callable[[], None]) -> None: ...
    def query(self, fn: Callable[[sqlite3.Connection], T]) -> Awaitable[T]: ...
    async def results(self, job_ids: Sequence[str]) -> dict[str, bytes]: ...


class SqliteOutbox:
    """``notify.Outbox`` over the ``outbox`` table."""

    def __init__(self, store: _Store) -> None:
        self.waker: Callable[[], None] | None = None
        self._store = store
        self._pending = 0
        self._unsettled: Counter[str] = Counter()  # ids with an update not yet committed

    def load(self, conn: sqlite3.Connection) -> None:
        conn.executescript(OUTBOX_SCHEMA)
        row = conn.execute("SELECT count(*) FROM outbox WHERE state = 'pending'").fetchone()
        self._pending = int(row[0])

    def add(self, job_id: str, url: str, now: float) -> None:
        """Queue a delivery; call in the same loop step as the job's result write."""
        self._pending += 1
        self._write(_ADD, (job_id, url, host_of(url), now, now), job_id)

    def retime(self, host: str, at: float) -> None:
        self._store.write_then(_RETIME, (at, host), self._wake)

    def _wake(self) -> None:
        if self.waker is not None:
            self.waker()

    def forget(self, job_id: str) -> None:
        """The job's row went (deleted, expired): its settled delivery goes too."""
        self._store.write(_FORGET, (job_id,))

    def forget_rows(self, rows: list[tuple[str]]) -> None:
        """``forget`` for many jobs (expired together), rows of one job id each."""
        self._store.write_rows(_FORGET, rows)

    def _write(self, sql: str, params: tuple[Any, ...], job_id: str) -> None:
        self._unsettled[job_id] += 1

        def committed() -> None:
            self._unsettled[job_id] -= 1
            if self._unsettled[job_id] <= 0:
                del self._unsettled[job_id]
            if self.waker is not None:
                self.waker()

        self._store.write_then(sql, params, committed)

    async def due(
        self, now: float, limit: int, skip: Collection[str]
    ) -> tuple[list[Delivery], float | None]:
        busy = set(skip) | set(self._unsettled)
        rows = await self._store.query(
            lambda c: c.execute(_DUE, (limit + len(busy) + 1,)).fetchall()
        )
        out: list[Delivery] = []
        for job_id, url, attempts, created_at, next_at in rows:
            if job_id in busy:
                continue
            if next_at > now:
                return out, next_at
            if len(out) < limit:
                out.append(Delivery(job_id, url, attempts, created_at))
        return out, None if len(out) < limit else now

    async def body(self, job_id: str) -> bytes | None:
        return (await self._store.results([job_id])).get(job_id)

    def settle(
        self, job_id: str, *, state: str, attempts: int, next_at: float, error: str | None
    ) -> None:
        if state != "pending":
            self._pending -= 1
        if state == "failed" and error == RESULT_GONE:  # its job's record is gone: so is the row
            self._write(_DROP, (job_id,), job_id)
        else:
            self._write(_SETTLE, (state, attempts, next_at, error, job_id), job_id)

    async def info(self, job_id: str) -> CallbackInfo | None:
        row = await self._store.query(lambda c: c.execute(_INFO, (job_id,)).fetchone())
        if row is None:
            return None
        url, state, attempts, last_error, next_at = row
        return CallbackInfo(
            job_id=job_id,
            url=url,
            state=cast(Any, state),
            attempts=attempts,
            last_error=last_error,
            next_attempt_at=next_at if state == "pending" else None,
        )

    def counts(self) -> dict[str, int]:
        return {"pending": self._pending}
