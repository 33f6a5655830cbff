"""Query parameters: read, checked, and a 400 naming the parameter when they are wrong."""

from __future__ import annotations

import math
from collections.abc import Mapping

from prorl_async.core.errors import BadRequest

__all__ = ["query_int", "query_seconds"]


def query_int(query: Mapping[str, str], name: str, default: int | None, hi: int) -> int | None:
    """``query[name]`` as an integer in 0..``hi``; ``default`` when it is absent."""
    raw = query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= hi:
        raise BadRequest(f"{name}: expected an integer from 0 to {hi}, got {raw!r}")
    return value


def query_seconds(query: Mapping[str, str], name: str, default: float = 0.0) -> float:
    """``query[name]`` as a finite number of seconds >= 0; ``default`` when absent."""
    raw = query.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise BadRequest(f"{name}: expected seconds as a number, got {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise BadRequest(f"{name}: must be a finite number >= 0, got {raw!r}")
    return value
