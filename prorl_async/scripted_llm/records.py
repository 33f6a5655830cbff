"""Records the scripted LLM keeps: the request log and the un-rendered reply."""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["LogEntry", "Reply"]


class LogEntry(msgspec.Struct, kw_only=True):
    """One generation request as received, and exactly what was done with it.

    ``outcome`` is ``pending`` while it runs, then ``ok``, ``error`` (503), ``hang``,
    ``drop``, ``bad_request`` (4xx) or ``killed``; ``response`` is the JSON body sent.
    """

    route: str
    body: Any
    outcome: str = "pending"
    status: int | None = None
    response: Any = None


class Reply(msgspec.Struct, frozen=True):
    """A completion before rendering: ids, logprobs (``None`` = missing) and finish."""

    token_ids: list[int]
    logprobs: list[float | None]
    finish_reason: str
    text: str
