"""Bounded staleness: how far behind the current weights a group may be."""

from __future__ import annotations

__all__ = ["Staleness"]


class Staleness:
    """Version bookkeeping of one manager; ``max_version_lag=None`` disables the bound.

    A finished group whose oldest turn is older than ``current - max_version_lag`` is
    stale. Admission bounds the *unconsumed* groups (ready + running), whatever the
    ``set_weights`` cadence: a new group is admitted while

        unconsumed < (max_version_lag + 1 - expected) * batch_groups

    where ``expected`` is 1 between handing out a batch and the trainer's next
    ``set_weights()`` or ``next_batch()`` call (an update may still come before the next
    batch), else 0. Assuming at most one update between two batches, a group admitted
    so is handed out within ``max_version_lag + 1 - expected`` batches, after at most
    ``max_version_lag`` updates, however many batches went by without one before. While
    ``next_batch()`` waits, ``expected`` is 0 and fewer than ``batch_groups`` groups are
    ready, so with nothing running a group is always admitted: the bound never stalls a
    batch. See "Staleness" in docs/trainer.md.
    """

    def __init__(self, max_version_lag: int | None, batch_groups: int) -> None:
        if max_version_lag is not None and max_version_lag < 0:
            raise ValueError(f"max_version_lag must be >= 0 or None, got {max_version_lag}")
        self.max_lag = max_version_lag
        self.batch_groups = batch_groups
        self.current: int | None = None
        self.update_expected = False

    def check(self, version: int) -> None:
        if self.current is not None and version < self.current:
            raise ValueError(f"version {version} is older than the current {self.current}")

    def set_version(self, version: int) -> None:
        """``set_weights()``: the trainer's update for this batch boundary (or none, if equal)."""
        self.check(version)
        self.current = version
        self.update_expected = False

    def batch_handed_out(self) -> None:
        """The trainer trains on a batch now, and may update the weights before the next."""
        self.update_expected = True

    def batch_requested(self) -> None:
        """``next_batch()`` called: whatever update came at this boundary has come."""
        self.update_expected = False

    def lag(self, min_version: int | None) -> int | None:
        if self.current is None or min_version is None:
            return None
        return self.current - min_version

    def is_stale(self, min_version: int | None) -> bool:
        lag = self.lag(min_version)
        return self.max_lag is not None and lag is not None and lag > self.max_lag

    def admits(self, unconsumed: int) -> bool:
        """May one more group start, with ``unconsumed`` groups ready or running?"""
        if self.max_lag is None or self.current is None:
            return True  # no bound, or no version known yet: nothing can be stale
        batches = self.max_lag + 1 - int(self.update_expected)
        return unconsumed < batches * self.batch_groups
