"""A circuit breaker per receiver: one attempt at a time to a host that is failing.

Each delivery retrying on its own schedule would send a dead receiver one attempt per
pending delivery per backoff step: thousands a minute, each an HTTP attempt and an
outbox write. Instead a host's first failure opens its breaker: its other deliveries
wait (re-timed in the outbox in one statement), and one delivery at a time probes it
with exponential backoff; the first success closes the breaker and the held deliveries
all become due. A failure counts once per round, so the attempts already in flight
when a host goes down do not run its backoff up.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

__all__ = ["CircuitBreaker", "host_of"]


def host_of(url: str) -> str:
    """A callback target's host and port, as its breaker and outbox rows know it."""
    return urlsplit(url).netloc.lower()


class CircuitBreaker:
    """One receiver's state: consecutive failed rounds, when it may be probed again."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.failures = 0
        self.open_at = 0.0  # wall clock: a probe may go from then on
        self.probe_until = 0.0  # while a probe is out: when it is given up
        self.probing = False
        self.round = 0  # bumped at every change of state
        self.last_error: str | None = None
        self.retimed = 0.0  # the held deliveries were last re-timed to this

    def admits(self, now: float) -> bool:
        """Whether a delivery may be attempted now (as the probe, if the host is failing)."""
        return self.failures == 0 or (not self.probing and now >= self.open_at)

    def hold_until(self, now: float) -> float:
        """When a held delivery should be looked at again."""
        return self.probe_until if self.probing else max(self.open_at, now)

    def started(self, now: float, timeout_s: float) -> tuple[int, bool]:
        """An attempt goes: (the round it belongs to, whether it is the host's probe)."""
        probe = self.failures > 0
        if probe:
            self.probing = True
            self.probe_until = now + timeout_s
        return self.round, probe

    def answered(self) -> bool:
        """The host answered (a 2xx, or a final refusal): the breaker closes. Returns whether
        it had been failing (its held deliveries are due now)."""
        was_failing = self.failures > 0
        self.failures, self.open_at, self.probing = 0, 0.0, False
        self.round += 1
        return was_failing

    def failed(
        self, round_: int, probe: bool, error: str, now: float, backoff: Callable[[int], float]
    ) -> None:
        """An attempt of ``round_`` failed: the first of its round keeps the breaker open longer."""
        self.last_error = error
        if probe:
            self.probing = False
        if round_ == self.round:
            self.failures += 1
            self.round += 1
            self.open_at = now + backoff(self.failures)
