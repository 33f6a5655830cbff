"""What a weight operation answers: its errors (502, 504), each engine's part of a load,
and what an engine out of rotation is given when it comes back (``llm.weights``)."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from prorl_async.llm.backend import Backend
from prorl_async.llm.engines import EngineError, EngineUnavailable

__all__ = [
    "EngineTimeout",
    "LoadResult",
    "Resync",
    "WeightsError",
    "deferred",
    "error_texts",
    "gather_errors",
    "load_results",
    "is_timeout",
    "merge_errors",
    "resync_doc",
    "weights_failure",
]

Version = int | str | None


class WeightsError(Exception):
    """A weight operation failed: ``status`` 422 (refused, nothing touched), 502 (an engine
    failed) or 504 (an engine did not answer within ``pool.weights_timeout_s``);
    ``detail`` names the backend and the cause; ``body`` the full answer."""

    def __init__(self, status: int, detail: str, body: dict[str, Any] | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.body = status, detail, body or {}


class EngineTimeout(EngineUnavailable):
    """An engine gave no answer to a weight call within its bound."""

    def __init__(self, address: str, op: str, timeout_s: float) -> None:
        super().__init__(
            address, f"no answer to {op} within {timeout_s:g} s (pool.weights_timeout_s)"
        )


class LoadResult(msgspec.Struct):
    load_s: float | None = None
    ok: bool = False
    error: str | None = None
    timed_out: bool = False
    """No answer within ``pool.weights_timeout_s``: the backend is out of rotation."""
    deferred: bool = False
    """Out of rotation since an earlier timeout: loads this before it serves again."""


class Resync(msgspec.Struct):
    """What a lost backend is given before it serves again (``GET /weights`` ``resync``)."""

    version: Version
    path: str | None = None
    """A checkpoint to load first (the last load it missed), or none."""
    paused: bool = False
    """Left paused (the others are), else resumed."""
    reason: str = ""


def deferred(target: Resync | None) -> LoadResult:
    if target is None:
        return LoadResult()
    why = f"out of rotation ({target.reason}): loads this checkpoint before it serves again"
    return LoadResult(error=why, deferred=True)


def resync_doc(target: Resync | None) -> dict[str, Any] | None:
    return None if target is None else msgspec.structs.asdict(target)


async def gather_errors(backends: list[Backend], op: Any) -> dict[str, Exception]:
    """Run ``op(b)`` on every backend at once; the errors by address."""
    outcomes = await asyncio.gather(*(op(b) for b in backends), return_exceptions=True)
    errors: dict[str, Exception] = {}
    for b, out in zip(backends, outcomes, strict=True):
        if isinstance(out, asyncio.CancelledError):
            raise out
        if isinstance(out, Exception):
            errors[b.address] = out
        elif isinstance(out, BaseException):
            raise out
    return errors


def is_timeout(exc: Exception) -> bool:
    return isinstance(exc, EngineTimeout)


def merge_errors(first: dict[str, Exception], then: dict[str, Exception]) -> dict[str, Exception]:
    """Errors of two steps; per backend the first, unless the later one is a timeout."""
    out = dict(first)
    for address, exc in then.items():
        if address not in out or is_timeout(exc):
            out[address] = exc
    return out


def load_results(errors: dict[str, Exception]) -> dict[str, LoadResult]:
    return {a: LoadResult(error=str(e), timed_out=is_timeout(e)) for a, e in errors.items()}


def error_texts(errors: dict[str, Exception]) -> dict[str, str]:
    return {a: _text(e) for a, e in errors.items()}


def _text(exc: Exception) -> str:
    return str(exc) if isinstance(exc, EngineError) else f"{type(exc).__name__}: {exc}"


def weights_failure(op: str, errors: dict[str, Exception], body: dict[str, Any]) -> WeightsError:
    """502 when engines failed, 504 when one of them did not answer in time (it is then
    out of rotation until it answers again and is given the weights)."""
    timed_out = [a for a, e in errors.items() if is_timeout(e)]
    detail = f"{op} failed on " + "; ".join(f"{a}: {_text(e)}" for a, e in errors.items())
    if not timed_out:
        return WeightsError(502, detail, body)
    detail += (
        f". {', '.join(timed_out)}: marked unhealthy; given the current weights and version "
        "when it answers again, before it serves"
    )
    return WeightsError(504, detail, {**body, "timed_out": timed_out})
