"""Typed HTTP errors; every route's guard turns each into problem+json (API.md)."""

from __future__ import annotations

__all__ = [
    "BadRequest",
    "Conflict",
    "Forbidden",
    "Gone",
    "NotFound",
    "PayloadTooLarge",
    "ProblemError",
    "RequestTimeout",
    "TooManyRequests",
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
    # Extension members of the problem+json body (RFC 9457), beside the four fixed ones.
    extra: dict[str, object] = {}

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


class Forbidden(ProblemError):
    """Authenticated, but this tenant may not call the route (an admin route)."""

    status = 403
    title = "Forbidden"


class Gone(ProblemError):
    """A result-log cursor older than retention; ``oldest_seq`` is still held."""

    status = 410
    title = "Gone"

    def __init__(self, detail: str, *, oldest_seq: int) -> None:
        super().__init__(detail, headers={"X-Prorl-Oldest-Seq": str(oldest_seq)})
        self.extra = {"oldest_seq": oldest_seq}


class TooManyRequests(ProblemError):
    """Over the tenant's quota; no job was created."""

    status = 429
    title = "Too Many Requests"

    def __init__(self, detail: str, *, retry_after: float = 1.0) -> None:
        super().__init__(detail, headers={"Retry-After": str(max(1, round(retry_after)))})


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
