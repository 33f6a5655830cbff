"""Results pushed and read by cursor: ``GET /results``, ``GET /events`` (Server-Sent
Events) and ``GET /jobs/{job_id}/callback`` (API.md "Results").

Both read the service's result log, which holds only durable results, in ``seq``
order, per tenant. An event stream pulls from the log at its own pace: a stream holds
no queue of its own, only its socket's send buffer, bounded at ``events.buffer_bytes``
(and the kernel's at 64 KiB); a consumer that leaves it full for ``events.stall_s``
is disconnected and resumes later from its ``Last-Event-ID`` with nothing missed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

import msgspec
from aiohttp import web

from prorl_async.api.access import viewer
from prorl_async.api.params import query_int, query_seconds
from prorl_async.api.routes import SERVICE, json_response
from prorl_async.core.errors import BadRequest
from prorl_async.core.resultlog import LogEntry
from prorl_async.notify.config import EventsConfig
from prorl_async.schemas import JobEvent
from prorl_async.service import RolloutService

__all__ = ["event_routes", "register_events"]

log = logging.getLogger(__name__)

event_routes = web.RouteTableDef()
_encoder = msgspec.json.Encoder()
MAX_LIMIT = 10_000
_EVENTS_PER_WRITE = 256
_SNDBUF = 64 * 1024


def register_events(app: web.Application) -> None:
    """At shutdown, waiting readers return and streams end (the routes: ``event_routes``,
    added with the others by ``api.access.add_routes``)."""
    app.on_shutdown.append(_close)


async def _close(app: web.Application) -> None:
    app[SERVICE].close_feeds()


# -- GET /results -----------------------------------------------------------------------


@event_routes.get("/results")
async def results(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    me = viewer(request).name
    cursor = svc.cursor(me, query_int(request.query, "after", None, 2**62))
    limit = query_int(request.query, "limit", 100, MAX_LIMIT) or 0
    wait = query_seconds(request.query, "wait")
    return json_response(await svc.results_after(me, cursor, limit, wait))


# -- GET /events ------------------------------------------------------------------------


@event_routes.get("/events")
async def events(request: web.Request) -> web.StreamResponse:
    svc = request.app[SERVICE]
    me = viewer(request).name
    resume = request.headers.get("Last-Event-ID")
    if resume is not None and not resume.strip().isdigit():
        raise BadRequest(f"Last-Event-ID: expected a seq (an integer), got {resume!r}")
    after = int(resume) if resume is not None else query_int(request.query, "after", None, 2**62)
    cursor = svc.cursor(me, after, svc.last_seq(me))  # neither given: from now on
    resp = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
        }
    )
    await resp.prepare(request)
    transport = request.transport
    if transport is None:
        return resp
    cfg = svc.config.events
    _bound(transport, cfg.buffer_bytes)
    # A first comment sends the headers at once; retry: is the browser's reconnect delay.
    if not await _send(svc, resp, transport, b"retry: 1000\n: stream open\n\n", cfg):
        return resp
    feed = svc.events(me, cursor, _EVENTS_PER_WRITE, cfg.heartbeat_s)
    async with contextlib.aclosing(feed):
        async for entries in feed:
            # Nothing for heartbeat_s: a comment, so the consumer knows we live.
            chunk = b"".join(_event(e, me) for e in entries) if entries else b": heartbeat\n\n"
            if not await _send(svc, resp, transport, chunk, cfg):
                break
    return resp


def _bound(transport: asyncio.Transport, buffer_bytes: int) -> None:
    """Writes wait (flow control) once ``buffer_bytes`` are unsent; the kernel holds 64 KiB."""
    transport.set_write_buffer_limits(high=buffer_bytes)
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SNDBUF)
        except OSError:
            pass


def _event(e: LogEntry, tenant: str) -> bytes:
    data = _encoder.encode(
        JobEvent(job_id=e.job_id, status=e.status, reward=e.reward, seq=e.seq, tenant=tenant)
    )
    return b"id: %d\nevent: job\ndata: %s\n\n" % (e.seq, data)


async def _send(
    svc: RolloutService,
    resp: web.StreamResponse,
    transport: asyncio.Transport,
    chunk: bytes,
    cfg: EventsConfig,
) -> bool:
    """Write ``chunk``; False if the consumer is gone or was cut for not reading."""
    try:
        async with asyncio.timeout(cfg.stall_s):
            await resp.write(chunk)
    except TimeoutError:
        svc.event_consumer_dropped()
        log.warning(
            "/events consumer %s took nothing of its full buffer for %g s: disconnected",
            transport.get_extra_info("peername"),
            cfg.stall_s,
        )
        transport.abort()
        return False
    except ConnectionError:
        return False  # the consumer went away (aiohttp's reset error is a ConnectionError)
    return True


# -- GET /jobs/{job_id}/callback --------------------------------------------------------


@event_routes.get("/jobs/{job_id}/callback")
async def callback_state(request: web.Request) -> web.Response:
    job_id = request.match_info["job_id"]
    return json_response(await request.app[SERVICE].callback_state(job_id, viewer(request).name))
