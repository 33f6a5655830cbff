"""HTTP routes (API.md). Thin: decode, call the service, encode."""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

import msgspec
from aiohttp import web

from prorl_async.api.access import viewer
from prorl_async.api.openapi import openapi_document
from prorl_async.api.params import query_seconds
from prorl_async.core.errors import BadRequest, NotFound, RequestTimeout, Unavailable
from prorl_async.schemas import (
    AddLLMServerRequest,
    BatchRequest,
    BatchResponse,
    CancelRequest,
    PollRequest,
    ProcessRequest,
    RemoveLLMServerRequest,
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


def _service(request: web.Request) -> RolloutService:
    return request.app[SERVICE]


# For the route families in their own modules (api/weights.py, ...).
decode_body = _decode
json_response = _json


# -- jobs ------------------------------------------------------------------------------------


@routes.post("/process")
async def process(request: web.Request) -> web.Response:
    req = await _decode(request, ProcessRequest)
    answer, created = await _service(request).submit(req, viewer(request).name)
    return _json(answer, 202 if created else 200)


@routes.post("/process/batch")
async def process_batch(request: web.Request) -> web.Response:
    req = await _decode(request, BatchRequest)
    ids = await _service(request).submit_batch(req.jobs, viewer(request).name)
    return _json(BatchResponse(job_ids=ids), 202)


@routes.get("/jobs/{job_id}")
async def get_job(request: web.Request) -> web.Response:
    wait = query_seconds(request.query, "wait")
    job_id = request.match_info["job_id"]
    answer = await _service(request).result(job_id, viewer(request).name, wait)
    if isinstance(answer, bytes):
        return web.Response(body=answer, content_type="application/json")
    return _json(answer, 202)


@routes.post("/poll")
async def poll(request: web.Request) -> web.Response:
    req = await _decode(request, PollRequest)
    return _json(await _service(request).poll(req.job_ids, req.wait, viewer(request).name))


@routes.delete("/jobs/{job_id}")
async def delete_job(request: web.Request) -> web.Response:
    job_id = request.match_info["job_id"]
    if not await _service(request).delete(job_id, viewer(request).name):
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


@routes.post("/add_llm_server")
async def add_llm_server(request: web.Request) -> web.Response:
    req = await _decode(request, AddLLMServerRequest)
    return _json({"backends": await _service(request).add_backend(req)})


@routes.post("/remove_llm_server")
async def remove_llm_server(request: web.Request) -> web.Response:
    req = await _decode(request, RemoveLLMServerRequest)
    return _json({"backends": _service(request).remove_backend(req.address)})


@routes.post("/clear_llm_server")
async def clear_llm_server(request: web.Request) -> web.Response:
    return _json({"backends": _service(request).clear_backends()})


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
    problem = _service(request).health()
    if problem is not None:  # alive, but it cannot take jobs durably now
        raise Unavailable(problem, retry_after=5)
    return _json({"ok": True})


@routes.get("/openapi.json")
async def openapi(request: web.Request) -> web.Response:
    return _json(openapi_document(tuple(_service(request).task_names())))
