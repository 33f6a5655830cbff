"""Results pushed and read by cursor: ``GET /results``, ``GET /events`` (Server-Sent
Events) and ``GET /jobs/{job_id}/callback`` (API.md "Results").

Both read the store's result log, which holds only durable results, in ``seq``
order, per tenant. An event stream pulls from the log at its own pace: a stream holds
no queue of its own, only its socket's send buffer, bounded at ``events.buffer_bytes``
(and the kernel's at 64 KiB); a consumer that leaves it full for ``events.stall_s``
is disconnected and resumes later from its ``Last-Event-ID`` with nothing missed.
"""

from __future__ import annotations

import asyncio
import logging
import socket

import msgspec
from aiohttp import web

from prorl_async.api.access import viewer
from prorl_async.api.routes import SERVICE, json_response, wait_param
from prorl_async.core.errors import BadRequest, Gone, NotFound
from prorl_async.core.resultlog import LogEntry, ResultLog
from prorl_async.notify.config import EventsConfig
from prorl_async.schemas import CallbackInfo, JobEvent, ResultsResponse
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
    app[SERVICE].store.log.close()


# -- parameters -------------------------------------------------------------------------


def _int(request: web.Request, name: str, default: int | None, hi: int) -> int | None:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= hi:
        raise BadRequest(f"{name}: expected an integer from 0 to {hi}, got {raw!r}")
    return value


def _cursor(cl: ResultLog, tenant: str, after: int | None, default: int) -> int:
    """``after`` checked against retention (410), or ``default`` when not given."""
    if after is None:
        return default
    if after < cl.floor(tenant):
        oldest = cl.oldest(tenant)
        raise Gone(
            f"after: cursor {after} is older than the retention; the oldest seq still held "
            f"is {oldest} (read on from after={oldest - 1}, and poll the ids you miss)",
            oldest_seq=oldest,
        )
    return after


# -- GET /results -----------------------------------------------------------------------


@event_routes.get("/results")
async def results(request: web.Request) -> web.Response:
    svc: RolloutService = request.app[SERVICE]
    me = viewer(request).name
    cl = svc.store.log
    cursor = _cursor(cl, me, _int(request, "after", None, 2**62), cl.oldest(me) - 1)
    limit = _int(request, "limit", 100, MAX_LIMIT) or 0
    wait = wait_param(request)
    entries = cl.after(me, cursor, limit)
    if not entries and limit and wait > 0:
        await cl.wait(me, cursor, min(wait, svc.config.max_wait_s))
        entries = cl.after(me, cursor, limit)
    docs = await _documents(svc, entries)
    cursor = entries[-1].seq if entries else cursor
    return json_response(ResultsResponse(results=docs, next=cursor, epoch=cl.epoch))


async def _documents(svc: RolloutService, entries: list[LogEntry]) -> list[msgspec.Raw]:
    """The result documents of ``entries`` still held (not deleted or replaced since)."""
    store = svc.store
    bodies = await store.results([e.job_id for e in entries])
    return [
        msgspec.Raw(bodies[e.job_id])
        for e in entries
        if e.job_id in bodies and store.seq_of(e.job_id) == e.seq
    ]


# -- GET /events ------------------------------------------------------------------------


@event_routes.get("/events")
async def events(request: web.Request) -> web.StreamResponse:
    svc: RolloutService = request.app[SERVICE]
    me = viewer(request).name
    cl = svc.store.log
    resume = request.headers.get("Last-Event-ID")
    if resume is not None and not resume.strip().isdigit():
        raise BadRequest(f"Last-Event-ID: expected a seq (an integer), got {resume!r}")
    after = int(resume) if resume is not None else _int(request, "after", None, 2**62)
    cursor = _cursor(cl, me, after, cl.last(me))  # neither given: from now on
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
    _bound(transport, svc.config.events.buffer_bytes)
    cl.streams += 1
    try:
        await _stream(resp, transport, cl, me, cursor, svc.config.events)
    finally:
        cl.streams -= 1
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


async def _stream(
    resp: web.StreamResponse,
    transport: asyncio.Transport,
    cl: ResultLog,
    tenant: str,
    cursor: int,
    cfg: EventsConfig,
) -> None:
    # A first comment sends the headers at once; retry: is the browser's reconnect delay.
    if not await _send(resp, transport, b"retry: 1000\n: stream open\n\n", cl, cfg):
        return
    while not cl.closed:
        entries = cl.after(tenant, cursor, _EVENTS_PER_WRITE)
        if entries:
            cursor = entries[-1].seq
            chunk = b"".join(_event(e, tenant) for e in entries)
        else:
            await cl.wait(tenant, cursor, cfg.heartbeat_s)
            if cl.closed or cl.after(tenant, cursor, 1):
                continue
            chunk = b": heartbeat\n\n"  # nothing for heartbeat_s: the consumer knows we live
        if not await _send(resp, transport, chunk, cl, cfg):
            return


def _event(e: LogEntry, tenant: str) -> bytes:
    data = _encoder.encode(
        JobEvent(job_id=e.job_id, status=e.status, reward=e.reward, seq=e.seq, tenant=tenant)
    )
    return b"id: %d\nevent: job\ndata: %s\n\n" % (e.seq, data)


async def _send(
    resp: web.StreamResponse,
    transport: asyncio.Transport,
    chunk: bytes,
    cl: ResultLog,
    cfg: EventsConfig,
) -> bool:
    """Write ``chunk``; False if the consumer is gone or was cut for not reading."""
    try:
        async with asyncio.timeout(cfg.stall_s):
            await resp.write(chunk)
    except TimeoutError:
        cl.streams_dropped += 1
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
    svc: RolloutService = request.app[SERVICE]
    job_id = request.match_info["job_id"]
    if svc.store.status(job_id) is None or svc.foreign(job_id, viewer(request).name):
        raise NotFound(f"job_id: unknown job {job_id!r}")
    info = await svc.store.outbox.info(job_id)
    if info is None:
        job = svc.store.get(job_id)
        if job is None or job.terminal or job.callback_url is None:
            raise NotFound(f"job_id: job {job_id!r} has no callback_url")
        # Not ended yet: its delivery starts when it does.
        info = CallbackInfo(job_id=job_id, url=job.callback_url, state="pending", attempts=0,
                            last_error=None)  # fmt: skip
    return json_response(info)
