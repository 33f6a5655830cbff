"""The job store's writer process: it owns the write connection and commits what the
server's loop hands it. Standard library only: it runs as a script (``python -I -S
_commit.py DB``), so it starts in tens of milliseconds and imports nothing of ours.

Why a process and not a thread: the ``sqlite3`` module gives up the interpreter lock
around every SQLite call and must take it back from a busy event loop each time, which
stalled the loop at every hand-back (measured: the loop spent ~0.08 ms more per job
with the durable store than with the memory store, most of it in those stalls).

The pipe protocol, both ways frames of a 4-byte little-endian length and a ``marshal``
body (trusted: only the server writes the pipe):

- server -> writer: first the row kinds ``[(sql, key, head, row, tail) | (sql, key)]``,
  then one frame per batch, ``(number, statements, last)``, ``statements`` a list of
  ``(sql, params)`` run in order (rows of a kind gathered, see ``execute``; ``params``
  a list of tuples: ``sql`` once per tuple), ``last`` a list of ``(key, sql, params)``:
  per key, the latest is run once after them.
- writer -> server: ``(number, error)`` after each commit: every batch up to ``number``
  is committed (``error`` None) or was rolled back (``error`` the reason); ``(-1,
  error)`` if the writer itself fails (it cannot open the file, say) and exits; ``(-2,
  error)`` when a commit failed for want of storage (see below).

The writer takes every batch that has arrived, commits them in one transaction (one
fsync), answers, and repeats; at end of input it commits what arrived and exits.

A commit that fails because the storage does (the disk or quota is full, an I/O error:
SQLite's FULL, IOERR and CANTOPEN, or the same ``OSError``) is not a wrong statement: the
writer keeps those batches, says ``(-2, error)`` once, and tries the whole of what it
holds again every ``_RETRY_S`` (taking in the batches that arrive meanwhile) until a
commit goes through, which it answers as usual. Nothing handed to it is dropped while it
runs; if its input ends first it tries once more and exits, and what it could not commit
was never acknowledged (a job's row then stays unfinished and is requeued at restart).

Checkpoints (copying the WAL into the database file) run in a thread of the writer with a
connection of its own, never inside a commit: SQLite's automatic checkpoint runs in the
COMMIT that takes the WAL past its threshold, and the clients waiting on that commit
waited for the copy and its fsyncs too (measured: ~25 ms, against ~6 ms for the median
commit, once every ~20 commits under load).
"""

from __future__ import annotations

import errno
import marshal
import os
import select
import signal
import sqlite3
import struct
import sys
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

__all__ = [
    "FAILED",
    "STATEMENT_CACHE",
    "STORAGE",
    "RowKind",
    "checkpoint",
    "connect",
    "execute",
    "frame",
    "frames",
    "storage_failed",
]

Statement = tuple[str, tuple[Any, ...] | list[tuple[Any, ...]]]
# A batch as the writer takes it: (number, statements, last).
_Taken = tuple[int, list[Statement], list[tuple[str, str, tuple[Any, ...]]]]
_LEN = struct.Struct("<I")
# Rows per multi-row statement at most: 256 rows of 6 parameters stay far below SQLite's
# limit of 32,766 (999 before 3.32, where only DELETE ... IN has a multi-row form).
_MAX_ROWS = 256
# Each kind prepares one statement per row count: room for all of them in the
# connection's statement cache, so none is parsed twice.
STATEMENT_CACHE = 5 * _MAX_ROWS
# Rows changed between two checkpoints: ~1,000 WAL pages of job rows (SQLite's automatic
# threshold). A WAL that no checkpoint could empty (commits never paused while one ran)
# and holds this many pages is checkpointed by the writer itself, between two commits:
# under steady writes (a retention-bound run) the WAL then restarts every ~16 MB. A bench
# burst peaks at ~3,000 pages and never reaches it.
_CHECKPOINT_ROWS = 4000
_WAL_CAP_PAGES = 4096
# A WAL file longer than this is truncated to it when the WAL restarts (bytes).
_WAL_LIMIT_BYTES = 16 << 20
# Seconds between two tries of a commit the storage refused (see the module doc).
_RETRY_S = 0.5
# SQLite's primary result codes of a storage that fails (not of a wrong statement).
_STORAGE_CODES = frozenset({10, 13, 14})  # SQLITE_IOERR, SQLITE_FULL, SQLITE_CANTOPEN
_STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS})
# The frame numbers that are not a commit's answer.
FAILED, STORAGE = -1, -2


class RowKind:
    """A one-row statement that may be written for many rows at once: ``sql`` is what
    ``Writer.write`` is given, ``key`` the index of the row's id in its parameters, and
    ``head + ", ".join([row] * n) + tail`` the same for ``n`` rows (their parameters one
    after the other), if given. Rows of one kind for distinct ids commute."""

    def __init__(self, sql: str, key: int, many: tuple[str, str, str] | None = None) -> None:
        self.sql = sql
        self.key = key
        self.template = many
        self._many: dict[int, str] = {}

    def spec(self) -> tuple[Any, ...]:
        return (self.sql, self.key) + (self.template or ())

    @classmethod
    def from_spec(cls, spec: tuple[Any, ...]) -> RowKind:
        sql, key, *many = spec
        return cls(sql, key, (many[0], many[1], many[2]) if many else None)

    def many(self, n: int) -> str | None:
        if self.template is None or not 1 < n <= _MAX_ROWS:
            return None
        sql = self._many.get(n)
        if sql is None:
            head, row, tail = self.template
            sql = self._many[n] = head + ", ".join([row] * n) + tail
        return sql


def connect(path: str | Path) -> sqlite3.Connection:
    """A connection to the job database, as both the reader and the writer open it."""
    conn = sqlite3.connect(path, check_same_thread=False, cached_statements=STATEMENT_CACHE)
    conn.execute("PRAGMA journal_mode=WAL")
    # FULL: a commit is on disk before the client is answered (group commit pays for it).
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA busy_timeout=5000")
    # Keep the WAL from staying large after a burst; freed pages are reused, so the
    # file stops growing once retention deletes as fast as jobs arrive.
    conn.execute(f"PRAGMA journal_size_limit={_WAL_LIMIT_BYTES}")
    return conn


def execute(
    conn: sqlite3.Connection, kinds: dict[str, RowKind], statements: list[Statement]
) -> None:
    """Run ``statements`` as if one by one in order, with as few statements as can be.

    The rows of each kind since the last barrier (any statement not of a kind) are
    written together, kinds in their given order, by one statement of exactly that many
    rows. A row may join its kind's rows only if its id has no row of the same or a
    later kind pending (those would run before it); else what is pending goes first.
    """
    order = {kind: i for i, kind in enumerate(kinds.values())}
    pending: dict[RowKind, list[tuple[Any, ...]]] = {}
    seen: dict[Any, int] = {}  # id -> the latest kind (its position) it has a row of
    for sql, params in statements:
        kind = kinds.get(sql)
        if kind is None:  # a barrier
            if pending:
                _flush(conn, order, pending)
                pending, seen = {}, {}
            if isinstance(params, list):
                conn.executemany(sql, params)
            else:
                conn.execute(sql, params)
            continue
        at = order[kind]
        for row in params if isinstance(params, list) else [params]:
            key = row[kind.key]
            if seen.get(key, -1) >= at:
                _flush(conn, order, pending)
                pending, seen = {}, {}
            seen[key] = at
            rows = pending.get(kind)
            if rows is None:
                rows = pending[kind] = []
            rows.append(row)
    if pending:
        _flush(conn, order, pending)


def _flush(
    conn: sqlite3.Connection,
    order: dict[RowKind, int],
    pending: dict[RowKind, list[tuple[Any, ...]]],
) -> None:
    for kind in sorted(pending, key=order.__getitem__):
        rows = pending[kind]
        if kind.template is None:  # no multi-row form: one executemany for the run
            conn.executemany(kind.sql, rows)
            continue
        for at in range(0, len(rows), _MAX_ROWS):
            chunk = rows[at : at + _MAX_ROWS]
            sql = kind.many(len(chunk))
            if sql is None:
                conn.execute(kind.sql, chunk[0])
            else:
                conn.execute(sql, [v for row in chunk for v in row])


def frame(obj: Any) -> bytes:
    body = marshal.dumps(obj)
    return _LEN.pack(len(body)) + body


def frames(buf: bytearray) -> Iterator[Any]:
    """Complete frames at the start of ``buf``, removed from it as they are read."""
    at = 0
    while len(buf) - at >= 4:
        (n,) = _LEN.unpack_from(buf, at)
        if len(buf) - at - 4 < n:
            break
        yield marshal.loads(buf[at + 4 : at + 4 + n])
        at += 4 + n
    del buf[:at]


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def checkpoint(conn: sqlite3.Connection) -> int:
    """A PASSIVE checkpoint (commits go on meanwhile); returns the WAL's length in pages."""
    pages: int = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1]
    return pages


class _Checkpointer:
    """A thread that checkpoints the WAL (PASSIVE: commits go on meanwhile) when asked."""

    def __init__(self, path: str) -> None:
        self._conn = connect(path)
        self._asked = threading.Event()
        self._closing = False
        self._changes = 0  # the writer's total_changes when a checkpoint was last due
        self.wal_pages = 0  # the WAL's length the last checkpoint found (pages)
        self._thread = threading.Thread(target=self._run, name="checkpoint", daemon=True)
        self._thread.start()

    def committed(self, conn: sqlite3.Connection) -> None:
        """After a commit on the writer's ``conn``: a checkpoint in the thread once enough
        rows changed, or at once on ``conn`` if the WAL grew past the cap regardless."""
        if conn.total_changes - self._changes < _CHECKPOINT_ROWS:
            return
        self._changes = conn.total_changes
        if self.wal_pages >= _WAL_CAP_PAGES:  # commits left no pause to empty it in
            self.wal_pages = checkpoint(conn)
        else:
            self._asked.set()

    def _run(self) -> None:
        while True:
            self._asked.wait()
            self._asked.clear()
            if self._closing:
                return
            try:
                self.wal_pages = checkpoint(self._conn)
            except sqlite3.Error:
                pass  # the file itself is failing: the next commit says so to the server

    def close(self) -> None:
        self._closing = True
        self._asked.set()
        self._thread.join()
        self._conn.close()


def serve(path: str) -> None:
    """The writer's loop: until end of its input (fd 0), commit every batch that has
    arrived and answer on fd 1."""
    conn = connect(path)
    conn.execute("PRAGMA wal_autocheckpoint=0")  # the checkpointer's, not a commit's
    checkpointer = _Checkpointer(path)
    # A multi-row statement that may stop halfway (INSERT OR REPLACE, UPDATE ... FROM)
    # keeps a statement journal to undo itself: in memory, not a temporary file made,
    # written and unlinked for each such statement (measured: 78 of them a 20,000-job
    # run, ~7% of the writer's writes). It only undoes a statement inside the open
    # transaction; what a commit puts on disk is unchanged.
    conn.execute("PRAGMA temp_store=MEMORY")
    buf = bytearray()
    view = memoryview(bytearray(1 << 20))  # one buffer for every read, not 1 MiB a read
    kinds: dict[str, RowKind] | None = None
    held: list[_Taken] = []  # batches the storage refused, tried again with the next ones
    refused = False  # the server was told the storage refused a commit
    try:
        while True:
            # While batches are held, wait for input at most until the next try.
            if held and not select.select([0], [], [], _RETRY_S)[0]:
                n = -1  # no input: only the retry
            else:
                n = os.readv(0, [view])  # what is in the pipe (blocks only while it is empty)
                buf += view[:n]
            taken = list(frames(buf)) if n > 0 else []
            if kinds is None and taken:
                kinds = {spec[0]: RowKind.from_spec(spec) for spec in taken.pop(0)}
            held += taken
            if held:
                assert kinds is not None
                number, error, storage = _commit(conn, kinds, held)
                if not storage:
                    held, refused = [], False
                    _write_all(1, frame((number, error)))
                    checkpointer.committed(conn)
                elif not refused:  # said once per fault, not at every try
                    refused = True
                    _write_all(1, frame((STORAGE, error)))
            if not n:
                return
    finally:
        checkpointer.close()
        conn.close()


def _commit(
    conn: sqlite3.Connection, kinds: dict[str, RowKind], taken: list[_Taken]
) -> tuple[int, str | None, bool]:
    """Commit ``taken`` in one transaction: (the last batch's number, the error or None,
    whether the error is the storage's: those batches are to be tried again)."""
    statements: list[Statement] = []
    last: dict[str, tuple[str, tuple[Any, ...]]] = {}
    for _, batch, batch_last in taken:
        statements += batch
        for key, sql, params in batch_last:
            last[key] = (sql, params)
    try:
        with conn:  # one transaction, one commit for every batch waiting
            execute(conn, kinds, statements)
            for sql, params in last.values():
                conn.execute(sql, params)
    except Exception as exc:  # any: the server must hear about every batch
        return taken[-1][0], f"{type(exc).__name__}: {exc}", storage_failed(exc)
    return taken[-1][0], None, False


def storage_failed(exc: BaseException) -> bool:
    """Whether ``exc`` says the storage failed (full, an I/O error), not the statement."""
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        return code is not None and code & 0xFF in _STORAGE_CODES
    return isinstance(exc, OSError) and exc.errno in _STORAGE_ERRNOS


def main() -> None:
    # It ends when its input does (the server closed it or died), after committing what
    # arrived: a Ctrl-C or a job scheduler's SIGTERM to the process group is the
    # server's to handle, which still has results to write while it shuts down.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    try:
        serve(sys.argv[1])
    except Exception as exc:  # its stderr is closed (see _writer.py): the server hears it here
        try:
            _write_all(1, frame((-1, f"{type(exc).__name__}: {exc}")))
        except OSError:
            pass
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
