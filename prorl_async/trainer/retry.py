"""Failure classes and backoff: an infrastructure failure is retried, never scored."""

from __future__ import annotations

import asyncio
import random
from typing import Any, Literal

import aiohttp

from prorl_async.client import RolloutError

__all__ = ["Backoff", "classify_result", "transport_class"]

ResultClass = Literal["ok", "task", "infra"]


# An LLM call that failed for good (the engine down or answering 5xx, no healthy one left
# to fail over to) is the machinery's failure wherever the job was; another server's
# engines may work.
ENGINE_FAILURES = frozenset({"BackendError", "EngineUnavailable"})


def classify_result(result: dict[str, Any]) -> ResultClass:
    """``infra`` for a failure of the machinery (INIT failed, an LLM engine failed,
    cancelled by a server stop).

    A rollout that failed otherwise in RUN or EVAL, or timed out, is the policy's own
    result: ``task``.
    """
    status = result.get("status")
    if status == "done":
        return "ok"
    if status == "cancelled":
        return "infra"  # we cancel only jobs we no longer track, so this was a server stop
    error = result.get("error") or {}
    engine_failed = error.get("type") in ENGINE_FAILURES
    if status == "failed" and (error.get("stage") == "init" or engine_failed):
        return "infra"
    return "task"


def transport_class(exc: BaseException) -> str | None:
    """The retry class of an HTTP failure (``None``: not a transport failure, re-raise)."""
    if isinstance(exc, RolloutError):
        return "http_503" if exc.status == 503 else "http_5xx" if exc.status >= 500 else None
    if isinstance(exc, aiohttp.ClientError | asyncio.TimeoutError | ConnectionError):
        return "connection"
    return None


def retry_after(exc: BaseException) -> float | None:
    return exc.retry_after if isinstance(exc, RolloutError) else None


class Backoff:
    """Exponential backoff with jitter; a server's ``Retry-After`` wins when it is given."""

    def __init__(self, base_s: float = 0.05, cap_s: float = 5.0, seed: int | None = None) -> None:
        self.base_s, self.cap_s = base_s, cap_s
        self._rng = random.Random(seed)

    def delay(self, failures: int, exc: BaseException | None = None) -> float:
        after = retry_after(exc) if exc is not None else None
        if after is not None:
            return min(after, self.cap_s)
        step = min(self.base_s * 2.0 ** max(failures - 1, 0), self.cap_s)
        return step * (0.5 + self._rng.random() / 2)
