"""Rollout servers as this manager sees them: capacity, its jobs in flight, health."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prorl_async.client import RolloutClient
from prorl_async.trainer.metrics import ServerStats

if TYPE_CHECKING:
    from prorl_async.trainer.registry import Sample

__all__ = ["QUARANTINE_AFTER", "ServerPool", "ServerState"]

QUARANTINE_AFTER = 3
"""Transport failures in a row that take a server out of rotation."""


class ServerState:
    """One rollout server: the samples of this manager on it, and its failure streak."""

    def __init__(self, url: str, client: RolloutClient, capacity: int) -> None:
        self.url = url
        self.client = client
        self.capacity = capacity
        self.inflight: dict[str, Sample] = {}
        self.orphans: set[str] = set()
        self.failures = 0
        self.quarantined = False
        self.stats = ServerStats()
        self.dirty = asyncio.Event()
        # Reading its result log (trainer/poller.py): the cursor, the log's epoch
        # (None until known), and when the ids in flight were last swept with /poll.
        self.cursor = 0
        self.epoch: str | None = None
        self.swept = 0.0

    @property
    def free(self) -> int:
        return 0 if self.quarantined else self.capacity - len(self.inflight)

    def add(self, sample: Sample) -> None:
        self.inflight[sample.job_id] = sample
        sample.server = self.url

    def submitted(self) -> list[str]:
        """Jobs the server has acknowledged (a poll for one still being sent says unknown)."""
        return [job_id for job_id, s in self.inflight.items() if s.submitted_at]

    def transport_failed(self) -> bool:
        """Count a failure; ``True`` when this one quarantines the server."""
        self.failures += 1
        self.stats.errors += 1
        if self.failures >= QUARANTINE_AFTER and not self.quarantined:
            self.quarantine()
            return True
        return False

    def quarantine(self) -> None:
        """Take the server out of rotation until a ``/healthz`` probe answers."""
        self.failures = max(self.failures, QUARANTINE_AFTER)
        self.quarantined = True
        self.stats.quarantines += 1
        # Its poll loop may idle on ``dirty`` (nothing acknowledged there, as when the
        # failures were submissions): wake it, or the server is never probed again.
        self.dirty.set()

    def recover(self) -> None:
        """Back in rotation with a clean failure streak."""
        self.quarantined = False
        self.failures = 0

    def transport_ok(self) -> None:
        self.failures = 0


class ServerPool:
    """Picks the healthy server with the fewest of this manager's jobs in flight."""

    def __init__(self, servers: list[ServerState]) -> None:
        self.servers = {s.url: s for s in servers}

    def __iter__(self) -> Iterator[ServerState]:
        return iter(list(self.servers.values()))

    def pick(self, avoid: str | None = None) -> ServerState | None:
        """A server with room in its window; ``avoid`` only when no other server is healthy."""
        open_ = [s for s in self.servers.values() if s.free > 0]
        others_up = any(not s.quarantined for s in self.servers.values() if s.url != avoid)
        if others_up:
            open_ = [s for s in open_ if s.url != avoid]
        return min(open_, key=lambda s: len(s.inflight), default=None)

    @property
    def inflight(self) -> int:
        return sum(len(s.inflight) for s in self.servers.values())

    @property
    def healthy(self) -> list[ServerState]:
        return [s for s in self.servers.values() if not s.quarantined]
