"""Weight updates on the engines in place: pause, load a checkpoint, resume with a version.

The pool stops sending new requests to a paused backend (a job that needs it waits, its
timer paused) and the engine is paused natively:

- ``abort``: in-flight requests end now and return the tokens they made; the pool keeps
  them (with the version that made them) and, after the resume, continues each turn from
  prompt + those ids, so nothing generated is lost and a turn stays within its
  ``max_tokens``;
- ``keep``: the engine freezes its requests and resumes them (their jobs' timers are
  paused meanwhile); the tokens of such a turn cannot say where the new weights began;
- ``wait``: in-flight requests finish first.

``load`` pauses every engine, loads the checkpoint directory in place (vLLM
``reload_weights`` and a prefix-cache reset, SGLang ``update_weights_from_disk`` with
``abort_all_requests: false``), and resumes with the new version. A checkpoint that cannot
fit (no such directory, another architecture) is refused before anything is paused; an
engine that fails its load is resumed at its old version.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, Literal, Protocol

import aiohttp
import msgspec

from prorl_async.llm.backend import Backend, PoolConfig
from prorl_async.llm.engines import (
    EngineError,
    engine_pause,
    engine_reload,
    engine_resume,
    engine_set_version,
)
from prorl_async.util.timer import PausableTimer

__all__ = ["PauseMode", "WeightsError", "WeightUpdates", "checkpoint_problem"]

PauseMode = Literal["abort", "keep", "wait"]
# Architecture fields a checkpoint must share with what an engine serves.
_SHAPE = (
    "model_type",
    "architectures",
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "tie_word_embeddings",
)
_ADMIN_TIMEOUT_S = 60.0
_LOAD_TIMEOUT_S = 600.0


class _Observer(Protocol):
    def paused(self, seconds: float) -> None: ...


class _Pool(Protocol):
    """What weight updates use of the pool (``pool.BackendPool``)."""

    @property
    def config(self) -> PoolConfig: ...
    @property
    def backends(self) -> list[Backend]: ...
    @property
    def observer(self) -> _Observer | None: ...
    def poke(self) -> None: ...


class WeightsError(Exception):
    """A weight operation failed: ``status`` 422 (refused, nothing touched) or 502 (an
    engine failed); ``detail`` names the backend and the cause; ``body`` the full answer."""

    def __init__(self, status: int, detail: str, body: dict[str, Any] | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.body = status, detail, body or {}


class LoadResult(msgspec.Struct):
    load_s: float | None = None
    ok: bool = False
    error: str | None = None


def _config(directory: str) -> dict[str, Any] | None:
    try:
        data = json.loads((Path(directory) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def checkpoint_problem(path: str, serving: dict[str, str | None]) -> str | None:
    """Why ``path`` cannot be loaded on these backends (address -> the checkpoint each
    serves), or ``None``. Checked where this server can read the files."""
    directory = Path(path)
    if not directory.is_dir():
        return f"path: no such directory: {path}"
    new = _config(path)
    if new is None:
        return f"path: {path} has no readable config.json (not a model checkpoint)"
    if not any(directory.glob("*.safetensors")) and not any(directory.glob("*.bin")):
        return f"path: {path} has no weight files (*.safetensors or *.bin)"
    for address, current in serving.items():
        old = _config(current) if current else None
        if old is None:
            continue  # not readable from here: the engine will check
        for key in _SHAPE:
            if old.get(key) != new.get(key):
                return (
                    f"path: {path} does not fit backend {address}: {key} is "
                    f"{new.get(key)!r} there, {old.get(key)!r} in what it serves ({current})"
                )
    return None


class WeightUpdates:
    """The weight operations of one pool (``POST /weights/pause|resume|load``)."""

    def __init__(self, pool: _Pool, session: aiohttp.ClientSession) -> None:
        self.pool, self.session = pool, session
        self._paused_at: dict[str, float] = {}
        self._frozen: dict[str, list[PausableTimer]] = {}
        self._lock = asyncio.Lock()  # one weight operation at a time
        self._running: set[asyncio.Task[dict[str, Any]]] = set()

    async def _owned(self, coro: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
        """Run a weight operation to its end even if its caller goes away (a client that
        disconnects mid-load must not leave the engines paused)."""
        task = asyncio.create_task(coro, name="weights")
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        task.add_done_callback(_retrieve)  # its caller may be gone: nothing left unread
        return await asyncio.shield(task)

    async def aclose(self, grace_s: float = 30.0) -> None:
        """Let operations under way finish (bounded), then cancel what is left."""
        if not self._running:
            return
        _, pending = await asyncio.wait(set(self._running), timeout=grace_s)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)

    def select(self, addresses: list[str] | None) -> list[Backend]:
        """The backends named (all registered ones by default); unknown names are refused."""
        if addresses is None:
            return self.pool.backends
        known = {b.address: b for b in self.pool.backends}
        unknown = [a for a in addresses if a not in known]
        if unknown:
            raise WeightsError(422, f"backends: not registered: {', '.join(unknown)}")
        return [known[a] for a in dict.fromkeys(addresses)]

    # -- pause and resume --------------------------------------------------------------------

    async def pause(self, mode: PauseMode, addresses: list[str] | None = None) -> dict[str, Any]:
        backends = self.select(addresses)
        return await self._owned(self._locked_pause(mode, backends))

    async def _locked_pause(self, mode: PauseMode, backends: list[Backend]) -> dict[str, Any]:
        async with self._lock:
            return await self._pause(mode, backends)

    async def _pause(self, mode: PauseMode, backends: list[Backend]) -> dict[str, Any]:
        todo = [b for b in backends if not b.paused]
        interrupted = 0
        for b in todo:
            b.paused = True
            b.resumed.clear()
            self._paused_at[b.address] = time.monotonic()
            if mode == "abort":
                interrupted += len(b.open_calls)
            if mode == "keep":  # the engine freezes them: not their jobs' time
                self._frozen[b.address] = _pause_timers(b)
        errors = await _each(todo, lambda b: self._native_pause(b, mode))
        failed = [b for b in todo if b.address in errors]
        if failed:  # leave nothing half-paused: those engines take requests again
            await self._resume(None, failed)
            raise WeightsError(502, _describe("pause", errors), {"errors": errors})
        return {"paused": [b.address for b in backends], "interrupted": interrupted}

    async def _native_pause(self, b: Backend, mode: PauseMode) -> None:
        timeout = self.pool.config.request_timeout_s if mode == "wait" else _ADMIN_TIMEOUT_S
        await engine_pause(self.session, b.api, b.address, mode, timeout)
        if mode == "wait" and b.api == "sglang":
            await _calls_done(b, timeout)

    async def resume(
        self, version: int | str | None, addresses: list[str] | None = None
    ) -> dict[str, Any]:
        backends = self.select(addresses)
        return await self._owned(self._locked_resume(version, backends))

    async def _locked_resume(
        self, version: int | str | None, backends: list[Backend]
    ) -> dict[str, Any]:
        async with self._lock:
            errors = await self._resume(version, [b for b in backends if b.paused])
        if errors:
            raise WeightsError(502, _describe("resume", errors), {"errors": errors})
        return {"resumed": [b.address for b in backends], "version": version}

    async def _resume(self, version: int | str | None, backends: list[Backend]) -> dict[str, str]:
        """Resume ``backends`` at ``version`` (``None``: keep theirs); errors by address."""

        async def one(b: Backend) -> None:
            if version is not None and version != b.weight_version:
                # Before the engine resumes: tokens from then on carry the new version.
                b.weight_version = version
                await engine_set_version(self.session, b.api, b.address, version, _ADMIN_TIMEOUT_S)
            await engine_resume(self.session, b.api, b.address, _ADMIN_TIMEOUT_S)

        errors = await _each(backends, one)
        for b in backends:
            self._unpause(b)
        self.pool.poke()
        return errors

    def _unpause(self, b: Backend) -> None:
        b.paused = False
        b.resumed.set()
        for timer in self._frozen.pop(b.address, []):
            timer.resume()
        started = self._paused_at.pop(b.address, None)
        if started is not None and self.pool.observer is not None:
            self.pool.observer.paused(time.monotonic() - started)

    # -- load ------------------------------------------------------------------------------

    async def load(self, version: int | str, path: str, mode: PauseMode) -> dict[str, Any]:
        return await self._owned(self._locked_load(version, path, mode))

    async def _locked_load(self, version: int | str, path: str, mode: PauseMode) -> dict[str, Any]:
        async with self._lock:
            backends = self.pool.backends
            if not backends:
                raise WeightsError(422, "no backend registered: nothing to load the weights on")
            serving = {b.address: b.weights_path for b in backends}
            problem = await asyncio.to_thread(checkpoint_problem, path, serving)
            if problem is not None:
                raise WeightsError(422, problem)
            t0 = time.monotonic()
            await self._pause(mode, backends)
            results = {b.address: LoadResult() for b in backends}
            await asyncio.gather(*(self._load_one(b, path, version, results) for b in backends))
            ok = [b for b in backends if results[b.address].ok]
            failed = [b for b in backends if not results[b.address].ok]
            errors = await self._resume(version, ok)
            errors.update(await self._resume(None, failed))  # old weights, old version
            body = {
                "version": version,
                "paused_s": round(time.monotonic() - t0, 3),
                "backends": {a: msgspec.structs.asdict(r) for a, r in results.items()},
            }
        bad = {a: r.error or "" for a, r in results.items() if not r.ok} | errors
        if bad:
            raise WeightsError(502, _describe("load", bad), body)
        return body

    async def _load_one(
        self, b: Backend, path: str, version: int | str, results: dict[str, LoadResult]
    ) -> None:
        t0 = time.monotonic()
        try:
            await engine_reload(self.session, b.api, b.address, path, version, _LOAD_TIMEOUT_S)
        except EngineError as exc:
            results[b.address] = LoadResult(error=str(exc))
            return
        load_s = time.monotonic() - t0
        b.weights_path, b.loaded_at, b.last_load_s = path, time.time(), load_s
        results[b.address] = LoadResult(load_s=round(load_s, 3), ok=True)

    def snapshot(self) -> list[dict[str, Any]]:
        """``GET /weights``: per backend its version, whether paused, its last load."""
        return [
            {
                "address": b.address,
                "weight_version": b.weight_version,
                "paused": b.paused,
                "weights_path": b.weights_path,
                "loaded_at": b.loaded_at,
                "last_load_s": None if b.last_load_s is None else round(b.last_load_s, 3),
            }
            for b in self.pool.backends
        ]


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _pause_timers(b: Backend) -> list[PausableTimer]:
    frozen = [t for t in b.open_calls.values() if t is not None and t.running]
    for timer in frozen:
        timer.pause()
    return frozen


async def _calls_done(b: Backend, timeout_s: float | None) -> None:
    # SGLang has no "wait" pause: our own calls to it are what must finish.
    async with asyncio.timeout(timeout_s):
        await b.idle.wait()


async def _each(backends: list[Backend], op: Any) -> dict[str, str]:
    """Run ``op(b)`` on every backend at once; the errors by address."""
    outcomes = await asyncio.gather(*(op(b) for b in backends), return_exceptions=True)
    errors: dict[str, str] = {}
    for b, out in zip(backends, outcomes, strict=True):
        if isinstance(out, asyncio.CancelledError):
            raise out
        if isinstance(out, BaseException):
            errors[b.address] = f"{type(out).__name__}: {out}"
    return errors


def _describe(op: str, errors: dict[str, str]) -> str:
    return f"{op} failed on " + "; ".join(f"{a}: {e}" for a, e in errors.items())
