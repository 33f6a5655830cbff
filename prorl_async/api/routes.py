"""HTTP routes (API.md). Thin: decode, call the service, encode."""

from __future__ import annotations

import asyncio
import math
from typing import Any, TypeVar

import msgspec
from aiohttp import web

from prorl_async.api.access import viewer
from prorl_async.api.openapi import openapi_document
from prorl_async.core.errors import (
    BadRequest,
    NotFound,
    PayloadTooLarge,
    RequestTimeout,
    Unavailable,
    Unprocessable,
)
from prorl_async.schemas import (
    AddLLMServerRequest,
    BatchRequest,
    BatchResponse,
    CancelRequest,
    JobStatusResponse,
    PollRequest,
    PollResponse,
    ProcessRequest,
    RemoveLLMServerRequest,
    SubmitResponse,
    WorkersRequest,
)
from prorl_async.service import RolloutService

__all__ = ["SERVICE", "decode_body", "json_response", "routes"]

T = TypeVar("T")

SERVICE = web.AppKey("service", RolloutService)
routes = web.RouteTableDef()

_encoder = msgspec.json.Encoder()
_decoders: dict[type[Any], msgspec.json.Decoder[Any]] = {
    t: msgspec.json.Decoder(t)
    for t in (
        ProcessRequest,
        BatchRequest,
        PollRequest,
        CancelRequest,
        AddLLMServerRequest,
        RemoveLLMServerRequest,
        WorkersRequest,
    )
}


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=_encoder.encode(obj), status=status, content_type="application/json")


async def _read(request: web.Request) -> bytes:
    if request.content.is_eof():  # the whole body arrived with the headers: nothing to wait for
        return await request.read()
    limit = _service(request).config.read_timeout_s
    try:
        async with asyncio.timeout(limit):
            return await request.read()
    except TimeoutError:
        raise RequestTimeout(f"request body not received within {limit} s") from None


async def _decode(request: web.Request, kind: type[T]) -> T:
    body = await _read(request)
    if not body.strip():
        raise BadRequest(
            f"empty request body: {request.method} {request.path} takes a JSON object (docs/API.md)"
        )
    decoder = _decoders.get(kind) or _decoders.setdefault(kind, msgspec.json.Decoder(kind))
    try:
        result: T = decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise BadRequest(f"invalid body: {exc}") from None
    except msgspec.DecodeError as exc:
        raise BadRequest(f"malformed JSON body: {exc}") from None
    except RecursionError:
        # msgspec recurses per nesting level; a hostile body must not reach a 500.
        raise BadRequest("malformed JSON body: nested too deeply") from None
    return result


def _wait_param(request: web.Request) -> float:
    raw = request.query.get("wait", "0")
    try:
        wait = float(raw)
    except ValueError:
        raise BadRequest(f"wait: expected seconds as a number, got {raw!r}") from None
    if not math.isfinite(wait) or wait < 0:
        raise BadRequest(f"wait: must be a finite number >= 0, got {raw!r}")
    return wait


def _service(request: web.Request) -> RolloutService:
    return request.app[SERVICE]


# For the route families in their own modules (api/weights.py, ...).
decode_body = _decode
json_response = _json
wait_param = _wait_param


# -- jobs ------------------------------------------------------------------------------------


@routes.post("/process")
async def process(request: web.Request) -> web.Response:
    req = await _decode(request, ProcessRequest)
    svc = _service(request)
    job_id, status, created = svc.submit(req, viewer(request).name)
    await svc.store.sync()  # the job is on disk before the client hears it was accepted
    if created:  # API.md: a new job answers {"status": "queued"}
        return _json(SubmitResponse(job_id=job_id, status="queued"), 202)
    return _json(SubmitResponse(job_id=job_id, status=status), 200)


@routes.post("/process/batch")
async def process_batch(request: web.Request) -> web.Response:
    req = await _decode(request, BatchRequest)
    svc = _service(request)
    if len(req.jobs) > svc.config.max_batch:
        raise PayloadTooLarge(f"jobs: {len(req.jobs)} jobs, over max_batch={svc.config.max_batch}")
    ids = svc.submit_batch(req.jobs, viewer(request).name)
    svc.store.flush()  # a batch fills a commit of its own: no need to wait for others
    await svc.store.sync()
    return _json(BatchResponse(job_ids=ids), 202)


@routes.get("/jobs/{job_id}")
async def get_job(request: web.Request) -> web.Response:
    wait = _wait_param(request)
    svc = _service(request)
    job_id = request.match_info["job_id"]
    if svc.foreign(job_id, viewer(request).name):  # another tenant's: as if unknown
        raise NotFound(f"job_id: unknown job {job_id!r}")
    job = svc.store.get(job_id)
    if job is not None:
        await svc.wait_any([job], wait)
    body = (await svc.store.results([job_id])).get(job_id)
    if body is not None:
        return web.Response(body=body, content_type="application/json")
    status = svc.store.status(job_id)
    if status is None:
        raise NotFound(f"job_id: unknown job {job_id!r}")
    return _json(JobStatusResponse(job_id=job_id, status=status), 202)


@routes.post("/poll")
async def poll(request: web.Request) -> web.Response:
    req = await _decode(request, PollRequest)
    svc = _service(request)
    store = svc.store
    known, live, unknown = [], [], []
    me = viewer(request).name
    for job_id in dict.fromkeys(req.job_ids):
        if store.status(job_id) is None or svc.foreign(job_id, me):
            unknown.append(job_id)
            continue
        known.append(job_id)
        job = store.get(job_id)
        if job is not None and not job.terminal:
            live.append(job)
    if len(live) == len(known):  # nothing finished yet: wait for the first to end
        await svc.wait_any(live, req.wait)
    done, pending = [], []
    bodies = await store.results(known, partial=True)  # committed ones now, the rest pending
    for job_id in known:
        body = bodies.get(job_id)
        if body is None:
            pending.append(job_id)
        else:
            done.append(msgspec.Raw(body))
    return _json(PollResponse(done=done, pending=pending, unknown=unknown))


@routes.delete("/jobs/{job_id}")
async def delete_job(request: web.Request) -> web.Response:
    svc = _service(request)
    job_id = request.match_info["job_id"]
    if not await svc.delete(job_id, viewer(request).name):
        raise NotFound(f"job_id: unknown job {job_id!r}")
    return web.Response(status=204)


@routes.post("/cancel")
async def cancel(request: web.Request) -> web.Response:
    req = await _decode(request, CancelRequest)
    if (req.job_id is None) == (req.job_ids is None):
        raise BadRequest("job_id or job_ids: give one of them, not both")
    ids = [req.job_id] if req.job_id is not None else req.job_ids or []
    return _json(await _service(request).cancel(ids, viewer(request).name))


# -- LLM backends ----------------------------------------------------------------------------


def _pool(request: web.Request) -> Any:
    pool = _service(request).shared.pool
    if pool is None:
        raise Unavailable("the LLM backend pool is not running", retry_after=1)
    return pool


@routes.post("/add_llm_server")
async def add_llm_server(request: web.Request) -> web.Response:
    req = await _decode(request, AddLLMServerRequest)
    pool = _pool(request)
    try:
        await pool.register(
            req.address,
            api=req.api,
            weight_version=req.weight_version,
            max_inflight=req.max_inflight,
            weight=req.weight,
            model=req.model,
        )
    except ValueError as exc:
        raise Unprocessable(str(exc)) from None
    return _json({"backends": pool.snapshot()})


@routes.post("/remove_llm_server")
async def remove_llm_server(request: web.Request) -> web.Response:
    req = await _decode(request, RemoveLLMServerRequest)
    pool = _pool(request)
    if not pool.remove(req.address):
        raise NotFound(f"address: no backend {req.address!r}")
    return _json({"backends": pool.snapshot()})


@routes.post("/clear_llm_server")
async def clear_llm_server(request: web.Request) -> web.Response:
    pool = _pool(request)
    pool.clear()
    return _json({"backends": pool.snapshot()})


# -- lifecycle and observation ---------------------------------------------------------------


@routes.post("/start")
async def start(request: web.Request) -> web.Response:
    svc = _service(request)
    svc.start()
    return _json(svc.status())


@routes.post("/stop")
async def stop(request: web.Request) -> web.Response:
    svc = _service(request)
    await svc.stop()
    return _json(svc.status())


@routes.post("/workers")
async def workers(request: web.Request) -> web.Response:
    req = await _decode(request, WorkersRequest)
    svc = _service(request)
    svc.resize_workers(req)
    return _json(svc.status())


@routes.get("/status")
async def status(request: web.Request) -> web.Response:
    return _json(_service(request).status(viewer(request)))


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    body = _service(request).metrics.render()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})


@routes.get("/healthz")
async def healthz(request: web.Request) -> web.Response:
    return _json({"ok": True})


@routes.get("/openapi.json")
async def openapi(request: web.Request) -> web.Response:
    return _json(openapi_document(tuple(_service(request).registry.names())))
