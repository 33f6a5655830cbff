"""Connection limits for the HTTP listener: a header-read timeout, a cap, the open-file limit.

aiohttp closes a connection idle between requests (``keepalive_timeout``) but has no
deadline for a request's header block: a client that opens a connection and sends
nothing, or half a request line, would hold a file descriptor for good. A
:class:`ConnectionGuard` is the listener's protocol factory: each connection gets a
:class:`~aiohttp.web.RequestHandler` that is closed when its header block has not
arrived ``read_timeout_s`` after the connection opened or after the first bytes of a
request. A request being handled (a long-poll) is never cut by it. Beyond
``max_connections`` a new connection is answered 503 and closed at once; established
ones are untouched. Body reads are bounded in the routes (``read_body``).
"""

from __future__ import annotations

import asyncio
import logging
import resource
from typing import Any, cast

from aiohttp import web

__all__ = ["ConnectionGuard", "raise_nofile_limit"]

log = logging.getLogger(__name__)

# Descriptors kept free for sandboxes, PTYs, kernels and backend sockets when the
# connection cap is clamped to the open-file limit.
FD_RESERVE = 512

_REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"Content-Type: application/problem+json\r\n"
    b"Retry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
)
_REFUSAL_BODY = (
    b'{"type":"about:blank","title":"Service Unavailable","status":503,'
    b'"detail":"too many open connections"}'
)


def raise_nofile_limit() -> int:
    """Raise this process's open-file soft limit to its hard limit; return the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:  # an unlimited hard limit the kernel caps lower
        log.warning("could not raise the open-file limit from %d: %s", soft, exc)
        return soft
    return hard


def clamp_connections(wanted: int) -> int:
    """``wanted``, lowered so connections leave ``FD_RESERVE`` descriptors for everything else."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY or wanted <= soft - FD_RESERVE:
        return wanted
    cap = max(16, soft - FD_RESERVE)
    log.warning("max_connections %d lowered to %d (open-file limit %d)", wanted, cap, soft)
    return cap


class _Refused(asyncio.Protocol):
    """A connection over the cap: answer 503 and close without reading anything."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        writer = cast(asyncio.Transport, transport)  # uvloop's are not asyncio subclasses
        writer.write(_REFUSAL % (len(_REFUSAL_BODY), _REFUSAL_BODY))
        writer.close()


class _GuardedHandler(web.RequestHandler):
    """aiohttp's handler plus a deadline for each request's header block."""

    def __init__(self, guard: ConnectionGuard, manager: web.Server, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._guard = guard
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._guard.open += 1
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._guard.open -= 1
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if data and self._deadline is None and self._waiter is not None:
            # The first bytes of a request between requests: its headers are now due.
            # (Body bytes arrive while a request is handled: no deadline from them.)
            self._arm()
        super().data_received(data)
        if self._messages:
            self._disarm()  # a whole header block arrived

    def _arm(self) -> None:
        self._deadline = self._loop.call_later(self._guard.read_timeout_s, self._expire)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self) -> None:
        self._deadline = None
        # Only while waiting for a request (as aiohttp's own keep-alive check does):
        # a request being handled, a long-poll above all, is never cut.
        if self._waiter is not None and not self._waiter.done():
            self._guard.timed_out += 1
            self.force_close()


class ConnectionGuard:
    """Makes the listener's protocols: caps open connections, times out header reads.

    ``open``, ``refused`` and ``timed_out`` count connections open now, refused over
    the cap and closed for a late header block.
    """

    def __init__(self, *, max_connections: int, read_timeout_s: float, **kw: Any) -> None:
        self.max_connections = max_connections
        self.read_timeout_s = read_timeout_s
        self.handler_kwargs = kw
        self.open = 0
        self.refused = 0
        self.timed_out = 0

    def connect(self, server: web.Server) -> asyncio.Protocol:
        """The protocol for one new connection (``functools.partial`` it as the factory)."""
        if self.open >= self.max_connections:
            self.refused += 1
            return _Refused()
        loop = asyncio.get_running_loop()
        return _GuardedHandler(self, server, loop=loop, **self.handler_kwargs)
