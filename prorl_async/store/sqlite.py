"""The durable job store: SQLite (standard library) in ``<state-dir>/jobs.sqlite3``.

Every accepted job is a row (its request, so a restart can run it again); a terminal
job's row gains the exact result bytes served; cancelled ids are tombstone rows;
expiry deletes rows. Writes go through one writer process with group commit. In
memory stay the live jobs and an index of terminal ones (id -> status, expiry, seq,
tenant) that also keeps the newest result documents, up to a bound in bytes: older
ones are dropped from memory oldest first and read back from the file.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from prorl_async.core.job import Job
from prorl_async.core.jobstore import StoreStats, StoreUnavailable, UnfinishedRecord
from prorl_async.core.resultlog import ResultLog
from prorl_async.store import _resultlog
from prorl_async.store._commit import RowKind
from prorl_async.store._commit import connect as _connect
from prorl_async.store._outbox import FORGET_ROWS, SqliteOutbox
from prorl_async.store._tombstones import Tombstones
from prorl_async.store._writer import Writer

__all__ = ["StoreError", "SqliteJobStore"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    request BLOB NOT NULL,
    status TEXT NOT NULL,          -- 'accepted' until terminal
    restarts INTEGER NOT NULL DEFAULT 0,
    result BLOB,
    expires_at REAL                -- wall clock; NULL while unfinished
);
CREATE INDEX IF NOT EXISTS jobs_unfinished ON jobs(status) WHERE status = 'accepted';
CREATE TABLE IF NOT EXISTS tombstones (id TEXT PRIMARY KEY, expires_at REAL NOT NULL);
"""
_ACCEPT = (
    "INSERT OR REPLACE INTO jobs(id, request, status, restarts, result, expires_at, tenant) "
    "VALUES (?, ?, 'accepted', ?, NULL, NULL, ?)"
)
_FINISH = "UPDATE jobs SET status = ?, result = ?, expires_at = ?, seq = ?, reward = ? WHERE id = ?"
_DELETE = "DELETE FROM jobs WHERE id = ?"
_EXPIRE = "DELETE FROM jobs WHERE id = ? AND status != 'accepted'"
# The same for many rows in one statement each (the writer's multi-row form). An old
# system SQLite (before 3.33: no UPDATE ... FROM, and before 3.32 at most 999 parameters
# a statement) writes one row at a time instead.
_MULTI_ROW = sqlite3.sqlite_version_info >= (3, 33, 0)
_ROWS = (
    RowKind(
        _ACCEPT,
        0,
        None
        if not _MULTI_ROW
        else (_ACCEPT.split("VALUES")[0] + "VALUES ", "(?, ?, 'accepted', ?, NULL, NULL, ?)", ""),
    ),
    # One UPDATE ... FROM (VALUES ...) for a run of results. It costs a little more SQLite
    # time than executemany, but it is one statement: the writer's SQLite calls are what
    # a commit costs (see _commit.py).
    RowKind(
        _FINISH,
        5,
        None
        if not _MULTI_ROW
        else (
            "UPDATE jobs SET status = v.column1, result = v.column2, expires_at = v.column3, "
            "seq = v.column4, reward = v.column5 FROM (VALUES ",
            "(?, ?, ?, ?, ?, ?)",
            ") AS v WHERE jobs.id = v.column6",
        ),
    ),
    # Results past retention: one DELETE ... IN (...) (fine on any SQLite) per run.
    RowKind(_EXPIRE, 0, ("DELETE FROM jobs WHERE id IN (", "?", ") AND status != 'accepted'")),
)
_TOMBSTONE = "INSERT OR REPLACE INTO tombstones(id, expires_at) VALUES (?, ?)"
_UNTOMB = "DELETE FROM tombstones WHERE id = ?"

_encoder = msgspec.json.Encoder()
# Statements in the open batch after which a finished job hands it to the writer at once
# (see ``finished``): a result is one, its callback's outbox row another. 64 cut a wave of
# 256 results into four commits (docs/performance.md, the request path).
_FINISH_CHUNK = 64


# A terminal job: status, expiry deadline (monotonic), seq, tenant, its result document
# while kept in memory (None once dropped: read back from the file), and the number of
# the write batch holding its result (served only once that batch is committed).
_Done = tuple[str, float, int | None, str, bytes | None, int]


class StoreError(RuntimeError):
    """The job database cannot be used; the message names the file and what is wrong."""


def _wall_to_mono(wall: float) -> float:
    return wall - time.time() + time.monotonic()


def _mono_to_wall(mono: float) -> float:
    return mono - time.monotonic() + time.time()


class SqliteJobStore:
    """Durable job records; the same interface as ``MemoryJobStore``."""

    kind = "sqlite"

    def __init__(
        self,
        *,
        path: str | Path,
        retention_s: float,
        tombstone_s: float,
        cache_bytes: int,
        commit_timeout_s: float = 30.0,
    ) -> None:
        self.path = Path(path)
        self.commit_timeout_s = commit_timeout_s
        # Told once if the writer process is lost (the server then stops: see _writer.py).
        self.on_lost: Callable[[str], None] | None = None
        # The state dir's free bytes at the last ``check`` (None before the first).
        self.free_bytes: int | None = None
        self._sampling: asyncio.Future[os.statvfs_result] | None = None
        self._said: str | None = None  # the fault last logged by ``check``
        self.retention_s = retention_s
        self.tombstone_s = tombstone_s
        self.cache_limit = cache_bytes
        self._live: dict[str, Job] = {}
        # Terminal ids, one record each (one dict: a job's end, a read and its expiry
        # each touch one entry): see ``_Done``.
        self._done: dict[str, _Done] = {}
        # (deadline, id) in the order jobs ended: expiry pops from the left.
        self._expiry: deque[tuple[float, str]] = deque()
        # The same for the documents kept in memory: the cache bound drops the oldest
        # first, from the left (indexing ``_expiry`` past the dropped ones instead walked
        # the deque's blocks, ~1,400 of them a result with 90k results cached).
        self._cached: deque[tuple[float, str]] = deque()
        self._cache_bytes = 0
        self._tombstones = Tombstones()
        self._counts: Counter[str] = Counter()
        self._frozen = False
        self._reader: sqlite3.Connection | None = None
        self._reading = asyncio.Lock()
        self._writer: Writer | None = None
        self.log = ResultLog()
        self.outbox = SqliteOutbox(self)

    # -- open and recover ----------------------------------------------------------------------

    def open(self) -> list[UnfinishedRecord]:
        """Open (or create) the file, drop expired rows, load the index.

        Returns the jobs an earlier process accepted and never finished. Raises
        ``StoreError`` naming the file if it is not a usable job database.
        """
        if self._reader is not None:
            return []
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            reader = _connect(self.path)
            reader.executescript(_SCHEMA)
            _resultlog.migrate(reader)
            self.outbox.load(reader)
            unfinished = self._load(reader)
        except sqlite3.Error as exc:
            raise StoreError(
                f"job database {self.path} is unreadable or corrupt ({exc}); "
                "move it away or start with --reset-state to set it aside"
            ) from None
        try:
            self._writer = Writer(
                self.path,
                asyncio.get_running_loop(),
                (*_ROWS, FORGET_ROWS),
                commit_timeout_s=self.commit_timeout_s,
                on_lost=self._lost,
            )
        except OSError as exc:
            reader.close()
            raise StoreError(f"cannot start the writer process of {self.path}: {exc}") from None
        self._reader = reader
        return unfinished

    def _load(self, conn: sqlite3.Connection) -> list[UnfinishedRecord]:
        now = time.time()
        with conn:
            _resultlog.expire_at_open(conn, now)
            conn.execute("DELETE FROM jobs WHERE expires_at <= ?", (now,))
            conn.execute("DELETE FROM tombstones WHERE expires_at <= ?", (now,))
        rows = conn.execute(
            "SELECT id, status, expires_at, seq, tenant FROM jobs WHERE status != 'accepted' "
            "ORDER BY expires_at"
        )
        for job_id, status, expires_at, seq, tenant in rows:
            deadline = _wall_to_mono(expires_at)
            self._done[job_id] = (sys.intern(status), deadline, seq, sys.intern(tenant), None, 0)
            self._expiry.append((deadline, job_id))  # their documents are in the file only
        _resultlog.load_log(conn, self.log)
        for job_id, expires_at in conn.execute(
            "SELECT id, expires_at FROM tombstones ORDER BY expires_at"
        ):
            self._tombstones.add(job_id, _wall_to_mono(expires_at))
        rows = conn.execute(
            "SELECT id, request, restarts, tenant FROM jobs WHERE status = 'accepted' "
            "ORDER BY rowid"
        )
        return [UnfinishedRecord(i, bytes(r), n, t) for i, r, n, t in rows]

    # -- reads ---------------------------------------------------------------------------------

    def get(self, job_id: str) -> Job | None:
        return self._live.get(job_id)

    def status(self, job_id: str) -> str | None:
        job = self._live.get(job_id)
        if job is not None:
            return job.status
        done = self._done.get(job_id)
        return None if done is None else done[0]

    def tenant_of(self, job_id: str) -> str | None:
        job = self._live.get(job_id)
        if job is not None:
            return job.tenant
        done = self._done.get(job_id)
        return None if done is None else done[3]

    def seq_of(self, job_id: str) -> int | None:
        done = self._done.get(job_id)
        return None if done is None else done[2]

    async def results(self, job_ids: Sequence[str], *, partial: bool = False) -> dict[str, bytes]:
        """From memory; those no longer kept there in one read in a worker thread (a read
        may wait for the disk or for the writer's lock: never on the event loop).

        Only committed results are returned: one still in the write queue waits for its
        commit, so what a client read is never taken back by a crash (a requeued job
        would run again and answer other bytes). ``partial``: if some are committed
        already, return those now and leave out the rest (a poll answers with what it
        has and lists the others as pending); wait for a commit only if none is."""
        found: dict[str, bytes] = {}
        missing = []
        writer = self._writer
        settled = writer.settled if writer is not None else sys.maxsize
        held: list[str] = []  # terminal, in a write batch not yet committed
        done = self._done
        for job_id in job_ids:
            record = done.get(job_id)
            if record is None:
                continue
            if record[5] > settled:
                held.append(job_id)
                continue
            body = record[4]
            if body is None:
                missing.append(job_id)
            else:
                found[job_id] = body
        if held and not (partial and (found or missing)):
            try:
                await self.sync()  # before reading the file, too: the row is there once committed
            except StoreUnavailable:
                if not partial:
                    raise
                held = []  # not committed now: a poll lists them pending
            settled = writer.settled if writer is not None else sys.maxsize
            for job_id in held:
                record = done.get(job_id)
                if record is None or record[5] > settled:  # deleted, or ended again, meanwhile
                    continue
                body = record[4]
                if body is None:
                    missing.append(job_id)
                else:
                    found[job_id] = body
        if missing:
            async with self._reading:  # one thread on the reader connection at a time
                if self._reader is None:
                    raise RuntimeError(f"job store {self.path} is not open")
                read = await asyncio.to_thread(_read_results, self._reader, missing)
            found.update(read)  # not kept in memory again: reads of old results are rare
        return found

    def is_tombstoned(self, job_id: str) -> bool:
        return job_id in self._tombstones

    def unfinished(self) -> list[Job]:
        return list(self._live.values())

    def unfinished_count(self) -> int:
        return len(self._live)

    def __len__(self) -> int:
        return len(self._live) + len(self._done)

    def counts(self) -> dict[str, int]:
        return {s: self._counts[s] for s in ("done", "failed", "cancelled", "timed_out")}

    def stats(self) -> StoreStats:
        size = sum(_size(self.path.with_name(self.path.name + s)) for s in ("", "-wal"))
        problem = self.problem()
        return StoreStats(
            kind=self.kind,
            rows=len(self),
            bytes=size,
            cache_bytes=self._cache_bytes,
            free_bytes=self.free_bytes,
            errors=0 if self._writer is None else self._writer.errors,
            problem=None if problem is None else problem.detail,
        )

    # -- faults --------------------------------------------------------------------------------

    def problem(self) -> StoreUnavailable | None:
        """Why a write cannot be committed now (its detail names the state dir and its
        free space, or the writer process), or None."""
        writer = self._writer
        fault = None if writer is None else writer.problem()
        if fault is None or fault.cause != "storage":
            return fault
        free = "unknown" if self.free_bytes is None else f"{self.free_bytes} bytes"
        return StoreUnavailable(
            "storage",
            f"the job store cannot write to state dir {self.path.parent} ({free} free): "
            f"{fault.detail}; free space there (or give the server another --state-dir)",
            retry_after=5.0,
        )

    async def check(self) -> None:
        """Sample the state dir's free space (in a thread: a stuck file system must not
        stop the loop; one sample at a time), make an idle writer answer, and log a
        fault once when it starts and once when it ends."""
        writer = self._writer
        if writer is None:
            return
        writer.ping()
        if self._sampling is None or self._sampling.done():
            self._sampling = asyncio.ensure_future(asyncio.to_thread(os.statvfs, self.path.parent))
            self._sampling.add_done_callback(self._sampled)
        problem = self.problem()
        said = None if problem is None else problem.cause
        if said != self._said:
            if problem is not None:
                log.error("job store unavailable: %s", problem.detail)
            else:
                log.warning("job store available again (was: %s)", self._said)
            self._said = said

    async def committing(self, timeout: float) -> None:
        """Wait (at most ``timeout`` s) for the writer's next commit, if the store cannot
        commit now; return at once otherwise."""
        if self._writer is not None and self.problem() is not None:
            await self._writer.next_answer(timeout)

    def _sampled(self, done: asyncio.Future[os.statvfs_result]) -> None:
        if done.cancelled() or done.exception() is not None:
            return
        st = done.result()
        self.free_bytes = st.f_bavail * st.f_frsize

    def _lost(self, what: str) -> None:
        if self.on_lost is not None:
            self.on_lost(what)

    # -- writes --------------------------------------------------------------------------------

    def add(self, job: Job) -> None:
        job_id = job.id
        self._live[job_id] = job
        if job_id in self._done:  # an id used again: its old result goes
            self._drop_done(job_id)
        request = b"{}" if job.request is None else _encoder.encode(job.request)
        self.write(_ACCEPT, (job_id, request, job.restarts, job.tenant))

    def finished(self, job: Job) -> None:
        job_id, status = job.id, job.status
        self._live.pop(job_id, None)
        if self._frozen and status == "cancelled":
            return  # cancelled by shutdown: the row stays 'accepted' and runs again at restart
        writer = self._writer_()
        now = time.time()
        deadline = time.monotonic() + self.retention_s
        body = job.result or b""
        seq = job.seq
        size = len(body)
        kept = body if size <= self.cache_limit else None  # else it alone would empty it
        self._done[job_id] = (status, deadline, seq, job.tenant, kept, writer.next_batch)
        self._expiry.append((deadline, job_id))
        self._counts[status] += 1
        if kept is not None:
            self._cached.append((deadline, job_id))
            self._cache_bytes += size
            if self._cache_bytes > self.cache_limit:
                self._evict()
        writer.write(_FINISH, (status, body, now + self.retention_s, seq, job.reward, job_id))
        if job.callback_url is not None:  # one transaction with the result: never lost
            self.outbox.add(job_id, job.callback_url, now)
        if seq is not None:
            # Readers of the result log see it once the result and its seq are durable.
            writer.write_last("last_seq", _resultlog.LAST_SEQ, (seq,))
            writer.gather("log", self._committed).append(
                (job.tenant, seq, job_id, status, job.reward)
            )
        if status == "cancelled":
            self.tombstone(job_id)
        # Jobs that end in one loop step (a wave of short ones) go to the writer in chunks,
        # so it commits the first while the loop ends the rest, and the last result waits
        # for a commit of one chunk, not of the whole wave. A job's rows stay together.
        writer.cut(_FINISH_CHUNK)

    def delete(self, job_id: str) -> bool:
        known = self._live.pop(job_id, None) is not None
        known = self._drop_done(job_id) or known
        self.write(_DELETE, (job_id,))
        self.outbox.forget(job_id)
        return known

    def tombstone(self, job_id: str) -> None:
        deadline = time.monotonic() + self.tombstone_s
        self._tombstones.add(job_id, deadline)
        self.write(_TOMBSTONE, (job_id, _mono_to_wall(deadline)))

    def expire(self, now: float | None = None, limit: int | None = None) -> int:
        """Delete results (at most ``limit``) and tombstones past their deadline; returns
        results dropped."""
        now = time.monotonic() if now is None else now
        gone: list[tuple[str]] = []
        floors: dict[str, int] = {}
        while self._expiry and self._expiry[0][0] <= now and len(gone) != limit:
            deadline, job_id = self._expiry.popleft()
            done = self._done.get(job_id)
            # A deleted-then-resubmitted id has a newer deadline (or is live again).
            if done is not None and done[1] == deadline and job_id not in self._live:
                self._drop_done(job_id)
                gone.append((job_id,))
                if done[2] is not None:
                    floors[done[3]] = max(floors.get(done[3], 0), done[2])
        cached = self._cached  # the kept documents' entries expire in the same order
        while (
            cached
            and cached[0][0] <= now
            and (not self._expiry or cached[0][0] < self._expiry[0][0])
        ):
            cached.popleft()
        if gone:  # one entry of the batch for the rows, one for their deliveries
            self.write_rows(_EXPIRE, gone)
            self.outbox.forget_rows(gone)
        for tenant, seq in floors.items():
            self.log.expire(tenant, seq)
            self.write(_resultlog.FLOOR, (tenant, seq))
        for job_id in self._tombstones.expire(now):
            self.write(_UNTOMB, (job_id,))
        return len(gone)

    def freeze(self) -> None:
        """From now on (shutdown), jobs cancelled by the server stay unfinished on disk."""
        self._frozen = True

    def flush(self) -> None:
        """Hand what is queued to the writer now, not at the end of this loop step: for a
        caller about to wait for its commit (a batch submit). The rest of the step's work
        then runs while the writer commits, and its answer is not one step later."""
        if self._writer is not None:
            self._writer.cut(0)

    async def sync(self) -> None:
        """Wait until every write issued so far is committed to the file; raise
        ``StoreUnavailable`` (see ``problem``) if that cannot be now."""
        if self._writer is not None:
            try:
                await self._writer.sync()
            except StoreUnavailable as exc:
                raise (self.problem() or exc) from None

    async def aclose(self) -> None:
        """Commit what is queued and close the file. Idempotent."""
        writer, self._writer = self._writer, None
        if writer is not None:
            await writer.aclose()
        async with self._reading:  # not under a read in a worker thread
            reader, self._reader = self._reader, None
        if reader is not None:
            reader.close()

    # -- helpers -------------------------------------------------------------------------------

    def write(self, sql: str, params: tuple[Any, ...]) -> None:
        """Queue one statement; it is committed with the others queued in this loop step."""
        writer = self._writer
        if writer is None:
            raise RuntimeError(f"job store {self.path} is not open")
        writer.write(sql, params)

    def write_rows(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        """Queue ``sql`` once per row of parameters, as one entry of the batch."""
        self._writer_().write_rows(sql, rows)

    def write_then(self, sql: str, params: tuple[Any, ...], done: Callable[[], None]) -> None:
        """Queue one statement; call ``done`` on the loop once its transaction committed."""
        self.write(sql, params)
        self._writer_().after_commit(lambda ok: done())

    def _writer_(self) -> Writer:
        if self._writer is None:
            raise RuntimeError(f"job store {self.path} is not open")
        return self._writer

    def _committed(self, entries: list[tuple[str, int, str, str, float | None]], ok: bool) -> None:
        """After the transaction holding these results: the result log has them (if
        that transaction committed)."""
        if ok:
            self.log.commit_many(entries)

    async def query(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` on the reader connection in a worker thread (committed rows only)."""
        async with self._reading:  # one thread on the reader connection at a time
            if self._reader is None:
                raise RuntimeError(f"job store {self.path} is not open")
            return await asyncio.to_thread(fn, self._reader)

    def _drop_done(self, job_id: str) -> bool:
        record = self._done.pop(job_id, None)
        if record is None:
            return False
        if record[4] is not None:
            self._cache_bytes -= len(record[4])
        return True

    def _evict(self) -> None:
        """Drop the oldest documents from memory until the rest fit in ``cache_limit``
        (their rows have them; a document still in the write queue is read back once
        committed, see ``results``)."""
        cached, done = self._cached, self._done
        while self._cache_bytes > self.cache_limit and cached:
            deadline, job_id = cached.popleft()
            record = done.get(job_id)
            if record is not None and record[1] == deadline and record[4] is not None:
                self._cache_bytes -= len(record[4])
                done[job_id] = (*record[:4], None, record[5])


def _read_results(conn: sqlite3.Connection, job_ids: list[str]) -> dict[str, bytes]:
    """Stored result documents of ``job_ids`` (those that have one), in chunks of 500."""
    found: dict[str, bytes] = {}
    for i in range(0, len(job_ids), 500):
        chunk = job_ids[i : i + 500]
        marks = ",".join("?" * len(chunk))
        sql = f"SELECT id, result FROM jobs WHERE id IN ({marks}) AND result IS NOT NULL"
        found.update((job_id, bytes(body)) for job_id, body in conn.execute(sql, chunk))
    return found


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
