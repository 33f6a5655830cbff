"""The one registry of what this manager has in flight: nothing is ever queued twice."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from prorl_async.trainer.group import Group

__all__ = ["GroupState", "Registry", "Sample"]


@dataclass(eq=False)
class GroupState:
    """A prompt whose ``n`` samples are being generated."""

    uid: str
    job: dict[str, Any]
    n: int
    results: list[dict[str, Any] | None] = field(init=False)
    submissions: int = 0
    started_at: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.results = [None] * self.n

    @property
    def complete(self) -> bool:
        return all(r is not None for r in self.results)

    def to_group(self) -> Group:
        results = [r for r in self.results if r is not None]
        return Group(self.uid, self.job, results, attempts=self.submissions)


@dataclass(eq=False)
class Sample:
    """One submission of sample ``k`` of a group (a new ``attempt`` gets a new job id)."""

    group: GroupState
    k: int
    attempt: int
    job_id: str
    infra_failures: int = 0
    server: str | None = None
    avoid: str | None = None
    not_before: float = 0.0
    submitted_at: float = 0.0


class Registry:
    """Live groups, in-flight samples by job id, and samples waiting for a server."""

    def __init__(self, run: str) -> None:
        self.run = run
        self.groups: dict[str, GroupState] = {}
        self.by_job: dict[str, Sample] = {}
        self.pending: deque[Sample] = deque()
        # next attempt number per sample of every prompt not yet final: a resubmitted
        # (stale) prompt continues the numbering, so its job ids are new on every server
        self.attempts: dict[str, list[int]] = {}

    def job_id(self, group: GroupState, k: int, attempt: int) -> str:
        return f"{self.run}-{group.uid}-{k}-{attempt}"

    def add_group(self, group: GroupState) -> None:
        if group.uid in self.groups:
            raise ValueError(f"prompt uid {group.uid!r} is already in flight")
        self.groups[group.uid] = group
        self.attempts.setdefault(group.uid, [0] * group.n)
        for k in range(group.n):
            self.pending.append(self.new_attempt(group, k))

    def new_attempt(self, group: GroupState, k: int, failures: int = 0) -> Sample:
        attempt = self.attempts[group.uid][k]
        self.attempts[group.uid][k] += 1
        group.submissions += 1
        sample = Sample(group, k, attempt, self.job_id(group, k, attempt), failures)
        self.by_job[sample.job_id] = sample
        return sample

    def release(self, uid: str) -> None:
        """The prompt is final (returned, filtered or failed): no more attempts."""
        self.attempts.pop(uid, None)

    def forget(self, sample: Sample) -> None:
        self.by_job.pop(sample.job_id, None)

    def drop_group(self, group: GroupState) -> list[Sample]:
        """Remove a group; returns its samples that were still in flight or pending."""
        self.groups.pop(group.uid, None)
        live = [s for s in self.by_job.values() if s.group is group]
        for sample in live:
            self.forget(sample)
        self.pending = deque(s for s in self.pending if s.group is not group)
        return live

    def diagnosis(self, now: float) -> list[dict[str, Any]]:
        """The oldest in-flight samples, for a stall report."""
        live = sorted(self.by_job.values(), key=lambda s: s.submitted_at or now)
        return [
            {
                "job_id": s.job_id,
                "server": s.server,
                "age_s": round(now - s.submitted_at, 1) if s.submitted_at else None,
            }
            for s in live[:20]
        ]
