"""Typed HTTP errors; the middleware turns each into problem+json (API.md)."""

from __future__ import annotations

__all__ = [
    "BadRequest",
    "Conflict",
    "NotFound",
    "PayloadTooLarge",
    "ProblemError",
    "RequestTimeout",
    "Unauthorized",
    "Unavailable",
    "Unprocessable",
]


class ProblemError(Exception):
    """An error with an HTTP status; ``detail`` names the offending field or id."""

    status = 500
    title = "Internal Server Error"
    # Answer, then close the connection (its request was not read to the end).
    close_connection = False

    def __init__(self, detail: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.headers = headers or {}


class BadRequest(ProblemError):
    status = 400
    title = "Bad Request"


class Unauthorized(ProblemError):
    status = 401
    title = "Unauthorized"


class NotFound(ProblemError):
    status = 404
    title = "Not Found"


class RequestTimeout(ProblemError):
    """The body did not arrive in time; the connection is closed after the answer."""

    status = 408
    title = "Request Timeout"
    close_connection = True


class Conflict(ProblemError):
    status = 409
    title = "Conflict"


class PayloadTooLarge(ProblemError):
    status = 413
    title = "Payload Too Large"


class Unprocessable(ProblemError):
    status = 422
    title = "Unprocessable Content"


class Unavailable(ProblemError):
    status = 503
    title = "Service Unavailable"

    def __init__(self, detail: str, *, retry_after: float = 1.0) -> None:
        super().__init__(detail, headers={"Retry-After": str(max(1, round(retry_after)))})
