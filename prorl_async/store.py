"""Job records behind one small interface.

The pipeline talks only to ``JobStore``; ``MemoryJobStore`` keeps everything in
this process with bounded retention. A durable store implements the same methods.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from typing import Protocol

from prorl_async.job import Job

__all__ = ["JobStore", "MemoryJobStore"]


class JobStore(Protocol):
    def get(self, job_id: str) -> Job | None: ...
    def add(self, job: Job) -> None: ...
    def finished(self, job: Job) -> None: ...
    def delete(self, job_id: str) -> bool: ...
    def tombstone(self, job_id: str) -> None: ...
    def is_tombstoned(self, job_id: str) -> bool: ...
    def unfinished(self) -> list[Job]: ...
    def unfinished_count(self) -> int: ...
    def __len__(self) -> int: ...
    def expire(self, now: float | None = None) -> int: ...
    def counts(self) -> dict[str, int]: ...


class MemoryJobStore:
    """In memory: live jobs, terminal results for ``retention_s``, cancelled-id tombstones."""

    def __init__(self, *, retention_s: float, tombstone_s: float) -> None:
        self.retention_s = retention_s
        self.tombstone_s = tombstone_s
        self._jobs: dict[str, Job] = {}
        self._live: dict[str, Job] = {}
        # Retention is one constant, so expiry order is finish order: a deque suffices.
        self._expiry: deque[tuple[float, str]] = deque()
        self._tombstones: dict[str, float] = {}
        self._tomb_expiry: deque[tuple[float, str]] = deque()
        self._counts: Counter[str] = Counter()

    def get(self, job_id: str) -> Job | None:
        return self._jobs.get(job_id)

    def add(self, job: Job) -> None:
        self._jobs[job.id] = job
        self._live[job.id] = job

    def finished(self, job: Job) -> None:
        self._live.pop(job.id, None)
        self._counts[job.status] += 1
        self._expiry.append((time.monotonic() + self.retention_s, job.id))
        if job.status == "cancelled":
            self.tombstone(job.id)

    def delete(self, job_id: str) -> bool:
        self._live.pop(job_id, None)
        return self._jobs.pop(job_id, None) is not None

    def tombstone(self, job_id: str) -> None:
        deadline = time.monotonic() + self.tombstone_s
        self._tombstones[job_id] = deadline
        self._tomb_expiry.append((deadline, job_id))

    def is_tombstoned(self, job_id: str) -> bool:
        return job_id in self._tombstones

    def unfinished(self) -> list[Job]:
        return list(self._live.values())

    def unfinished_count(self) -> int:
        return len(self._live)

    def __len__(self) -> int:
        return len(self._jobs)

    def expire(self, now: float | None = None) -> int:
        """Drop results older than the retention time; returns how many were dropped."""
        now = time.monotonic() if now is None else now
        dropped = 0
        while self._expiry and self._expiry[0][0] <= now:
            _, job_id = self._expiry.popleft()
            job = self._jobs.get(job_id)
            # A deleted-then-resubmitted id may be live again: only drop terminal records.
            if job is not None and job.terminal and job.finished_at + self.retention_s <= now:
                del self._jobs[job_id]
                dropped += 1
        while self._tomb_expiry and self._tomb_expiry[0][0] <= now:
            deadline, job_id = self._tomb_expiry.popleft()
            if self._tombstones.get(job_id) == deadline:
                del self._tombstones[job_id]
        return dropped

    def counts(self) -> dict[str, int]:
        return {s: self._counts[s] for s in ("done", "failed", "cancelled", "timed_out")}
