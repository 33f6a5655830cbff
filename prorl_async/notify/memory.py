"""An outbox in memory, for the memory job store (nothing survives a restart there)."""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Any, cast

from prorl_async.notify.breaker import host_of
from prorl_async.notify.sender import RESULT_GONE, Delivery
from prorl_async.schemas import CallbackInfo

__all__ = ["MemoryOutbox"]


@dataclass(slots=True)
class _Row:
    url: str
    created_at: float
    state: str = "pending"
    attempts: int = 0
    next_at: float = 0.0
    last_error: str | None = None


class MemoryOutbox:
    """Deliveries by job id; pending ones in a heap by due time (stale entries skipped)."""

    def __init__(self, results: Callable[[list[str]], Awaitable[dict[str, bytes]]]) -> None:
        self.waker: Callable[[], None] | None = None
        self._results = results
        self._rows: dict[str, _Row] = {}
        self._due: list[tuple[float, str]] = []
        self._counts: Counter[str] = Counter()

    def add(self, job_id: str, url: str, now: float) -> None:
        """A job with a callback_url ended: deliver its result document."""
        old = self._rows.get(job_id)
        if old is not None:
            self._counts[old.state] -= 1
        self._rows[job_id] = _Row(url, created_at=now, next_at=now)
        self._counts["pending"] += 1
        heapq.heappush(self._due, (now, job_id))
        if self.waker is not None:
            self.waker()

    def forget(self, job_id: str) -> None:
        """The job's record is gone (deleted, expired): so is its delivery, unless pending
        (the sender then finds no result and records the failure)."""
        row = self._rows.get(job_id)
        if row is not None and row.state != "pending":
            del self._rows[job_id]
            self._counts[row.state] -= 1

    async def due(
        self, now: float, limit: int, skip: Collection[str]
    ) -> tuple[list[Delivery], float | None]:
        out: list[Delivery] = []
        while self._due and len(out) < limit:
            at, job_id = self._due[0]
            row = self._rows.get(job_id)
            if row is None or row.state != "pending" or row.next_at != at or job_id in skip:
                heapq.heappop(self._due)  # superseded (a newer entry exists) or settled
                continue
            if at > now:
                break
            heapq.heappop(self._due)
            out.append(Delivery(job_id, row.url, row.attempts, row.created_at))
        return out, (self._due[0][0] if self._due else None)

    def retime(self, host: str, at: float) -> None:
        for job_id, row in self._rows.items():
            if row.state == "pending" and host_of(row.url) == host:
                row.next_at = at
                heapq.heappush(self._due, (at, job_id))
        if self.waker is not None:
            self.waker()

    async def body(self, job_id: str) -> bytes | None:
        return (await self._results([job_id])).get(job_id)

    def settle(
        self, job_id: str, *, state: str, attempts: int, next_at: float, error: str | None
    ) -> None:
        row = self._rows.get(job_id)
        if row is None:
            return
        self._counts[row.state] -= 1
        if state == "failed" and error == RESULT_GONE:
            del self._rows[job_id]
            return
        self._counts[state] += 1
        row.state, row.attempts, row.next_at, row.last_error = state, attempts, next_at, error
        if state == "pending":
            heapq.heappush(self._due, (next_at, job_id))
        if self.waker is not None:
            self.waker()

    async def info(self, job_id: str) -> CallbackInfo | None:
        row = self._rows.get(job_id)
        if row is None:
            return None
        return CallbackInfo(
            job_id=job_id,
            url=row.url,
            state=cast(Any, row.state),
            attempts=row.attempts,
            last_error=row.last_error,
            next_attempt_at=row.next_at if row.state == "pending" else None,
        )

    def counts(self) -> dict[str, int]:
        return {"pending": self._counts["pending"]}
