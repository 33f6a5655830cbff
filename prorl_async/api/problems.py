"""Errors as problem+json (RFC 9457, docs/API.md): what every route answers when it fails."""

from __future__ import annotations

import logging

import msgspec
from aiohttp import web

from prorl_async.core.errors import ProblemError
from prorl_async.schemas import Problem

__all__ = ["MAX_BODY", "error_response", "problem_response"]

log = logging.getLogger(__name__)

_encoder = msgspec.json.Encoder()
MAX_BODY = web.AppKey("max_body_bytes", int)
PROBLEM_TYPE = "about:blank"


def problem_response(
    status: int,
    title: str,
    detail: str,
    headers: dict[str, str] | None = None,
    extra: dict[str, object] | None = None,
) -> web.Response:
    problem = Problem(type=PROBLEM_TYPE, title=title, status=status, detail=detail)
    # Extension members (e.g. a 410's oldest_seq) beside the four fixed ones.
    body = _encoder.encode({**msgspec.structs.asdict(problem), **extra} if extra else problem)
    return web.Response(
        body=body, status=status, headers=headers, content_type="application/problem+json"
    )


def error_response(request: web.Request, exc: Exception) -> web.StreamResponse:
    """The answer to ``exc`` raised while serving ``request``: a ``ProblemError`` and an
    aiohttp error (4xx, 5xx) as problem+json, anything else logged and answered 500
    (an aiohttp redirect, a 3xx, is an answer: the caller lets it through)."""
    if isinstance(exc, ProblemError):
        problem = problem_response(exc.status, exc.title, exc.detail, exc.headers, exc.extra)
        if exc.close_connection:
            problem.force_close()
        return problem
    if isinstance(exc, web.HTTPException):
        detail = exc.text or exc.reason
        if isinstance(exc, web.HTTPRequestEntityTooLarge):
            detail = f"request body over the limit of {request.app[MAX_BODY]} bytes"
        if isinstance(exc, web.HTTPMethodNotAllowed):
            allowed = ", ".join(sorted(exc.allowed_methods))
            detail = f"{request.method} {request.path}: method not allowed; use {allowed}"
        headers = {k: v for k, v in exc.headers.items() if k in ("Allow", "Retry-After")}
        return problem_response(exc.status, exc.reason, detail or exc.reason, headers)
    log.error("unhandled error in %s %s", request.method, request.path, exc_info=exc)
    return problem_response(500, "Internal Server Error", "internal error (logged)")
