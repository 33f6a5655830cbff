"""Errors the trainer-side manager raises."""

from __future__ import annotations

__all__ = [
    "PromptsExhausted",
    "RolloutStalled",
    "TrainerError",
    "WeightsFailed",
    "WeightsTimeout",
]


class TrainerError(RuntimeError):
    """The manager cannot go on; the message says why and what to change."""


class PromptsExhausted(TrainerError):
    """``prompts`` ran out before a batch could be filled."""


class RolloutStalled(TrainerError):
    """No result arrived for ``stall_timeout_s``; ``diagnosis`` names the servers and samples."""

    def __init__(self, message: str, diagnosis: dict[str, object]) -> None:
        super().__init__(message)
        self.diagnosis = diagnosis


class WeightsFailed(TrainerError):
    """``set_weights(path=...)`` did not reach every engine: those in ``engines`` failed
    their load (a bad checkpoint, an engine error) and serve their old weights. The
    others serve the new version, and it is recorded."""

    def __init__(self, message: str, engines: list[str]) -> None:
        super().__init__(message)
        self.engines = engines


class WeightsTimeout(WeightsFailed):
    """``set_weights(path=...)``: an engine did not answer within the server's
    ``pool.weights_timeout_s``. The other engines serve the new version (it is recorded);
    those in ``engines`` are out of rotation until they answer and are given it."""
