"""HTTP routes of the scripted LLM: vLLM ``/v1/completions``, ``/v1/models``, SGLang
``/generate`` and ``/health``, with fault injection and the latency model applied."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import msgspec
from aiohttp import web
from tokenizers import Tokenizer

from prorl_async.scripted_llm.faults import Faults
from prorl_async.scripted_llm.latency import Decoder, Stats
from prorl_async.scripted_llm.records import LogEntry, Reply
from prorl_async.scripted_llm.weights import EngineWeights, WeightsRefused

__all__ = ["ScriptedEngine", "build_app"]


class ScriptedEngine(Protocol):
    """What the routes use of the engine they serve (``server.ScriptedLLM``)."""

    tokenizer: Tokenizer
    im_end: int
    model: str
    legacy_vllm: bool
    sglang_version_aborts: bool
    max_model_len: int
    stopping: asyncio.Event
    weights: EngineWeights
    log: list[LogEntry]
    stats: Stats
    rng: random.Random
    decoder: Decoder
    faults: Faults
    killed: asyncio.Event

    def respond(self, prompt_ids: list[int], max_tokens: int) -> Reply: ...
    async def arrive(self, entry: LogEntry) -> None: ...


_LLM: web.AppKey[ScriptedEngine] = web.AppKey("scripted_llm")


class BadRequest(Exception):
    """A request field is missing or of the wrong type (answered 400)."""


class _Request(msgspec.Struct, frozen=True):
    prompt_ids: list[int]
    max_tokens: int
    logprobs: bool
    as_token_ids: bool = False
    return_token_ids: bool = False


def build_app(llm: ScriptedEngine) -> web.Application:
    """The aiohttp application serving ``llm``."""
    app = web.Application()
    app[_LLM] = llm
    app.router.add_get("/health", _health)
    app.router.add_get("/v1/models", _models)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_post("/generate", _generate)
    # Weight updates: vLLM's dev-mode routes and SGLang's own.
    for path, route in _WEIGHT_ROUTES.items():
        app.router.add_route("GET" if path in _GETS else "POST", path, route)
    return app


def _json(status: int, payload: Any) -> web.Response:
    # Stdlib json on purpose: it writes NaN for injected non-finite logprobs.
    return web.Response(status=status, text=json.dumps(payload), content_type="application/json")


def _error(status: int, message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "BadRequestError", "code": status}}


async def _health(request: web.Request) -> web.Response:
    llm = request.app[_LLM]
    return web.Response(status=503 if llm.faults.down else 200)


async def _models(request: web.Request) -> web.Response:
    llm = request.app[_LLM]
    if llm.faults.down:
        return _json(503, _error(503, "server is down (fault injection)"))
    card = {
        "id": llm.model,
        "object": "model",
        "owned_by": "scripted-llm",
        "root": llm.model,
        "max_model_len": llm.max_model_len,
    }
    return _json(200, {"object": "list", "data": [card]})


def _token_list(value: Any, field: str) -> list[int]:
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], list):
        value = value[0]  # a batch of one prompt
    ok = isinstance(value, list) and value and all(type(t) is int for t in value)
    if not ok:
        raise BadRequest(f"'{field}' must be a non-empty list of token ids (no text prompts)")
    return list(value)


def _positive(value: Any, field: str) -> int:
    if type(value) is not int or value < 1:
        raise BadRequest(f"'{field}' must be a positive integer, got {value!r}")
    return value


def _parse_vllm(llm: ScriptedEngine, body: dict[str, Any]) -> _Request:
    if body.get("model") != llm.model:
        raise LookupError(f"The model `{body.get('model')}` does not exist.")
    if body.get("stream"):
        raise BadRequest("'stream' is not supported by the scripted LLM")
    logprobs = body.get("logprobs")
    if logprobs is not None and type(logprobs) is not int:
        raise BadRequest(f"'logprobs' must be an integer, got {logprobs!r}")
    return _Request(
        prompt_ids=_token_list(body.get("prompt"), "prompt"),
        max_tokens=_positive(body.get("max_tokens", 16), "max_tokens"),
        logprobs=logprobs is not None,
        as_token_ids=bool(body.get("return_tokens_as_token_ids")),
        return_token_ids=bool(body.get("return_token_ids")) and not llm.legacy_vllm,
    )


def _parse_sglang(llm: ScriptedEngine, body: dict[str, Any]) -> _Request:
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise BadRequest("'sampling_params' must be an object")
    return _Request(
        prompt_ids=_token_list(body.get("input_ids"), "input_ids"),
        max_tokens=_positive(params.get("max_new_tokens", 128), "sampling_params.max_new_tokens"),
        logprobs=bool(body.get("return_logprob")),
    )


def _render_vllm(llm: ScriptedEngine, req: _Request, reply: Reply) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": 0,
        "text": reply.text,
        "logprobs": None,
        "finish_reason": reply.finish_reason,
        "stop_reason": None,
    }
    if req.logprobs:
        tokens = [
            f"token_id:{t}" if req.as_token_ids else llm.tokenizer.id_to_token(t) or ""
            for t in reply.token_ids
        ]
        choice["logprobs"] = {
            "text_offset": list(range(len(tokens))),
            "token_logprobs": reply.logprobs,
            "tokens": tokens,
            "top_logprobs": [{tok: lp} for tok, lp in zip(tokens, reply.logprobs, strict=True)],
        }
    if req.return_token_ids:
        choice["token_ids"] = reply.token_ids
        choice["prompt_token_ids"] = req.prompt_ids
    usage = {"prompt_tokens": len(req.prompt_ids), "completion_tokens": len(reply.token_ids)}
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    return {
        "id": f"cmpl-{len(llm.log)}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": llm.model,
        "choices": [choice],
        "usage": usage,
    }


def _render_sglang(llm: ScriptedEngine, req: _Request, reply: Reply) -> dict[str, Any]:
    if reply.finish_reason == "stop":
        finish: dict[str, Any] = {"type": "stop", "matched": llm.im_end}
    elif reply.finish_reason == "abort":
        finish = {"type": "abort", "message": "Abort before weight update"}
    else:
        finish = {"type": "length", "length": req.max_tokens}
    meta: dict[str, Any] = {
        "id": f"gen-{len(llm.log)}",
        "finish_reason": finish,
        "prompt_tokens": len(req.prompt_ids),
        "completion_tokens": len(reply.token_ids),
    }
    if req.logprobs:
        meta["output_token_logprobs"] = [
            [lp, t, None] for lp, t in zip(reply.logprobs, reply.token_ids, strict=True)
        ]
    return {"text": reply.text, "output_ids": reply.token_ids, "meta_info": meta}


_Parse = Callable[["ScriptedEngine", dict[str, Any]], _Request]
_Render = Callable[["ScriptedEngine", _Request, Reply], dict[str, Any]]


def _generation(parse: _Parse, render: _Render) -> Callable[[web.Request], Awaitable[Any]]:
    async def handler(request: web.Request) -> web.StreamResponse:
        llm = request.app[_LLM]
        try:
            body = json.loads(await request.read())
        except ValueError:
            body = None
        entry = LogEntry(route=request.path, body=body)
        async with llm.decoder.active():
            await llm.arrive(entry)
            return await _serve(llm, request, entry, parse, render)

    return handler


async def _serve(
    llm: ScriptedEngine, request: web.Request, entry: LogEntry, parse: _Parse, render: _Render
) -> web.StreamResponse:
    outcome = llm.faults.outcome(llm.rng)
    if outcome in ("hang", "drop"):
        entry.outcome = outcome
        if outcome == "hang":
            await llm.killed.wait()  # or until the client gives up and we are cancelled
        if request.transport is not None:
            request.transport.abort()
        return web.Response(status=204)
    if outcome == "error":
        return _answer(entry, "error", 503, _error(503, "injected server error"))
    try:
        if not isinstance(entry.body, dict):
            raise BadRequest("body must be a JSON object")
        req = parse(llm, entry.body)
        _check_window(llm, req)
    except BadRequest as exc:
        return _answer(entry, "bad_request", 400, _error(400, str(exc)))
    except LookupError as exc:
        return _answer(entry, "bad_request", 404, _error(404, str(exc)))
    abort = await llm.weights.admit()
    try:
        reply = llm.respond(req.prompt_ids, req.max_tokens)
        made = await llm.decoder.decode(len(reply.token_ids), llm.weights.step, abort)
    finally:
        llm.weights.finished()
    if made < len(reply.token_ids):  # aborted by a pause or a weight update
        ids = reply.token_ids[:made]
        text = llm.tokenizer.decode(ids, skip_special_tokens=False)
        reply = Reply(ids, reply.logprobs[:made], "abort", text)
    if llm.stopping.is_set():
        # Like vLLM after SIGTERM: the request is dropped inside, its connection never answered.
        entry.outcome = "stalled"
        await llm.killed.wait()
        if request.transport is not None:
            request.transport.abort()
        return web.Response(status=204)
    llm.stats.served += 1
    return _answer(entry, "ok", 200, render(llm, req, reply))


def _check_window(llm: ScriptedEngine, req: _Request) -> None:
    # vLLM's own check and wording (HTTP 400).
    if req.max_tokens > llm.max_model_len:
        raise BadRequest(
            f"max_tokens={req.max_tokens} cannot be greater than "
            f"max_model_len={llm.max_model_len}. Please request fewer output tokens."
        )
    total = len(req.prompt_ids) + req.max_tokens
    if total > llm.max_model_len:
        raise BadRequest(
            f"This model's maximum context length is {llm.max_model_len} tokens. However, you "
            f"requested {total} tokens ({len(req.prompt_ids)} in the messages, "
            f"{req.max_tokens} in the completion)."
        )


def _answer(entry: LogEntry, outcome: str, status: int, payload: Any) -> web.Response:
    entry.outcome, entry.status, entry.response = outcome, status, payload
    return _json(status, payload)


_completions = _generation(_parse_vllm, _render_vllm)
_generate = _generation(_parse_sglang, _render_sglang)


# -- weight updates (vLLM dev mode and SGLang) -------------------------------------------------


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        raw = json.loads(await request.read() or b"{}")
    except ValueError:
        return {}
    return raw if isinstance(raw, dict) else {}


async def _vllm_pause(request: web.Request) -> web.Response:
    mode = request.query.get("mode", "abort")
    if mode not in ("abort", "keep", "wait"):
        return _json(400, _error(400, f"unknown pause mode {mode!r}"))
    await request.app[_LLM].weights.pause(mode)
    return _json(200, {"status": "paused"})


async def _vllm_resume(request: web.Request) -> web.Response:
    request.app[_LLM].weights.resume()
    return _json(200, {"status": "resumed"})


async def _is_paused(request: web.Request) -> web.Response:
    return _json(200, {"is_paused": request.app[_LLM].weights.paused})


async def _collective_rpc(request: web.Request) -> web.Response:
    body = await _body(request)
    if body.get("method") != "reload_weights":
        return _json(400, _error(400, f"method {body.get('method')!r} is not supported"))
    try:
        path = str((body.get("kwargs") or {}).get("weights_path"))
        await request.app[_LLM].weights.reload(path)
    except WeightsRefused as exc:
        return _json(500, _error(500, f"Worker failed with error {exc}"))
    return _json(200, {"results": [None]})


async def _ok(request: web.Request) -> web.Response:
    return _json(200, {"success": True})


async def _update_weight_version(request: web.Request) -> web.Response:
    body = await _body(request)
    weights = request.app[_LLM].weights
    weights.version = str(body.get("new_version"))
    # SGLang aborts every request in flight unless told not to (vLLM never does).
    if request.app[_LLM].sglang_version_aborts and body.get("abort_all_requests", True):
        weights.abort_all()
    return _json(200, {"success": True, "new_version": weights.version})


async def _weight_info(request: web.Request) -> web.Response:
    return _json(200, {"weight_version": request.app[_LLM].weights.version})


async def _sglang_pause(request: web.Request) -> web.Response:
    mode = (await _body(request)).get("mode", "abort")
    if mode not in ("abort", "retract", "in_place"):
        return _json(400, _error(400, f"unknown pause mode {mode!r}"))
    await request.app[_LLM].weights.pause(mode)
    return _json(200, {"success": True})


async def _sglang_continue(request: web.Request) -> web.Response:
    request.app[_LLM].weights.resume()
    return _json(200, {"success": True})


async def _sglang_load(request: web.Request) -> web.Response:
    body = await _body(request)
    weights = request.app[_LLM].weights
    if body.get("abort_all_requests", False):
        weights.abort_all()
    version = body.get("weight_version")
    try:
        path = str(body.get("model_path"))
        await weights.reload(path, None if version is None else str(version))
    except WeightsRefused as exc:
        return _json(400, {"success": False, "message": f"Failed to load weights: {exc}"})
    return _json(200, {"success": True, "message": "Succeeded to update model weights."})


async def _get_weight_version(request: web.Request) -> web.Response:
    return _json(200, {"weight_version": request.app[_LLM].weights.version})


async def _scripted_weights(request: web.Request) -> web.Response:
    return _json(200, request.app[_LLM].weights.state())


_GETS = frozenset({"/is_paused", "/weight_info", "/get_weight_version", "/scripted/weights"})
_WEIGHT_ROUTES = {
    "/pause": _vllm_pause,
    "/resume": _vllm_resume,
    "/is_paused": _is_paused,
    "/collective_rpc": _collective_rpc,
    "/reset_prefix_cache": _ok,
    "/update_weight_version": _update_weight_version,
    "/weight_info": _weight_info,
    "/pause_generation": _sglang_pause,
    "/continue_generation": _sglang_continue,
    "/update_weights_from_disk": _sglang_load,
    "/get_weight_version": _get_weight_version,
    # The double's own: what it serves and whether a load is under way (no engine has it).
    "/scripted/weights": _scripted_weights,
}
