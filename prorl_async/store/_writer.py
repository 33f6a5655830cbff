"""Group commit by a writer process, so the event loop never waits for SQLite or an fsync.

The loop appends statements to the current batch; at the end of the loop iteration (or
earlier, at a ``cut`` once it is large) the batch is sent down a pipe to the writer
process (``_commit.py``), which commits every batch that has arrived in one transaction
(one fsync) and answers with the number of the last one. The loop then resolves each
batch's waiters and runs the callbacks registered for after its commit. ``sync()`` waits
for the batch holding every statement issued so far: an HTTP answer sent after it is
backed by the disk.

A process, not a thread: see ``_commit.py`` (the ``sqlite3`` module's hand-backs of the
interpreter lock stalled the loop). The process belongs to the ``Writer``: ``aclose``
commits what is queued and reaps it; if the server dies, the writer reads the end of
its input, commits the batches that arrived whole, and exits. If the writer dies, every
batch not yet answered and every later write fail with ``StoreWriteError``: nothing
waits for an answer that cannot come, and ``on_lost`` is told (the server stops: a
restart requeues what was not committed).

Faults with bounded answers (``problem``): the storage refused a commit (the writer
holds those batches and tries again until it goes through: ``refused``), or the oldest
batch handed over has had no answer for ``commit_timeout_s`` (the process is stopped or
stuck in the file system). ``sync`` then raises ``StoreUnavailable`` at once, and a
``sync`` under way when a fault is reported returns with it, or after
``commit_timeout_s`` at most: its statements stay queued and are committed once the
writer can, but nobody waits for that.
"""

from __future__ import annotations

import asyncio
import fcntl
import functools
import logging
import os
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from prorl_async.core.jobstore import StoreUnavailable
from prorl_async.store import _commit
from prorl_async.store._commit import FAILED, STORAGE, RowKind, frame, frames

__all__ = ["StoreWriteError", "Writer"]

log = logging.getLogger(__name__)

Statement = tuple[str, tuple[Any, ...] | list[tuple[Any, ...]]]
# The pipe's size (Linux's default unprivileged maximum, /proc/sys/fs/pipe-max-size).
_PIPE_BYTES = 1 << 20
# How long ``aclose`` waits for the writer to commit what is queued and exit.
_CLOSE_S = 60.0


class StoreWriteError(RuntimeError):
    """A commit failed, or the writer process is gone; the message says which."""


class _Batch:
    __slots__ = (
        "statements",
        "waiters",
        "after",
        "gathered",
        "done",
        "error",
        "number",
        "sent_at",
    )

    def __init__(self) -> None:
        self.statements: list[Statement] = []
        # One future per ``sync`` caller: a caller that goes away cancels only its own.
        self.waiters: list[asyncio.Future[None]] = []
        self.done = False
        self.error: BaseException | None = None
        # (callback, always): called on the loop after the commit (always: even if it failed)
        self.after: list[tuple[Callable[[bool], None], bool]] = []
        self.gathered: dict[str, list[Any]] = {}  # Writer.gather's lists, by key
        self.number = 0
        self.sent_at = 0.0  # loop time when handed to the writer


class Writer:
    """Owns the writer process; ``aclose`` commits what is queued and reaps it."""

    def __init__(
        self,
        path: str | Path,
        loop: asyncio.AbstractEventLoop,
        kinds: Sequence[RowKind] = (),
        *,
        commit_timeout_s: float = 30.0,
        on_lost: Callable[[str], None] | None = None,
    ) -> None:
        self._loop = loop
        self.commit_timeout_s = commit_timeout_s
        self.on_lost = on_lost
        # The storage's error while the writer holds batches it could not commit.
        self.refused: str | None = None
        # Commits the storage refused (once per fault) or that failed, and a writer lost.
        self.errors = 0
        self._answer_waiters: list[asyncio.Future[None]] = []  # see ``next_answer``
        self._batch: _Batch | None = None
        self._last: dict[str, Statement] = {}
        self._sent: deque[_Batch] = deque()  # sent, not yet answered, in order
        self._handed: _Batch | None = None  # the last batch sent
        # The number the open batch (or the next one) gets: what is written now is in it.
        self.next_batch = 1
        # Every batch up to this number has its answer: committed, or failed.
        self.settled = 0
        self._closed = False
        self._broken: StoreWriteError | None = None
        self._out = bytearray()  # not yet taken by the pipe
        self._in = bytearray()
        self._drained: asyncio.Future[None] | None = None  # set once _out is empty
        self._eof: asyncio.Future[None] = loop.create_future()
        script = Path(_commit.__file__)
        # -I -S: no site-packages, no environment: standard library only, a fast start.
        self._proc = subprocess.Popen(
            [sys.executable, "-I", "-S", str(script), str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            # Not the server's stderr: after a kill -9 of the server the writer lives on
            # for its last commit, and whoever reads the server's stderr would wait for
            # it too. Its own failure comes back over the pipe.
            stderr=subprocess.DEVNULL,
        )
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._wfd, self._rfd = self._proc.stdin.fileno(), self._proc.stdout.fileno()
        _widen(self._wfd)
        os.set_blocking(self._wfd, False)
        os.set_blocking(self._rfd, False)
        loop.add_reader(self._rfd, self._readable)
        self._send(frame([kind.spec() for kind in kinds]))

    @property
    def pid(self) -> int:
        return self._proc.pid

    def _current(self) -> _Batch:
        if self._closed:
            raise RuntimeError("job store is closed")
        if self._broken is not None:
            raise self._broken
        batch = self._batch
        if batch is None:
            batch = self._batch = _Batch()
            self._loop.call_soon(self._hand_over)
        return batch

    def write(self, sql: str, params: tuple[Any, ...]) -> None:
        """Queue one statement; it is committed with its batch."""
        # An open batch means neither closed nor broken (both take it away).
        (self._batch or self._current()).statements.append((sql, params))

    def write_rows(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        """Queue ``sql`` once per row of parameters, as one entry of the batch (a row
        kind's rows, say: the writer takes each as it takes a row written alone)."""
        (self._batch or self._current()).statements.append((sql, rows))

    def cut(self, size: int) -> None:
        """End the open batch here if it holds ``size`` statements or more: it goes to the
        writer now, not at the end of the loop step, so the writer commits it while the
        loop goes on with the rest of the step. Call it only where what comes before and
        what comes after may be committed apart (they may be in two transactions)."""
        batch = self._batch
        if batch is not None and len(batch.statements) >= size:
            self._hand_over()

    def write_last(self, key: str, sql: str, params: tuple[Any, ...]) -> None:
        """Queue a statement run once per transaction, after the others, with the
        parameters of the latest call for ``key`` (an upsert of a high-water mark)."""
        self._batch or self._current()  # the batch it is run with
        self._last[key] = (sql, params)

    def after_commit(self, callback: Callable[[bool], None], *, always: bool = False) -> None:
        """Call ``callback(committed)`` on the loop once everything queued so far is
        committed (``always``: also, with False, if that commit failed)."""
        self._current().after.append((callback, always))

    def gather(self, key: str, callback: Callable[[list[Any], bool], None]) -> list[Any]:
        """A list kept with the open batch, handed to ``callback(items, committed)`` once
        after its commit (also if it failed): one callback per batch for many items, in
        place of one ``after_commit`` each. ``key`` tells the lists of a batch apart."""
        batch = self._batch or self._current()
        items = batch.gathered.get(key)
        if items is None:
            items = batch.gathered[key] = []
            batch.after.append((functools.partial(callback, items), True))
        return items

    async def sync(self) -> None:
        """Return once every statement queued so far is committed; raise if the commit
        failed, or ``StoreUnavailable`` if it cannot come now (see the module doc)."""
        batch = self._batch if self._batch is not None else self._handed
        if batch is None:
            return
        if not batch.done:
            fault = self.problem()
            if fault is not None:
                raise fault
            waiter = self._loop.create_future()
            batch.waiters.append(waiter)
            try:
                async with asyncio.timeout(self.commit_timeout_s):
                    await waiter  # woken by the commit, or by a fault reported
            except TimeoutError:
                pass
            finally:
                if not waiter.done():
                    batch.waiters.remove(waiter)
            if not batch.done:
                raise self.problem() or self._unavailable(
                    "writer", f"no commit in {self.commit_timeout_s:g} s (commit_timeout_s)"
                )
        if batch.error is not None:
            raise batch.error

    def problem(self) -> StoreUnavailable | None:
        """Why a commit cannot come now, or None: the writer is gone, the storage refuses
        it, or the oldest batch handed over has waited ``commit_timeout_s`` for it."""
        if self._broken is not None and not self._closed:
            return self._unavailable("writer", str(self._broken))
        if self.refused is not None:
            return self._unavailable("storage", self.refused)
        waited = self.waited()
        if waited >= self.commit_timeout_s:
            return self._unavailable(
                "writer",
                f"job store writer process {self._proc.pid} has not committed for "
                f"{waited:.0f} s (commit_timeout_s={self.commit_timeout_s:g})",
            )
        return None

    def waited(self) -> float:
        """Seconds the oldest batch handed over has waited for its answer (0: none waits)."""
        if not self._sent:
            return 0.0
        return self._loop.time() - self._sent[0].sent_at

    def ping(self) -> None:
        """Hand over an empty batch if none is waiting: a writer that no longer answers
        shows as one when nothing is being written, too."""
        if not self._sent and self._batch is None and not self._closed and not self._broken:
            self._current()

    async def next_answer(self, timeout: float) -> None:
        """Return at the writer's next answer to a commit, or after ``timeout`` seconds
        (for a long-poll waiting out a fault)."""
        waiter = self._loop.create_future()
        self._answer_waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout):
                await waiter
        except TimeoutError:
            pass
        finally:
            if not waiter.done():
                self._answer_waiters.remove(waiter)

    def _unavailable(self, cause: str, what: str) -> StoreUnavailable:
        return StoreUnavailable(cause, what, retry_after=5.0)

    async def aclose(self) -> None:
        """Commit what is queued, end the process. Idempotent."""
        if self._closed:
            return
        self._hand_over()
        self._closed = True
        await asyncio.shield(self._close())

    async def _close(self) -> None:
        try:
            async with asyncio.timeout(_CLOSE_S):
                if self._out and self._broken is None:  # the pipe takes it as the writer reads
                    self._drained = self._loop.create_future()
                    await self._drained
                self._stop_writing()
                await self._eof  # every answer read: it committed all and exited
        except TimeoutError:
            log.error("job store writer did not finish in %.0f s: killed", _CLOSE_S)
            self._proc.kill()
        finally:
            self._stop_writing()
            code = await asyncio.to_thread(self._proc.wait)
            self._stop_reading()
            self._fail(f"exited with code {code}")

    # -- the pipe ----------------------------------------------------------------------------

    def _hand_over(self) -> None:
        batch, self._batch = self._batch, None
        if batch is None or batch.done:
            return
        batch.number = self.next_batch
        batch.sent_at = self._loop.time()
        self.next_batch += 1
        self._handed = batch
        last, self._last = self._last, {}
        try:
            data = frame((batch.number, batch.statements, [(k, *s) for k, s in last.items()]))
        except ValueError as exc:  # a parameter marshal cannot carry: a bug, not a hang
            _resolve([batch], StoreWriteError(f"job store: a statement cannot be sent: {exc}"))
            return
        self._sent.append(batch)
        self._send(data)

    def _send(self, data: bytes) -> None:
        if self._broken is not None or self._wfd < 0:
            return
        if not self._out:
            try:
                n = os.write(self._wfd, data)
            except BlockingIOError:
                n = 0
            except OSError as exc:  # EPIPE: the writer is gone
                self._fail(f"is gone ({exc})")
                return
            if n == len(data):
                return
            data = data[n:]
            self._loop.add_writer(self._wfd, self._writable)
        self._out += data

    def _writable(self) -> None:
        try:
            n = os.write(self._wfd, self._out)
        except BlockingIOError:
            return
        except OSError as exc:
            self._fail(f"is gone ({exc})")
            return
        del self._out[:n]
        if not self._out:
            self._loop.remove_writer(self._wfd)
            self._wake_drained()

    def _wake_drained(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def _readable(self) -> None:
        error: OSError | None = None
        try:
            data = os.read(self._rfd, 1 << 16)
        except BlockingIOError:
            return
        except OSError as exc:
            data, error = b"", exc
        if not data:
            self._stop_reading()
            code = self._proc.poll()
            self._fail(f"exited (code {code})" if error is None else f"is gone ({error})")
            if not self._eof.done():
                self._eof.set_result(None)
            return
        self._in += data
        for number, reason in frames(self._in):
            if number == STORAGE:  # it holds the batches and tries again
                self._refused(reason)
                continue
            if number == FAILED:  # the writer itself failed and exits
                self._fail(f"failed: {reason}")
                continue
            if self.refused is not None:
                log.warning("job store: commits go through again (held: %s)", self.refused)
                self.refused = None
            failed = None
            if reason is not None:
                failed = StoreWriteError(f"job store commit failed: {reason}")
                self.errors += 1
                log.error("%s", failed)
            done: list[_Batch] = []
            while self._sent and self._sent[0].number <= number:
                done.append(self._sent.popleft())
            self.settled = max(self.settled, number)
            _resolve(done, failed)
            waiters, self._answer_waiters = self._answer_waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def _refused(self, reason: str) -> None:
        """The storage refused a commit: the writer holds it; wake every ``sync`` under
        way (they answer with the fault; their statements stay queued)."""
        self.errors += 1
        self.refused = f"the storage refused a commit ({reason}); held and tried again"
        log.error("job store: %s", self.refused)
        for batch in (*self._sent, *([self._batch] if self._batch is not None else [])):
            waiters, batch.waiters = batch.waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def _fail(self, what: str) -> None:
        """The writer is gone: fail everything unanswered and every later write."""
        if self._broken is None:
            self._broken = StoreWriteError(f"job store writer process {self._proc.pid} {what}")
            if not self._closed:
                self.errors += 1
                log.error("%s", self._broken)
                if self.on_lost is not None:
                    self._loop.call_soon(self.on_lost, str(self._broken))
        self._stop_writing()
        self._out.clear()
        self._wake_drained()
        unanswered = list(self._sent)
        self._sent.clear()
        self.settled = self.next_batch  # none will be answered: each fails now
        if self._batch is not None:
            unanswered.append(self._batch)
            self._batch = None
        _resolve(unanswered, self._broken)

    def _stop_writing(self) -> None:
        if self._wfd >= 0:
            self._loop.remove_writer(self._wfd)
            assert self._proc.stdin is not None
            self._proc.stdin.close()  # the writer reads the end of its input
            self._wfd = -1

    def _stop_reading(self) -> None:
        if self._rfd >= 0:
            self._loop.remove_reader(self._rfd)
            assert self._proc.stdout is not None
            self._proc.stdout.close()
            self._rfd = -1


def _widen(fd: int) -> None:
    """Give the pipe to the writer room for many batches (64 KiB by default: two chunks
    of results). A batch that does not fit waits in ``_out`` for the loop's next poll
    for writability, one loop iteration later, and under load an iteration is several
    milliseconds: each batch queued behind a commit paid it, and its 202s waited."""
    size = getattr(fcntl, "F_SETPIPE_SZ", None)  # Linux only
    if size is None:
        return
    try:
        fcntl.fcntl(fd, size, _PIPE_BYTES)
    except OSError:  # over /proc/sys/fs/pipe-max-size, or the user's pipe quota: keep it
        pass


def _resolve(batches: list[_Batch], error: BaseException | None) -> None:
    for batch in batches:
        if batch.done:
            continue
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
