"""The result log: every terminal job by ``seq``, in order, per tenant (API.md "Results").

A job's ``seq`` is assigned when it ends (``assign``, strictly increasing) and the job
enters the log only once its result is durable: the SQLite store calls ``commit`` when
the transaction holding the result and the seq has committed. So a reader never sees
a result a crash could take back, and after a restart the numbering goes on from the
last committed seq: a reader resuming from its cursor sees no gap and no duplicate.
Readers page through it by cursor (``after``) and wait for it to grow (``wait``);
entries past retention are trimmed and a cursor before them is told so (``floor``).
An entry costs 17 bytes in arrays plus a reference to the job id.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from array import array
from bisect import bisect_left, bisect_right
from typing import NamedTuple

__all__ = ["LogEntry", "ResultLog"]

_STATUSES = ("done", "failed", "cancelled", "timed_out")
_CODE = {s: i for i, s in enumerate(_STATUSES)}


class LogEntry(NamedTuple):
    """One log entry: what ``/events`` sends for a terminal job."""

    seq: int
    job_id: str
    status: str
    reward: float | None


class _Log:
    """One tenant's entries, oldest first; ``start`` skips the trimmed head."""

    __slots__ = ("seqs", "ids", "codes", "rewards", "start", "floor", "event", "waiting")

    def __init__(self) -> None:
        self.seqs = array("q")
        self.ids: list[str] = []
        self.codes = bytearray()
        self.rewards = array("d")
        self.start = 0
        self.floor = 0  # the highest seq trimmed by retention
        self.event = asyncio.Event()
        self.waiting = 0

    def append(self, seq: int, job_id: str, status: str, reward: float | None) -> None:
        code, value = _CODE.get(status, 1), math.nan if reward is None else reward
        seqs = self.seqs
        if not seqs or seq > seqs[-1]:  # the common case: commits come in seq order
            seqs.append(seq)
            self.ids.append(job_id)
            self.codes.append(code)
            self.rewards.append(value)
            return
        at = bisect_right(seqs, seq, self.start)  # out of order: kept correct anyway
        seqs.insert(at, seq)
        self.ids.insert(at, job_id)
        self.codes.insert(at, code)
        self.rewards.insert(at, value)

    def has_after(self, cursor: int) -> bool:
        return len(self.seqs) > self.start and self.seqs[-1] > cursor

    def after(self, cursor: int, limit: int) -> list[LogEntry]:
        i = bisect_right(self.seqs, cursor, self.start)
        end = min(i + limit, len(self.seqs))
        return [
            LogEntry(self.seqs[k], self.ids[k], _STATUSES[self.codes[k]], _reward(self.rewards[k]))
            for k in range(i, end)
        ]

    def before(self, cursor: int | None, limit: int) -> list[LogEntry]:
        end = len(self.seqs) if cursor is None else bisect_left(self.seqs, cursor, self.start)
        first = max(self.start, end - limit)
        return [
            LogEntry(self.seqs[k], self.ids[k], _STATUSES[self.codes[k]], _reward(self.rewards[k]))
            for k in range(end - 1, first - 1, -1)
        ]

    def trim(self, floor: int) -> None:
        self.floor = max(self.floor, floor)
        n = bisect_right(self.seqs, self.floor, self.start)
        self.start = n
        if n > 4096 and 2 * n > len(self.seqs):
            del self.seqs[:n], self.ids[:n], self.codes[:n], self.rewards[:n]
            self.start = 0

    def held(self) -> int:
        return len(self.seqs) - self.start


def _reward(value: float) -> float | None:
    return None if math.isnan(value) else value


class ResultLog:
    """Seq assignment, the committed entries of every tenant, and waiting for new ones."""

    def __init__(self) -> None:
        self.assigned = 0  # the last seq handed out
        self.committed = 0  # the highest seq committed
        # Names this numbering: a store that forgets its log (memory) starts a new epoch.
        self.epoch = uuid.uuid4().hex[:16]
        self.closed = False
        self._logs: dict[str, _Log] = {}
        self._notify: set[str] = set()
        # /events streams open now, and those cut for not reading.
        self.streams = 0
        self.streams_dropped = 0

    def restore(self, *, last_seq: int, epoch: str | None) -> None:
        """At open: continue the numbering of an earlier process."""
        self.assigned = self.committed = max(self.assigned, last_seq)
        if epoch:
            self.epoch = epoch

    def assign(self) -> int:
        """The seq of a job ending now."""
        self.assigned += 1
        return self.assigned

    def load(self, tenant: str, seq: int, job_id: str, status: str, reward: float | None) -> None:
        """An entry read back at open (in seq order); wakes nobody."""
        self._log(tenant).append(seq, job_id, status, reward)
        self.committed = max(self.committed, seq)
        self.assigned = max(self.assigned, seq)

    def commit(self, tenant: str, seq: int, job_id: str, status: str, reward: float | None) -> None:
        """A job's result (with its seq) is durable: readers may see it now."""
        log = self._log(tenant)
        log.append(seq, job_id, status, reward)
        self.committed = max(self.committed, seq)
        self._wake_soon(tenant, log)

    def commit_many(self, entries: list[tuple[str, int, str, str, float | None]]) -> None:
        """``commit`` for each of ``entries`` ``(tenant, seq, job_id, status, reward)``,
        with one wake-up per tenant (a transaction's results, say)."""
        logs: dict[str, _Log] = {}
        top = self.committed
        for tenant, seq, job_id, status, reward in entries:
            log = logs.get(tenant)
            if log is None:
                log = logs[tenant] = self._log(tenant)
            log.append(seq, job_id, status, reward)
            if seq > top:
                top = seq
        self.committed = top
        for tenant, log in logs.items():
            self._wake_soon(tenant, log)

    def _wake_soon(self, tenant: str, log: _Log) -> None:
        """Wake ``tenant``'s waiting readers at the next loop iteration: one wake-up per
        tenant per iteration, however many entries were committed."""
        if log.waiting and tenant not in self._notify:
            self._notify.add(tenant)
            asyncio.get_running_loop().call_soon(self._wake, tenant)

    def _wake(self, tenant: str) -> None:
        self._notify.discard(tenant)
        log = self._log(tenant)
        log.event.set()
        log.event = asyncio.Event()

    def expire(self, tenant: str, seq: int) -> None:
        """Retention dropped the result of ``seq``: entries up to it leave the log."""
        self._log(tenant).trim(seq)

    def _log(self, tenant: str) -> _Log:
        log = self._logs.get(tenant)
        if log is None:
            log = self._logs[tenant] = _Log()
        return log

    # -- readers ---------------------------------------------------------------------------

    def after(self, tenant: str, cursor: int, limit: int) -> list[LogEntry]:
        """Up to ``limit`` entries of ``tenant`` with seq > ``cursor``, in seq order."""
        log = self._logs.get(tenant)
        return [] if log is None else log.after(cursor, limit)

    def before(self, tenant: str, cursor: int | None, limit: int) -> list[LogEntry]:
        """Up to ``limit`` entries of ``tenant`` with seq < ``cursor`` (None: the newest),
        newest first: the pages of a reader going back in time (the UI)."""
        log = self._logs.get(tenant)
        return [] if log is None else log.before(cursor, limit)

    def tenants(self) -> list[str]:
        """Every tenant the log has held an entry for."""
        return list(self._logs)

    def last(self, tenant: str) -> int:
        """The tenant's highest committed seq (0 if none): the cursor of "from now on"."""
        log = self._logs.get(tenant)
        if log is None:
            return 0
        return log.seqs[-1] if log.held() else log.floor

    def floor(self, tenant: str) -> int:
        """The highest seq of ``tenant`` dropped by retention: a cursor below it missed some."""
        log = self._logs.get(tenant)
        return 0 if log is None else log.floor

    def oldest(self, tenant: str) -> int:
        """The oldest seq still held for ``tenant`` (one past the last if none is)."""
        log = self._logs.get(tenant)
        if log is None:
            return 1
        return log.seqs[log.start] if log.held() else self.last(tenant) + 1

    def held(self, tenant: str) -> int:
        log = self._logs.get(tenant)
        return 0 if log is None else log.held()

    def waiters(self, tenant: str) -> int:
        """Readers of ``tenant`` waiting for an entry now."""
        log = self._logs.get(tenant)
        return 0 if log is None else log.waiting

    async def wait(self, tenant: str, cursor: int, timeout: float) -> None:
        """Return when ``tenant`` has an entry after ``cursor``, ``timeout`` passed, or the
        log closed (server shutdown)."""
        log = self._log(tenant)
        log.waiting += 1
        try:
            async with asyncio.timeout(timeout):
                while not self.closed and not log.has_after(cursor):
                    await log.event.wait()
        except TimeoutError:
            pass
        finally:
            log.waiting -= 1

    def close(self) -> None:
        """Shutdown: every waiter returns now, and ``wait`` no longer waits."""
        self.closed = True
        for log in self._logs.values():
            log.event.set()
