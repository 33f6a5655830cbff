"""Trainer-side Python client for the rollout server (aiohttp)."""

from __future__ import annotations

import io
from types import TracebackType
from typing import Any

import aiohttp
import msgspec

__all__ = [
    "BadGatewayError",
    "BadRequestError",
    "ConflictError",
    "ForbiddenError",
    "GatewayTimeoutError",
    "GoneError",
    "NotFoundError",
    "RolloutClient",
    "RolloutError",
    "InsufficientStorageError",
    "ServiceUnavailableError",
    "TooManyRequestsError",
    "UnauthorizedError",
    "UnprocessableError",
]


class RolloutError(Exception):
    """An error answer from the server; ``status`` and the problem ``detail`` are kept."""

    def __init__(self, status: int, detail: str, retry_after: float | None = None) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
        self.detail = detail
        self.retry_after = retry_after


class BadRequestError(RolloutError):
    """400: malformed body or a field of the wrong type."""


class UnauthorizedError(RolloutError):
    """401: missing or wrong token."""


class ForbiddenError(RolloutError):
    """403: this tenant may not call an admin route."""


class NotFoundError(RolloutError):
    """404: unknown job id or backend."""


class ConflictError(RolloutError):
    """409: a job id another tenant uses."""


class GoneError(RolloutError):
    """410: a ``/results`` cursor older than retention; ``oldest_seq`` is still held."""

    oldest_seq = 0


class TooManyRequestsError(RolloutError):
    """429: over this tenant's ``max_inflight``; ``retry_after`` says when to try again."""


class PayloadTooLargeError(RolloutError):
    """413: body over the server's limit."""


class UnprocessableError(RolloutError):
    """422: unknown task or an instance its handler rejects."""


class ServiceUnavailableError(RolloutError):
    """503: server stopped, admission full, or its job store's writer not committing;
    ``retry_after`` says when to try again."""


class InsufficientStorageError(ServiceUnavailableError):
    """507: the server's job store cannot write (its disk is full or failing); nothing
    was created. ``retry_after`` says when to try again (or use another server)."""


class BadGatewayError(RolloutError):
    """502: an engine failed a weight operation (it serves its old weights); ``failed``
    lists those engines (empty: a 502 from something in between)."""

    failed: tuple[str, ...] = ()


class GatewayTimeoutError(RolloutError):
    """504: an engine did not answer a weight call within ``pool.weights_timeout_s``;
    ``timed_out`` lists those engines (empty: a 504 from something in between)."""

    timed_out: tuple[str, ...] = ()


_ERRORS: dict[int, type[RolloutError]] = {
    400: BadRequestError,
    401: UnauthorizedError,
    403: ForbiddenError,
    404: NotFoundError,
    409: ConflictError,
    410: GoneError,
    413: PayloadTooLargeError,
    422: UnprocessableError,
    429: TooManyRequestsError,
    502: BadGatewayError,
    503: ServiceUnavailableError,
    504: GatewayTimeoutError,
    507: InsufficientStorageError,
}
_encoder = msgspec.json.Encoder()
_LARGE_BODY = 512 * 1024
_decoder = msgspec.json.Decoder()


class RolloutClient:
    """``async with RolloutClient(url) as c: job_id = await c.submit("math", {...})``."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        session: aiohttp.ClientSession | None = None,
        timeout_slack_s: float = 30.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = {"Content-Type": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._session = session
        self._own_session = session is None
        self._slack = timeout_slack_s

    async def __aenter__(self) -> RolloutClient:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0)
            self._session = aiohttp.ClientSession(connector=connector)
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._own_session and self._session is not None:
            await self._session.close()
        self._session = None

    async def _call(
        self, method: str, path: str, body: Any = None, *, wait: float = 0.0
    ) -> tuple[int, Any]:
        if self._session is None:
            raise RuntimeError("RolloutClient used outside 'async with'")
        data: bytes | io.BytesIO | None = None
        if body is not None:
            raw = _encoder.encode(body)
            # aiohttp streams a file-like body instead of copying a large one
            data = io.BytesIO(raw) if len(raw) > _LARGE_BODY else raw
        timeout = aiohttp.ClientTimeout(total=wait + self._slack)
        async with self._session.request(
            method, self.base_url + path, data=data, headers=self._headers, timeout=timeout
        ) as resp:
            raw = await resp.read()
            if resp.status >= 400:
                raise _error(resp.status, raw, resp.headers.get("Retry-After"))
            return resp.status, (_decoder.decode(raw) if raw else None)

    # -- jobs ------------------------------------------------------------------------------

    async def submit(
        self,
        task: str,
        instance: dict[str, Any],
        *,
        sampling_params: dict[str, Any] | None = None,
        job_id: str | None = None,
        timeout_s: float | None = None,
        metadata: dict[str, Any] | None = None,
        callback_url: str | None = None,
    ) -> str:
        """Submit one rollout; returns its job id at once."""
        body = _job(task, instance, sampling_params, job_id, timeout_s, metadata)
        if callback_url is not None:
            body["callback_url"] = callback_url
        _, out = await self._call("POST", "/process", body)
        return str(out["job_id"])

    async def submit_batch(self, jobs: list[dict[str, Any]]) -> list[str]:
        """Submit many; each element is a ``/process`` body. Ids come back in order."""
        _, out = await self._call("POST", "/process/batch", {"jobs": jobs})
        return list(out["job_ids"])

    async def result(self, job_id: str, wait: float = 0.0) -> dict[str, Any] | None:
        """The result document, or ``None`` if not terminal within ``wait`` seconds."""
        status, out = await self._call("GET", f"/jobs/{job_id}?wait={wait}", wait=wait)
        return out if status == 200 else None

    async def poll(self, job_ids: list[str], wait: float = 0.0) -> dict[str, Any]:
        """``{"done": [...], "pending": [...], "unknown": [...]}``."""
        _, out = await self._call("POST", "/poll", {"job_ids": job_ids, "wait": wait}, wait=wait)
        return dict(out)

    async def results(
        self, after: int | None = None, *, limit: int = 1000, wait: float = 0.0
    ) -> dict[str, Any]:
        """``{"results": [...], "next": seq, "epoch": str}``: this tenant's results after
        the cursor ``after`` (None: the oldest held) in seq order, waiting up to ``wait``
        seconds for one. Raises ``GoneError`` for a cursor older than retention."""
        query = f"?limit={limit}&wait={wait}" + ("" if after is None else f"&after={after}")
        _, out = await self._call("GET", "/results" + query, wait=wait)
        return dict(out)

    async def cancel(self, job_ids: str | list[str]) -> dict[str, list[str]]:
        body = {"job_id": job_ids} if isinstance(job_ids, str) else {"job_ids": job_ids}
        _, out = await self._call("POST", "/cancel", body)
        return dict(out)

    async def delete(self, job_id: str) -> None:
        await self._call("DELETE", f"/jobs/{job_id}")

    # -- server ----------------------------------------------------------------------------

    async def healthz(self) -> None:
        """``GET /healthz``: returns if the server is alive, raises otherwise."""
        await self._call("GET", "/healthz")

    async def status(self) -> dict[str, Any]:
        _, out = await self._call("GET", "/status")
        return dict(out)

    async def start(self) -> dict[str, Any]:
        _, out = await self._call("POST", "/start")
        return dict(out)

    async def stop(self) -> dict[str, Any]:
        _, out = await self._call("POST", "/stop")
        return dict(out)

    async def set_workers(
        self, *, init: int | None = None, run: int | None = None, eval: int | None = None
    ) -> dict[str, Any]:
        """Resize stage pools (``POST /workers``); returns the status document."""
        sizes = {"init": init, "run": run, "eval": eval}
        _, out = await self._call(
            "POST", "/workers", {k: v for k, v in sizes.items() if v is not None}
        )
        return dict(out)

    async def add_llm_server(
        self,
        address: str,
        *,
        weight_version: int | str | None = None,
        max_inflight: int | None = None,
        api: str = "vllm",
        weight: float | None = None,
        model: str | None = None,
    ) -> list[dict[str, Any]]:
        body: dict[str, Any] = {"address": address, "api": api}
        extra = {
            "weight_version": weight_version,
            "max_inflight": max_inflight,
            "weight": weight,
            "model": model,
        }
        body.update({k: v for k, v in extra.items() if v is not None})
        _, out = await self._call("POST", "/add_llm_server", body)
        return list(out["backends"])

    async def remove_llm_server(self, address: str) -> list[dict[str, Any]]:
        _, out = await self._call("POST", "/remove_llm_server", {"address": address})
        return list(out["backends"])

    async def clear_llm_server(self) -> list[dict[str, Any]]:
        _, out = await self._call("POST", "/clear_llm_server")
        return list(out["backends"])

    # -- weight updates in place (docs/API.md "Weight updates") ------------------------------

    async def weights(self) -> list[dict[str, Any]]:
        """``GET /weights``: per backend its version, whether paused, its last load."""
        _, out = await self._call("GET", "/weights")
        return list(out["backends"])

    async def pause_weights(
        self, mode: str = "abort", backends: list[str] | None = None, *, wait: float = 600.0
    ) -> dict[str, Any]:
        """Pause generation (``wait`` bounds a ``wait``-mode pause: in-flight turns finish)."""
        body: dict[str, Any] = {"mode": mode}
        if backends is not None:
            body["backends"] = backends
        _, out = await self._call("POST", "/weights/pause", body, wait=wait)
        return dict(out)

    async def resume_weights(
        self, version: int | str | None = None, backends: list[str] | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {} if version is None else {"version": version}
        if backends is not None:
            body["backends"] = backends
        _, out = await self._call("POST", "/weights/resume", body)
        return dict(out)

    async def load_weights(
        self, version: int | str, path: str, mode: str = "abort", *, wait: float = 900.0
    ) -> dict[str, Any]:
        """Pause, load ``path`` on every engine of the server in place, resume at ``version``
        (``wait`` bounds the whole operation: a ``wait``-mode pause and the loads)."""
        body = {"version": version, "path": path, "mode": mode}
        _, out = await self._call("POST", "/weights/load", body, wait=wait)
        return dict(out)


def _job(
    task: str,
    instance: dict[str, Any],
    sampling_params: dict[str, Any] | None,
    job_id: str | None,
    timeout_s: float | None,
    metadata: dict[str, Any] | None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"task": task, "instance": instance}
    extra = {
        "sampling_params": sampling_params,
        "job_id": job_id,
        "timeout_s": timeout_s,
        "metadata": metadata,
    }
    body.update({k: v for k, v in extra.items() if v is not None})
    return body


def _failed_engines(doc: dict[str, Any]) -> tuple[str, ...]:
    """The engines a weight operation's 502 names: a load's ``backends`` that failed, a
    pause's or resume's ``errors``."""
    backends = doc.get("backends")
    if isinstance(backends, dict):
        return tuple(str(a) for a, r in backends.items() if isinstance(r, dict) and r.get("error"))
    errors = doc.get("errors")
    return tuple(str(a) for a in errors) if isinstance(errors, dict) else ()


def _error(status: int, raw: bytes, retry_after: str | None) -> RolloutError:
    doc: Any = None
    try:
        doc = _decoder.decode(raw)
        detail = str(doc.get("detail", ""))
    except (msgspec.DecodeError, AttributeError):
        detail = raw.decode(errors="replace")[:500]
    after = float(retry_after) if retry_after and retry_after.isdigit() else None
    error = _ERRORS.get(status, RolloutError)(status, detail, after)
    if isinstance(error, GoneError) and isinstance(doc, dict):
        error.oldest_seq = int(doc.get("oldest_seq") or 0)
    if isinstance(error, GatewayTimeoutError) and isinstance(doc, dict):
        error.timed_out = tuple(str(a) for a in doc.get("timed_out") or ())
    if isinstance(error, BadGatewayError) and isinstance(doc, dict):
        error.failed = _failed_engines(doc)
    return error
