"""One error-mapping middleware and the optional bearer-token check."""

from __future__ import annotations

import hmac
import logging

import msgspec
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from prorl_async.core.errors import ProblemError, Unauthorized
from prorl_async.schemas import Problem

__all__ = ["MAX_BODY", "error_middleware", "make_auth_middleware", "problem_response"]

log = logging.getLogger(__name__)

_encoder = msgspec.json.Encoder()
MAX_BODY = web.AppKey("max_body_bytes", int)
_OPEN_PATHS = frozenset({"/healthz", "/metrics"})
PROBLEM_TYPE = "about:blank"


def problem_response(
    status: int, title: str, detail: str, headers: dict[str, str] | None = None
) -> web.Response:
    body = _encoder.encode(Problem(type=PROBLEM_TYPE, title=title, status=status, detail=detail))
    return web.Response(
        body=body, status=status, headers=headers, content_type="application/problem+json"
    )


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Map every error to problem+json; unexpected ones are logged and answered 500."""
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except ProblemError as exc:
        problem = problem_response(exc.status, exc.title, exc.detail, exc.headers)
        if exc.close_connection:
            problem.force_close()
        return problem
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        detail = exc.text or exc.reason
        if isinstance(exc, web.HTTPRequestEntityTooLarge):
            detail = f"request body over the limit of {request.app[MAX_BODY]} bytes"
        headers = {k: v for k, v in exc.headers.items() if k in ("Allow", "Retry-After")}
        return problem_response(exc.status, exc.reason, detail or exc.reason, headers)
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return problem_response(500, "Internal Server Error", "internal error (logged)")


def make_auth_middleware(token: str | None) -> Middleware:
    """Bearer-token check, constant-time; ``/healthz`` and ``/metrics`` stay open."""
    expected = f"Bearer {token}".encode() if token else None

    @web.middleware
    async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if expected is not None and request.path not in _OPEN_PATHS:
            # Undecodable header bytes arrive as surrogates; they must fail the compare, not raise.
            given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
            if not hmac.compare_digest(given, expected):
                raise Unauthorized("missing or wrong bearer token in the Authorization header")
        response: web.StreamResponse = await handler(request)
        return response

    return auth_middleware
