"""Trainer-side Python client for the rollout server (aiohttp)."""

from __future__ import annotations

import io
from types import TracebackType
from typing import Any

import aiohttp
import msgspec

__all__ = [
    "BadRequestError",
    "NotFoundError",
    "RolloutClient",
    "RolloutError",
    "ServiceUnavailableError",
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


class NotFoundError(RolloutError):
    """404: unknown job id or backend."""


class PayloadTooLargeError(RolloutError):
    """413: body over the server's limit."""


class UnprocessableError(RolloutError):
    """422: unknown task or an instance its handler rejects."""


class ServiceUnavailableError(RolloutError):
    """503: server stopped or admission full; ``retry_after`` says when to try again."""


_ERRORS: dict[int, type[RolloutError]] = {
    400: BadRequestError,
    401: UnauthorizedError,
    404: NotFoundError,
    413: PayloadTooLargeError,
    422: UnprocessableError,
    503: ServiceUnavailableError,
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
    ) -> str:
        """Submit one rollout; returns its job id at once."""
        body = _job(task, instance, sampling_params, job_id, timeout_s, metadata)
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


def _error(status: int, raw: bytes, retry_after: str | None) -> RolloutError:
    try:
        detail = str(_decoder.decode(raw).get("detail", ""))
    except (msgspec.DecodeError, AttributeError):
        detail = raw.decode(errors="replace")[:500]
    after = float(retry_after) if retry_after and retry_after.isdigit() else None
    return _ERRORS.get(status, RolloutError)(status, detail, after)
