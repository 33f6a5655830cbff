"""Ids of cancelled jobs, each remembered until its deadline (shared by both job stores)."""

from __future__ import annotations

from collections import deque

__all__ = ["Tombstones"]


class Tombstones:
    """``id -> deadline`` (monotonic). Deadlines are added in order, so a deque expires them."""

    def __init__(self) -> None:
        self._deadlines: dict[str, float] = {}
        self._order: deque[tuple[float, str]] = deque()

    def add(self, job_id: str, deadline: float) -> None:
        self._deadlines[job_id] = deadline
        self._order.append((deadline, job_id))

    def __contains__(self, job_id: str) -> bool:
        return job_id in self._deadlines

    def expire(self, now: float) -> list[str]:
        """Forget every id past its deadline; returns them."""
        gone = []
        while self._order and self._order[0][0] <= now:
            deadline, job_id = self._order.popleft()
            # A re-tombstoned id has a newer deadline further back in the queue.
            if self._deadlines.get(job_id) == deadline:
                del self._deadlines[job_id]
                gone.append(job_id)
        return gone
