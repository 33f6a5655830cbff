"""Clients for the LLM inference engines (vLLM, SGLang), token ids in and token ids out.

Each client sends one completion request over a shared ``aiohttp.ClientSession`` and
parses the answer into a :class:`~prorl_async.llm.generation.Generation`. No text ever goes
through a tokenizer here: the prompt is sent as token ids and the engine's own output
ids and logprobs come back unchanged (apart from clamping, below).

Logprobs that are missing, ``null`` or non-finite are replaced by :data:`LOGPROB_FLOOR`
(``-9999.0``, the same floor vLLM itself uses for ``-inf``) and counted in
``Generation.clamped``; they never make a call fail.

Errors are typed so the pool can decide what to retry:

- :class:`EngineUnavailable` - connection refused/reset, timeout, HTTP 5xx, HTTP 404 (a
  wrong address or model name). Retrying on another backend is safe (token-in) and may
  succeed.

A request the engine aborted (``finish_reason`` ``abort``: a pause for a weight update, an
engine draining) is not an error: its Generation holds the tokens made so far, with
``finish_reason`` ``"abort"``, and the pool continues the turn from them.
- :class:`EngineRejected` - another HTTP 4xx: the request itself was refused; retrying will
  not help.
- :class:`MalformedResponse` - the engine answered 2xx with something unparsable; the
  message names the missing or wrong field.
"""

from __future__ import annotations

import json
import math
from typing import Any, Literal

import aiohttp
import msgspec

from prorl_async.llm.generation import Generation

__all__ = [
    "ENGINE_KEEPALIVE_S",
    "LOGPROB_FLOOR",
    "EngineApi",
    "EngineError",
    "EngineRejected",
    "EngineUnavailable",
    "MalformedResponse",
    "ModelInfo",
    "clamp_logprobs",
    "complete",
    "complete_sglang",
    "complete_vllm",
    "engine_connector",
    "engine_pause",
    "engine_reload",
    "engine_resume",
    "engine_set_version",
    "fetch_model",
    "fetch_model_info",
    "models_url",
    "post_vllm_completions",
    "server_root",
]

EngineApi = Literal["vllm", "sglang"]

LOGPROB_FLOOR = -9999.0
"""Value substituted for a missing or non-finite logprob (vLLM clamps ``-inf`` to this too)."""

# Keys the clients set themselves; a job's sampling dict cannot override them.
_VLLM_RESERVED = frozenset(
    {"model", "prompt", "max_tokens", "logprobs", "return_token_ids", "stream", "n", "echo"}
)
_SGLANG_RESERVED = frozenset({"max_new_tokens", "max_tokens", "n"})


class EngineError(Exception):
    """An engine call failed; ``address`` is the backend that failed."""

    def __init__(self, address: str, message: str) -> None:
        super().__init__(f"{address}: {message}")
        self.address = address


class EngineUnavailable(EngineError):
    """The engine could not be reached, timed out, aborted, or answered 5xx (retryable)."""


class EngineRejected(EngineError):
    """The engine refused the request with a 4xx status (not retryable)."""

    def __init__(self, address: str, status: int, message: str) -> None:
        super().__init__(address, f"HTTP {status}: {message}")
        self.status = status


class MalformedResponse(EngineError):
    """The engine answered 2xx but the body is not the documented shape."""


def server_root(address: str) -> str:
    """The server root of an OpenAI-style address: ``http://h:p/v1`` -> ``http://h:p``."""
    root = address.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def clamp_logprobs(values: list[Any] | None, count: int) -> tuple[list[float], int]:
    """Make ``count`` finite logprobs out of ``values``; return them and how many were clamped.

    Missing entries (``values`` shorter than ``count``, or ``None``) and ``null``, NaN or
    infinite entries become :data:`LOGPROB_FLOOR`.
    """
    out: list[float] = []
    clamped = 0
    src = values or []
    for i in range(count):
        v = src[i] if i < len(src) else None
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
            out.append(float(v))
        else:
            out.append(LOGPROB_FLOOR)
            clamped += 1
    return out, clamped


# vLLM and SGLang (uvicorn) close a connection idle for 5 s (VLLM_HTTP_TIMEOUT_KEEP_ALIVE);
# aiohttp keeps one for 15 s. A request sent on a connection the engine is closing at that
# moment fails before the engine read it ("Can not write request body"), so the client
# gives an idle connection up well before the engine does.
ENGINE_KEEPALIVE_S = 3.0


def engine_connector() -> aiohttp.TCPConnector:
    """The connector of a session that talks to engines: no connection limit, idle
    connections dropped before the engines' own keep-alive timeout ends them."""
    return aiohttp.TCPConnector(limit=0, keepalive_timeout=ENGINE_KEEPALIVE_S)


async def _post_json(
    session: aiohttp.ClientSession,
    address: str,
    url: str,
    body: dict[str, Any],
    timeout_s: float | None,
) -> Any:
    """POST ``body`` and return the decoded JSON answer, mapping failures to typed errors."""
    try:
        async with session.post(
            url, json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as resp:
            text = await resp.text()
            status = resp.status
    except TimeoutError as exc:
        raise EngineUnavailable(address, f"no answer from {url} within {timeout_s} s") from exc
    except aiohttp.ClientError as exc:
        raise EngineUnavailable(address, f"{type(exc).__name__} on {url}: {exc}") from exc
    return _decode(address, url, status, text)


def _decode(address: str, url: str, status: int, text: str) -> Any:
    # 404: no such route or model here (a wrong address or name): the backend's fault, not
    # the request's, so it counts against the backend and the call moves elsewhere.
    if status >= 500 or status == 404:
        raise EngineUnavailable(address, f"HTTP {status} from {url}: {text[:200]}")
    if status >= 400:
        raise EngineRejected(address, status, f"{url}: {text[:500]}")
    try:
        # Stdlib json on purpose: engines may emit NaN/Infinity literals in logprobs.
        return json.loads(text)
    except ValueError as exc:
        raise MalformedResponse(address, f"{url} answered non-JSON: {text[:200]!r}") from exc


def _field(address: str, obj: Any, key: str, what: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise MalformedResponse(address, f"response has no {what}")
    return obj[key]


def _int_list(address: str, value: Any, what: str) -> list[int]:
    ok = isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value
    )
    if not ok:
        raise MalformedResponse(address, f"{what} is not a list of token ids: {value!r:.200}")
    return list(value)


def _finish(address: str, reason: Any, what: str) -> str:
    if reason in ("stop", "length", "abort"):
        return str(reason)
    raise MalformedResponse(address, f"{what} is {reason!r}, expected 'stop', 'length' or 'abort'")


def _check_logprob_len(address: str, values: Any, count: int, what: str) -> None:
    if isinstance(values, list) and len(values) > count:
        raise MalformedResponse(address, f"{what} has {len(values)} entries for {count} tokens")


class ModelInfo(msgspec.Struct, frozen=True):
    """What an engine says of the model it serves (``/v1/models``)."""

    model: str
    max_model_len: int | None = None
    # The model directory the engine loaded (vLLM's "root"), when it says.
    root: str | None = None


def models_url(api: EngineApi, address: str) -> str:
    """Where the engine lists its models: vLLM ``{address}/models`` (the address ends in
    ``/v1``), SGLang ``{root}/v1/models``."""
    if api == "sglang":
        return f"{server_root(address)}/v1/models"
    return f"{address.rstrip('/')}/models"


async def fetch_model_info(
    session: aiohttp.ClientSession,
    address: str,
    timeout_s: float | None = None,
    api: EngineApi = "vllm",
) -> ModelInfo:
    """The first model served at ``address``, with its context window when the engine says."""
    url = models_url(api, address)
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            text, status = await resp.text(), resp.status
    except TimeoutError as exc:
        raise EngineUnavailable(address, f"no answer from {url} within {timeout_s} s") from exc
    except aiohttp.ClientError as exc:
        raise EngineUnavailable(address, f"{type(exc).__name__} on {url}: {exc}") from exc
    data = _field(address, _decode(address, url, status, text), "data", "'data' in /models")
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):
        raise MalformedResponse(address, f"/models lists no model: {data!r:.200}")
    model = data[0].get("id")
    if not isinstance(model, str):
        raise MalformedResponse(address, f"/models entry has no string 'id': {data[0]!r:.200}")
    length = data[0].get("max_model_len")
    ok = isinstance(length, int) and not isinstance(length, bool) and length > 0
    root = data[0].get("root")
    return ModelInfo(model, length if ok else None, root if isinstance(root, str) else None)


async def fetch_model(
    session: aiohttp.ClientSession, address: str, timeout_s: float | None = None
) -> str:
    """The first model id served at ``{address}/models`` (vLLM's ``/v1/models``)."""
    return (await fetch_model_info(session, address, timeout_s)).model


def vllm_body(
    model: str, prompt_ids: list[int] | list[list[int]], max_tokens: int, sampling: dict[str, Any]
) -> dict[str, Any]:
    """The ``/v1/completions`` request body for a token-id prompt (or a list of them: one
    choice each, ``index`` giving its prompt's place)."""
    body = {k: v for k, v in sampling.items() if k not in _VLLM_RESERVED}
    body.update(
        model=model,
        prompt=prompt_ids,
        max_tokens=max_tokens,
        logprobs=0,
        return_token_ids=True,
        # Older servers ignore return_token_ids; this makes them name tokens "token_id:N".
        return_tokens_as_token_ids=True,
        stream=False,
    )
    return body


def _vllm_token_ids(address: str, choice: dict[str, Any], logprobs: Any) -> list[int]:
    if choice.get("token_ids") is not None:
        return _int_list(address, choice["token_ids"], "choices[0].token_ids")
    tokens = logprobs.get("tokens") if isinstance(logprobs, dict) else None
    if not isinstance(tokens, list):
        raise MalformedResponse(
            address, "choices[0] has neither token_ids nor logprobs.tokens 'token_id:N' strings"
        )
    ids: list[int] = []
    for tok in tokens:
        head, _, num = tok.partition(":") if isinstance(tok, str) else ("", "", "")
        if head != "token_id" or not num.lstrip("-").isdigit():
            raise MalformedResponse(address, f"logprobs.tokens entry {tok!r} is not 'token_id:N'")
        ids.append(int(num))
    return ids


def parse_vllm(address: str, payload: Any, weight_version: int | str | None = None) -> Generation:
    """Turn a ``/v1/completions`` answer into a Generation (see module doc for clamping)."""
    choices = _field(address, payload, "choices", "'choices'")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise MalformedResponse(address, f"'choices' is empty or not a list: {choices!r:.200}")
    choice = choices[0]
    logprobs = choice.get("logprobs")
    ids = _vllm_token_ids(address, choice, logprobs)
    raw = logprobs.get("token_logprobs") if isinstance(logprobs, dict) else None
    _check_logprob_len(address, raw, len(ids), "choices[0].logprobs.token_logprobs")
    values, clamped = clamp_logprobs(raw, len(ids))
    finish = _finish(address, choice.get("finish_reason"), "choices[0].finish_reason")
    return Generation(ids, values, finish, address, weight_version, clamped)


def sglang_body(prompt_ids: list[int], max_tokens: int, sampling: dict[str, Any]) -> dict[str, Any]:
    """The SGLang ``/generate`` request body for a token-id prompt."""
    params = {k: v for k, v in sampling.items() if k not in _SGLANG_RESERVED}
    params["max_new_tokens"] = max_tokens
    return {
        "input_ids": prompt_ids,
        "sampling_params": params,
        "return_logprob": True,
        "logprob_start_len": -1,
        "stream": False,
    }


def parse_sglang(address: str, payload: Any, weight_version: int | str | None = None) -> Generation:
    """Turn a SGLang ``/generate`` answer into a Generation."""
    ids = _int_list(address, _field(address, payload, "output_ids", "'output_ids'"), "output_ids")
    meta = _field(address, payload, "meta_info", "'meta_info'")
    if not isinstance(meta, dict):
        raise MalformedResponse(address, f"'meta_info' is not an object: {meta!r:.200}")
    triples = meta.get("output_token_logprobs")
    _check_logprob_len(address, triples, len(ids), "meta_info.output_token_logprobs")
    raw = [t[0] if isinstance(t, list | tuple) and t else None for t in triples or []]
    values, clamped = clamp_logprobs(raw, len(ids))
    reason = meta.get("finish_reason")
    kind = reason.get("type") if isinstance(reason, dict) else reason
    finish = _finish(address, kind, "meta_info.finish_reason.type")
    return Generation(ids, values, finish, address, weight_version, clamped)


async def complete_vllm(
    session: aiohttp.ClientSession,
    address: str,
    model: str,
    prompt_ids: list[int],
    max_tokens: int,
    sampling: dict[str, Any],
    *,
    timeout_s: float | None = None,
    weight_version: int | str | None = None,
) -> Generation:
    """One vLLM ``POST {address}/completions`` call with a token-id prompt."""
    body = vllm_body(model, prompt_ids, max_tokens, sampling)
    payload = await post_vllm_completions(session, address, body, timeout_s)
    return parse_vllm(address, payload, weight_version)


async def post_vllm_completions(
    session: aiohttp.ClientSession, address: str, body: dict[str, Any], timeout_s: float | None
) -> Any:
    """``POST {address}/completions`` with ``body``; the decoded answer (typed errors)."""
    url = f"{address.rstrip('/')}/completions"
    return await _post_json(session, address, url, body, timeout_s)


async def complete_sglang(
    session: aiohttp.ClientSession,
    address: str,
    prompt_ids: list[int],
    max_tokens: int,
    sampling: dict[str, Any],
    *,
    timeout_s: float | None = None,
    weight_version: int | str | None = None,
) -> Generation:
    """One SGLang ``POST {root}/generate`` call with ``input_ids``."""
    url = f"{server_root(address)}/generate"
    body = sglang_body(prompt_ids, max_tokens, sampling)
    payload = await _post_json(session, address, url, body, timeout_s)
    return parse_sglang(address, payload, weight_version)


async def complete(
    session: aiohttp.ClientSession,
    api: EngineApi,
    address: str,
    prompt_ids: list[int],
    max_tokens: int,
    sampling: dict[str, Any],
    *,
    model: str | None = None,
    timeout_s: float | None = None,
    weight_version: int | str | None = None,
) -> Generation:
    """Dispatch to the client for ``api``; vLLM needs ``model`` (see :func:`fetch_model`)."""
    if api == "sglang":
        return await complete_sglang(
            session,
            address,
            prompt_ids,
            max_tokens,
            sampling,
            timeout_s=timeout_s,
            weight_version=weight_version,
        )
    if model is None:
        raise ValueError("a vLLM completion needs a model name")
    return await complete_vllm(
        session,
        address,
        model,
        prompt_ids,
        max_tokens,
        sampling,
        timeout_s=timeout_s,
        weight_version=weight_version,
    )


# -- weight updates (vLLM dev mode, VLLM_SERVER_DEV_MODE=1; SGLang's own routes) ----------

# vLLM's pause modes are ours; SGLang calls "keep" in_place and has no "wait".
_SGLANG_PAUSE = {"abort": "abort", "keep": "in_place"}


async def _admin(
    session: aiohttp.ClientSession,
    address: str,
    path: str,
    body: dict[str, Any] | None,
    timeout_s: float | None,
) -> Any:
    """POST an admin call. Each one is idempotent (a second pause, resume or reload of the
    same path changes nothing), so a call whose connection dropped is sent once more on a
    new connection: a kept-alive connection the engine closed as it was reused."""
    url = f"{server_root(address)}{path}"
    try:
        return await _post_json(session, address, url, body or {}, timeout_s)
    except EngineUnavailable as exc:
        if not _dropped(exc.__cause__):
            raise
    return await _post_json(session, address, url, body or {}, timeout_s)


def _dropped(cause: BaseException | None) -> bool:
    """The connection broke (not refused, not timed out, not an HTTP answer)."""
    connect = aiohttp.ClientConnectorError
    broken = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)
    return isinstance(cause, broken) and not isinstance(cause, connect)


async def engine_pause(
    session: aiohttp.ClientSession,
    api: EngineApi,
    address: str,
    mode: str,
    timeout_s: float | None,
) -> None:
    """Pause generation natively: ``abort`` ends in-flight requests (they return what they
    made), ``keep`` freezes them, ``wait`` (vLLM) returns once they have finished."""
    if api == "sglang":
        if mode in _SGLANG_PAUSE:
            await _admin(
                session, address, "/pause_generation", {"mode": _SGLANG_PAUSE[mode]}, timeout_s
            )
        return  # "wait": the pool stops sending and waits for its calls itself
    await _admin(session, address, f"/pause?mode={mode}", None, timeout_s)


async def engine_resume(
    session: aiohttp.ClientSession, api: EngineApi, address: str, timeout_s: float | None
) -> None:
    path = "/continue_generation" if api == "sglang" else "/resume"
    await _admin(session, address, path, None, timeout_s)


async def engine_reload(
    session: aiohttp.ClientSession,
    api: EngineApi,
    address: str,
    path: str,
    version: int | str,
    timeout_s: float | None,
) -> None:
    """Load the checkpoint directory ``path`` in place, then drop the prefix cache (its
    keys were computed by the old weights)."""
    if api == "sglang":
        body = {
            "model_path": path,
            "weight_version": str(version),
            "abort_all_requests": False,
            "flush_cache": True,
        }
        answer = await _admin(session, address, "/update_weights_from_disk", body, timeout_s)
        if isinstance(answer, dict) and answer.get("success") is False:
            raise EngineRejected(address, 400, str(answer.get("message", answer))[:500])
        return
    body = {"method": "reload_weights", "kwargs": {"weights_path": path}}
    await _admin(session, address, "/collective_rpc", body, timeout_s)
    await _admin(session, address, "/reset_prefix_cache", None, timeout_s)


async def engine_set_version(
    session: aiohttp.ClientSession,
    api: EngineApi,
    address: str,
    version: int | str,
    timeout_s: float | None,
) -> None:
    """Tell the engine its weight version (what it reports in ``/weight_info``)."""
    body: dict[str, Any] = {"new_version": str(version)}
    if api == "sglang":
        body["abort_all_requests"] = False  # SGLang's default aborts every request
    await _admin(session, address, "/update_weight_version", body, timeout_s)
