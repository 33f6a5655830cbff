"""Bounded staleness: how far behind the current weights a group may be."""

from __future__ import annotations

__all__ = ["Staleness"]


class Staleness:
    """Version bookkeeping of one manager.

    Admission follows AReaL/SkyRL: accepted + running groups stay within
    ``(updates + max_version_lag + 1) * batch_groups``, where ``updates`` counts
    ``set_weights`` calls; a finished group whose oldest turn is older than
    ``current - max_version_lag`` is stale. ``max_version_lag=None`` disables both.
    """

    def __init__(self, max_version_lag: int | None, batch_groups: int) -> None:
        if max_version_lag is not None and max_version_lag < 0:
            raise ValueError(f"max_version_lag must be >= 0 or None, got {max_version_lag}")
        self.max_lag = max_version_lag
        self.batch_groups = batch_groups
        self.current: int | None = None
        self.updates = 0

    def set_version(self, version: int) -> None:
        if self.current is not None and version < self.current:
            raise ValueError(f"version {version} is older than the current {self.current}")
        if self.current is not None and version != self.current:
            self.updates += 1
        self.current = version

    def lag(self, min_version: int | None) -> int | None:
        if self.current is None or min_version is None:
            return None
        return self.current - min_version

    def is_stale(self, min_version: int | None) -> bool:
        lag = self.lag(min_version)
        return self.max_lag is not None and lag is not None and lag > self.max_lag

    def admits(self, accepted: int, running: int) -> bool:
        if self.max_lag is None:
            return True
        return accepted + running < (self.updates + self.max_lag + 1) * self.batch_groups
