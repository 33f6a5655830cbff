"""Fault injection for the scripted LLM (changeable at run time)."""

from __future__ import annotations

import random
from typing import Literal

import msgspec

__all__ = ["Faults", "Outcome"]

Outcome = Literal["ok", "error", "hang", "drop"]


class Faults(msgspec.Struct, kw_only=True):
    """Per-request fault rates (0..1) and switches.

    ``error_rate`` answers HTTP 503, ``hang_rate`` never answers (until the server stops
    or is killed), ``drop_rate`` closes the connection without an answer. ``nan_rate`` and
    ``missing_rate`` replace single token logprobs by NaN or ``null``. ``down`` answers 503
    to everything including ``/health`` (``ScriptedLLM.kill()`` closes the socket instead).
    """

    error_rate: float = 0.0
    hang_rate: float = 0.0
    drop_rate: float = 0.0
    nan_rate: float = 0.0
    missing_rate: float = 0.0
    down: bool = False
    fail_next: int = 0
    """Answer the next N generation requests 503 (counts down), then behave normally."""

    def __post_init__(self) -> None:
        for name in ("error_rate", "hang_rate", "drop_rate", "nan_rate", "missing_rate"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"fault {name} must be within [0, 1], got {value}")
        if self.fail_next < 0:
            raise ValueError(f"fault fail_next must be >= 0, got {self.fail_next}")

    def outcome(self, rng: random.Random) -> Outcome:
        """Draw what happens to one generation request."""
        if self.down:
            return "error"
        if self.fail_next > 0:
            self.fail_next -= 1
            return "error"
        x = rng.random()
        for kind, rate in (("error", self.error_rate), ("hang", self.hang_rate)):
            if x < rate:
                return kind  # type: ignore[return-value]
            x -= rate
        return "drop" if x < self.drop_rate else "ok"

    def corrupt(self, rng: random.Random, logprob: float) -> float | None:
        """The logprob to send for one token: unchanged, NaN or missing (``None``)."""
        x = rng.random()
        if x < self.nan_rate:
            return float("nan")
        if x < self.nan_rate + self.missing_rate:
            return None
        return logprob
