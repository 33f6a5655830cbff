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
    """aiohttp's handler plus a deadline for each request's header block.

    The deadline costs one clock read per request: the guard's sweep (``_sweep``) closes
    the connections whose header block is overdue, so no timer is made per request."""

    def __init__(self, guard: ConnectionGuard, manager: web.Server, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._guard = guard
        self._since: float | None = None  # loop time the current header block became due

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._guard.opened(self)
        super().connection_made(transport)
        self._since = self._loop.time()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._guard.closed(self)
        self._since = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if data and self._since is None and self._waiter is not None:
            # The first bytes of a request between requests: its headers are now due.
            # (Body bytes arrive while a request is handled: no deadline from them.)
            self._since = self._loop.time()
        super().data_received(data)
        if self._messages:
            self._since = None  # a whole header block arrived

    def expire(self, cutoff: float) -> None:
        """Close the connection if its header block was due before ``cutoff`` (loop time)."""
        since = self._since
        if since is None or since > cutoff:
            return
        self._since = None
        # Only while waiting for a request (as aiohttp's own keep-alive check does):
        # a request being handled, a long-poll above all, is never cut.
        if self._waiter is not None and not self._waiter.done():
            self._guard.timed_out += 1
            self.force_close()


class ConnectionGuard:
    """Makes the listener's protocols: caps open connections, times out header reads.

    ``open``, ``refused`` and ``timed_out`` count connections open now, refused over
    the cap and closed for a late header block. One timer sweeps the open connections
    every eighth of ``read_timeout_s``: a late header block is cut between
    ``read_timeout_s`` and ``1.125 * read_timeout_s`` after it became due.
    """

    def __init__(self, *, max_connections: int, read_timeout_s: float, **kw: Any) -> None:
        self.max_connections = max_connections
        self.read_timeout_s = read_timeout_s
        self.handler_kwargs = kw
        self.open = 0
        self.refused = 0
        self.timed_out = 0
        self._handlers: set[_GuardedHandler] = set()
        self._sweeper: asyncio.TimerHandle | None = None

    def connect(self, server: web.Server) -> asyncio.Protocol:
        """The protocol for one new connection (``functools.partial`` it as the factory)."""
        if self.open >= self.max_connections:
            self.refused += 1
            return _Refused()
        loop = asyncio.get_running_loop()
        return _GuardedHandler(self, server, loop=loop, **self.handler_kwargs)

    def opened(self, handler: _GuardedHandler) -> None:
        self.open += 1
        self._handlers.add(handler)
        if self._sweeper is None:
            self._schedule()

    def closed(self, handler: _GuardedHandler) -> None:
        self.open -= 1
        self._handlers.discard(handler)

    def _schedule(self) -> None:
        interval = max(self.read_timeout_s / 8, 0.01)
        self._sweeper = asyncio.get_running_loop().call_later(interval, self._sweep)

    def _sweep(self) -> None:
        self._sweeper = None
        cutoff = asyncio.get_running_loop().time() - self.read_timeout_s
        for handler in list(self._handlers):
            handler.expire(cutoff)
        if self._handlers:
            self._schedule()
