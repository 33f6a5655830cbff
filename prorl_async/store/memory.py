"""The in-memory job store: everything in this process, nothing survives a restart.

For tests and benchmarks (``--store memory``); the default is the SQLite store.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Sequence

from prorl_async.core.job import Job
from prorl_async.core.jobstore import StoreStats, StoreUnavailable, UnfinishedRecord
from prorl_async.core.resultlog import ResultLog
from prorl_async.notify.memory import MemoryOutbox
from prorl_async.store._tombstones import Tombstones

__all__ = ["MemoryJobStore"]


class MemoryJobStore:
    """In memory: live jobs, terminal results for ``retention_s``, cancelled-id tombstones."""

    kind = "memory"

    def __init__(self, *, retention_s: float, tombstone_s: float) -> None:
        self.retention_s = retention_s
        self.tombstone_s = tombstone_s
        self._jobs: dict[str, Job] = {}
        self._live: dict[str, Job] = {}
        # Retention is one constant, so expiry order is finish order: a deque suffices.
        self._expiry: deque[tuple[float, str]] = deque()
        self._tombstones = Tombstones()
        self._counts: Counter[str] = Counter()
        self._held = 0  # bytes of result documents kept
        self.log = ResultLog()
        self.outbox = MemoryOutbox(self.results)

    def open(self) -> list[UnfinishedRecord]:
        return []

    def get(self, job_id: str) -> Job | None:
        return self._jobs.get(job_id)

    def status(self, job_id: str) -> str | None:
        job = self._jobs.get(job_id)
        return None if job is None else job.status

    def tenant_of(self, job_id: str) -> str | None:
        job = self._jobs.get(job_id)
        return None if job is None else job.tenant

    def seq_of(self, job_id: str) -> int | None:
        job = self._jobs.get(job_id)
        return None if job is None else job.seq

    async def results(self, job_ids: Sequence[str], *, partial: bool = False) -> dict[str, bytes]:
        found = {}
        for job_id in job_ids:
            job = self._jobs.get(job_id)
            if job is not None and job.result is not None:
                found[job_id] = job.result
        return found

    def add(self, job: Job) -> None:
        self._jobs[job.id] = job
        self._live[job.id] = job

    def finished(self, job: Job) -> None:
        self._live.pop(job.id, None)
        self._counts[job.status] += 1
        self._held += len(job.result or b"")
        self._expiry.append((time.monotonic() + self.retention_s, job.id))
        if job.seq is not None:
            self.log.commit(job.tenant, job.seq, job.id, job.status, job.reward)
        if job.callback_url is not None:
            self.outbox.add(job.id, job.callback_url, time.time())
        if job.status == "cancelled":
            self.tombstone(job.id)

    def delete(self, job_id: str) -> bool:
        self._live.pop(job_id, None)
        job = self._jobs.pop(job_id, None)
        if job is not None and job.result is not None:
            self._held -= len(job.result)
        self.outbox.forget(job_id)
        return job is not None

    def tombstone(self, job_id: str) -> None:
        self._tombstones.add(job_id, time.monotonic() + self.tombstone_s)

    def is_tombstoned(self, job_id: str) -> bool:
        return job_id in self._tombstones

    def unfinished(self) -> list[Job]:
        return list(self._live.values())

    def unfinished_count(self) -> int:
        return len(self._live)

    def __len__(self) -> int:
        return len(self._jobs)

    def expire(self, now: float | None = None, limit: int | None = None) -> int:
        """Drop results older than the retention time (at most ``limit``); returns how
        many were dropped."""
        now = time.monotonic() if now is None else now
        dropped = 0
        while self._expiry and self._expiry[0][0] <= now and dropped != limit:
            _, job_id = self._expiry.popleft()
            job = self._jobs.get(job_id)
            # A deleted-then-resubmitted id may be live again: only drop terminal records.
            if job is not None and job.terminal and job.finished_at + self.retention_s <= now:
                del self._jobs[job_id]
                self._held -= len(job.result or b"")
                self.outbox.forget(job_id)
                if job.seq is not None:
                    self.log.expire(job.tenant, job.seq)
                dropped += 1
        self._tombstones.expire(now)
        return dropped

    def counts(self) -> dict[str, int]:
        return {s: self._counts[s] for s in ("done", "failed", "cancelled", "timed_out")}

    def stats(self) -> StoreStats:
        return StoreStats(
            kind=self.kind, rows=len(self._jobs), bytes=self._held, cache_bytes=self._held
        )

    def freeze(self) -> None:
        """Nothing is persisted, so there is nothing to keep unchanged at shutdown."""

    def flush(self) -> None:
        """Nothing is written."""

    async def sync(self) -> None:
        """Nothing to make durable."""

    def problem(self) -> StoreUnavailable | None:
        """Never: nothing is written."""
        return None

    async def check(self) -> None:
        """Nothing to watch."""

    async def committing(self, timeout: float) -> None:
        """Every result is served at once: nothing to wait for."""

    async def aclose(self) -> None:
        """Nothing to close."""
