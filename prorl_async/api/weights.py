"""Routes of the weight updates: ``/weights``, ``/weights/pause``, ``/weights/resume``,
``/weights/load`` (the work is ``llm.weights.WeightUpdates``)."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

import msgspec
from aiohttp import web

from prorl_async.api.routes import SERVICE, decode_body, json_response
from prorl_async.core.errors import Unprocessable
from prorl_async.llm.weights import WeightsError, WeightUpdates
from prorl_async.schemas import WeightsLoadRequest, WeightsPauseRequest, WeightsResumeRequest

__all__ = ["weight_routes"]

weight_routes = web.RouteTableDef()
_encoder = msgspec.json.Encoder()


def _weights(request: web.Request) -> WeightUpdates:
    return request.app[SERVICE].weights()


async def _run(coro: Any) -> web.Response:
    try:
        return json_response(await coro)
    except WeightsError as exc:
        if exc.status == 422:
            raise Unprocessable(exc.detail) from None
        # problem+json with the operation's own answer as extension members: 502, or 504
        # when an engine did not answer within pool.weights_timeout_s (``timed_out``)
        problem = {
            "type": "about:blank",
            "title": HTTPStatus(exc.status).phrase,
            "status": exc.status,
            "detail": exc.detail,
            **exc.body,
        }
        return web.Response(
            body=_encoder.encode(problem),
            status=exc.status,
            content_type="application/problem+json",
        )


@weight_routes.get("/weights")
async def weights(request: web.Request) -> web.Response:
    return json_response({"backends": _weights(request).snapshot()})


@weight_routes.post("/weights/pause")
async def pause(request: web.Request) -> web.Response:
    req = await decode_body(request, WeightsPauseRequest)
    return await _run(_weights(request).pause(req.mode, req.backends))


@weight_routes.post("/weights/resume")
async def resume(request: web.Request) -> web.Response:
    req = await decode_body(request, WeightsResumeRequest)
    return await _run(_weights(request).resume(req.version, req.backends))


@weight_routes.post("/weights/load")
async def load(request: web.Request) -> web.Response:
    req = await decode_body(request, WeightsLoadRequest)
    return await _run(_weights(request).load(req.version, req.path, req.mode))
