"""Counters of one manager, read as a plain dict by ``RolloutManager.metrics()``."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ManagerMetrics", "ServerStats"]

WASTE_CAUSES = ("cancelled", "filtered", "stale", "failed")


@dataclass
class ServerStats:
    completed: int = 0
    errors: int = 0
    latency_sum_s: float = 0.0
    quarantines: int = 0

    def completed_one(self, seconds: float) -> None:
        self.completed += 1
        self.latency_sum_s += seconds

    def to_dict(self, inflight: int, quarantined: bool) -> dict[str, Any]:
        mean = self.latency_sum_s / self.completed if self.completed else None
        return {
            "inflight": inflight,
            "completed": self.completed,
            "latency_s_mean": mean,
            "errors": self.errors,
            "quarantined": quarantined,
            "quarantines": self.quarantines,
        }


@dataclass
class ManagerMetrics:
    kept: int = 0
    filtered: int = 0
    stale: int = 0
    failed: int = 0
    returned: int = 0
    submitted: int = 0
    results: int = 0
    useful_tokens: int = 0
    retries: Counter[str] = field(default_factory=Counter)
    failed_by: Counter[str] = field(default_factory=Counter)
    cancelled: int = 0
    wasted_tokens: Counter[str] = field(default_factory=Counter)
    wasted_seconds: dict[str, float] = field(default_factory=dict)
    version_lag: Counter[int] = field(default_factory=Counter)
    batch_fill_s: list[float] = field(default_factory=list)

    def waste(self, cause: str, tokens: int, seconds: float) -> None:
        self.wasted_tokens[cause] += tokens
        self.wasted_seconds[cause] = self.wasted_seconds.get(cause, 0.0) + seconds

    @property
    def pass_rate(self) -> float | None:
        judged = self.kept + self.filtered
        return self.kept / judged if judged else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "groups": {
                "kept": self.kept,
                "filtered": self.filtered,
                "stale": self.stale,
                "failed": self.failed,
                "failed_by": dict(self.failed_by),
                "cancelled": self.cancelled,
                "returned": self.returned,
            },
            "samples": {"submitted": self.submitted, "results": self.results},
            "retries": dict(self.retries),
            "wasted_tokens": {c: self.wasted_tokens[c] for c in WASTE_CAUSES},
            "wasted_seconds": {c: round(self.wasted_seconds.get(c, 0.0), 3) for c in WASTE_CAUSES},
            "useful_tokens": self.useful_tokens,
            "version_lag": dict(sorted(self.version_lag.items())),
            "batch_fill_s": [round(s, 3) for s in self.batch_fill_s],
            "pass_rate": self.pass_rate,
        }
