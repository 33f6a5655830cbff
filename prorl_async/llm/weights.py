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
fit (no such directory, another architecture) is refused before anything is paused. The
engines whose load succeeded serve the new version; one that fails its load (or its
pause) is resumed at its old version.

Bounds: each engine's part of each step (its pause, its load, its resume with the
version) answers within ``pool.weights_timeout_s``; a ``wait`` pause, which waits for
turns each bounded by ``request_timeout_s``, within the larger of the two. An engine that
does not is *lost*: marked unhealthy (its open calls end and fail over, jobs waiting for
its resume fail over), left out of the rest of the operation, which answers 504 naming it.
Its version is unknown then. Later operations do not call it but record what it missed.
When its health probe answers 200 again it is given, before it serves, what the others
have: the checkpoint of the last load it missed is loaded again (it may or may not have
finished that load after we gave up; an in-place reload of the same path is harmless),
then its version is set and it is resumed (or left paused if the others are).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Literal, Protocol

import aiohttp
import msgspec

from prorl_async.llm.backend import Backend, PoolConfig
from prorl_async.llm.checkpoint import checkpoint_problem
from prorl_async.llm.engines import (
    EngineError,
    engine_pause,
    engine_reload,
    engine_resume,
    engine_set_version,
)
from prorl_async.llm.weight_outcomes import (
    EngineTimeout,
    LoadResult,
    Resync,
    Version,
    WeightsError,
    deferred,
    error_texts,
    gather_errors,
    load_results,
    merge_errors,
    resync_doc,
    weights_failure,
)
from prorl_async.util.timer import PausableTimer

__all__ = [
    "EngineTimeout",
    "PauseMode",
    "Resync",
    "WeightsError",
    "WeightUpdates",
    "checkpoint_problem",
]

log = logging.getLogger(__name__)

PauseMode = Literal["abort", "keep", "wait"]


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
    def lost(self, b: Backend, why: str) -> None: ...
    def revive(self, b: Backend) -> None: ...


class WeightUpdates:
    """The weight operations of one pool (``POST /weights/pause|resume|load``)."""

    def __init__(self, pool: _Pool, session: aiohttp.ClientSession) -> None:
        self.pool, self.session = pool, session
        self._paused_at: dict[str, float] = {}
        self._frozen: dict[str, list[PausableTimer]] = {}
        self._lock = asyncio.Lock()  # one weight operation at a time
        self._running: set[asyncio.Task[Any]] = set()
        self._resync: dict[str, Resync] = {}  # lost backends, by address
        self._resyncing: set[str] = set()
        self._closing = False

    def _own(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        task.add_done_callback(_retrieve)  # its caller may be gone: nothing left unread
        return task

    async def _owned(self, coro: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
        """Run a weight operation to its end even if its caller goes away (a client that
        disconnects mid-load must not leave the engines paused)."""
        result: dict[str, Any] = await asyncio.shield(self._own(coro, "weights"))
        return result

    async def aclose(self, grace_s: float = 30.0) -> None:
        """Let operations under way finish (bounded), then cancel what is left."""
        self._closing = True
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

    # -- bounds and lost backends --------------------------------------------------------

    async def _bounded(self, b: Backend, op: str, call: Awaitable[None], limit: float) -> None:
        try:
            async with asyncio.timeout(limit):
                await call
        except TimeoutError:
            raise EngineTimeout(b.address, op, limit) from None

    def _settle(
        self,
        errors: dict[str, Exception],
        backends: list[Backend],
        target: Callable[[Backend], Resync],
    ) -> None:
        """Take the backends that timed out out of rotation, to be given ``target(b)``."""
        for b in backends:
            exc = errors.get(b.address)
            if isinstance(exc, EngineTimeout):
                self._resync[b.address] = msgspec.structs.replace(target(b), reason=str(exc))
                b.weight_version = None  # unknown: it may or may not have loaded
                self.pool.lost(b, f"{exc}; out of rotation until it answers again")
                self._unpause(b)  # jobs waiting for its resume fail over now

    def _live(self, backends: list[Backend], **missed: Any) -> list[Backend]:
        """The backends to call; a lost one is not called, it gets ``missed`` on its return."""
        live = []
        for b in backends:
            target = self._resync.get(b.address)
            if target is None:
                live.append(b)
            else:
                self._resync[b.address] = msgspec.structs.replace(target, **missed)
        return live

    def pending(self, b: Backend) -> bool:
        """``b`` is out of rotation since a weight call timed out on it."""
        return b.address in self._resync

    def forget(self, address: str) -> None:
        """Registered again or removed: its registration says what it serves now."""
        self._resync.pop(address, None)

    def resync(self, b: Backend) -> None:
        """``b``, lost, answers its health probe again: give it what it missed, then take
        it back (in the background, after the operation under way)."""
        if b.address in self._resyncing or self._closing:
            return
        self._resyncing.add(b.address)
        task = self._own(self._resync_one(b), f"weights-resync {b.address}")
        task.add_done_callback(lambda _: self._resyncing.discard(b.address))

    async def _resync_one(self, b: Backend) -> None:
        # Not under the operations' lock (a wedged engine must not hold loads up): an
        # operation that changes what it missed meanwhile makes it given that too.
        while (target := self._resync.get(b.address)) is not None and b in self.pool.backends:
            try:
                await self._bounded(b, "resync", self._give(b, target), self._limit())
            except EngineError as exc:
                log.warning("LLM backend %s not taken back: %s; probing again", b.address, exc)
                return
            if self._resync.get(b.address) is target:
                self._take_back(b, target)
                return

    def _take_back(self, b: Backend, target: Resync) -> None:
        del self._resync[b.address]
        b.weight_version = target.version
        if target.path is not None:
            b.weights_path, b.loaded_at = target.path, time.time()
        if target.paused:
            self._mark_paused(b)
        self.pool.revive(b)
        log.info("LLM backend %s taken back at weight version %s", b.address, target.version)

    async def _give(self, b: Backend, target: Resync) -> None:
        version = target.version
        if target.path is not None:
            tag = "" if version is None else version
            await engine_reload(self.session, b.api, b.address, target.path, tag, None)
        if version is not None:
            await engine_set_version(self.session, b.api, b.address, version, None)
        if not target.paused:
            await engine_resume(self.session, b.api, b.address, None)

    def _limit(self) -> float:
        return self.pool.config.weights_timeout_s

    # -- pause and resume --------------------------------------------------------------------

    async def pause(self, mode: PauseMode, addresses: list[str] | None = None) -> dict[str, Any]:
        backends = self.select(addresses)
        return await self._owned(self._locked_pause(mode, backends))

    async def _locked_pause(self, mode: PauseMode, backends: list[Backend]) -> dict[str, Any]:
        async with self._lock:
            live = self._live(backends, paused=True)
            interrupted, errors = await self._pause(mode, live, None, None)
        if errors:
            raise weights_failure("pause", errors, {"errors": error_texts(errors)})
        return {"paused": [b.address for b in backends], "interrupted": interrupted}

    async def _pause(
        self, mode: PauseMode, backends: list[Backend], version: Version, path: str | None
    ) -> tuple[int, dict[str, Exception]]:
        """Pause ``backends``; one that timed out is lost (to be given ``version`` and
        ``path`` later), one that failed otherwise is resumed. The errors by address."""
        todo = [b for b in backends if not b.paused]
        interrupted = 0
        for b in todo:
            self._mark_paused(b)
            if mode == "abort":
                interrupted += len(b.open_calls)
            if mode == "keep":  # the engine freezes them: not their jobs' time
                self._frozen[b.address] = _pause_timers(b)
        errors = await gather_errors(todo, lambda b: self._native_pause(b, mode))
        # A lost engine missed this pause (alone: left paused) or this load.
        self._settle(
            errors,
            todo,
            lambda b: Resync(b.weight_version if version is None else version, path, path is None),
        )
        failed = [b for b in todo if b.address in errors and not self.pending(b)]
        if failed:  # leave nothing half-paused: those engines take requests again
            errors = merge_errors(errors, await self._resume(None, failed))
        return interrupted, errors

    def _mark_paused(self, b: Backend) -> None:
        b.paused = True
        b.resumed.clear()
        self._paused_at[b.address] = time.monotonic()

    async def _native_pause(self, b: Backend, mode: PauseMode) -> None:
        limit = self._limit()
        if mode == "wait":  # it waits for turns, each bounded by request_timeout_s
            limit = max(limit, self.pool.config.request_timeout_s or 0.0)

        async def call() -> None:
            await engine_pause(self.session, b.api, b.address, mode, None)
            if mode == "wait" and b.api == "sglang":
                await b.idle.wait()  # SGLang has no "wait": our own calls must finish

        await self._bounded(b, "pause", call(), limit)

    async def resume(
        self, version: int | str | None, addresses: list[str] | None = None
    ) -> dict[str, Any]:
        backends = self.select(addresses)
        return await self._owned(self._locked_resume(version, backends))

    async def _locked_resume(
        self, version: int | str | None, backends: list[Backend]
    ) -> dict[str, Any]:
        async with self._lock:
            missed: dict[str, Any] = {"paused": False}
            if version is not None:
                missed["version"] = version
            live = self._live(backends, **missed)
            errors = await self._resume(version, [b for b in live if b.paused])
        if errors:
            raise weights_failure("resume", errors, {"errors": error_texts(errors)})
        return {"resumed": [b.address for b in backends], "version": version}

    async def _resume(self, version: Version, backends: list[Backend]) -> dict[str, Exception]:
        """Resume ``backends`` at ``version`` (``None``: keep theirs); errors by address."""

        async def one(b: Backend) -> None:
            async def call() -> None:
                if version is not None and version != b.weight_version:
                    # Before the engine resumes: tokens from then on carry the new version.
                    b.weight_version = version
                    await engine_set_version(self.session, b.api, b.address, version, None)
                await engine_resume(self.session, b.api, b.address, None)

            await self._bounded(b, "resume", call(), self._limit())

        errors = await gather_errors(backends, one)
        # Its weight_version is changed only to a new ``version`` (set before the call).
        self._settle(errors, backends, lambda b: Resync(b.weight_version))
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
            live = self._live(backends, version=version, path=path, paused=False)
            results = {b.address: deferred(self._resync.get(b.address)) for b in backends}
            _, errors = await self._pause(mode, live, version, path)
            paused = [b for b in live if b.address not in errors]
            loads = await gather_errors(paused, lambda b: self._load_one(b, path, version, results))
            self._settle(loads, paused, lambda b: Resync(version, path))
            ok = [b for b in paused if b.address not in loads]
            failed = [b for b in paused if b.address in loads and not self.pending(b)]
            errors = merge_errors(merge_errors(errors, loads), await self._resume(version, ok))
            errors = merge_errors(errors, await self._resume(None, failed))  # at the old one
            results.update(load_results(errors))
            body = {
                "version": version,
                "paused_s": round(time.monotonic() - t0, 3),
                "backends": {a: msgspec.structs.asdict(r) for a, r in results.items()},
            }
        if errors:
            raise weights_failure("load", errors, body)
        return body

    async def _load_one(
        self, b: Backend, path: str, version: int | str, results: dict[str, LoadResult]
    ) -> None:
        t0 = time.monotonic()
        reload = engine_reload(self.session, b.api, b.address, path, version, None)
        await self._bounded(b, "load", reload, self._limit())
        load_s = time.monotonic() - t0
        b.weights_path, b.loaded_at, b.last_load_s = path, time.time(), load_s
        results[b.address] = LoadResult(load_s=round(load_s, 3), ok=True)

    def snapshot(self) -> list[dict[str, Any]]:
        """``GET /weights``: per backend its version, whether paused, its last load, whether
        healthy, and what it is given before it serves again if a weight call timed out."""
        return [
            {
                "address": b.address,
                "weight_version": b.weight_version,
                "paused": b.paused,
                "weights_path": b.weights_path,
                "loaded_at": b.loaded_at,
                "last_load_s": None if b.last_load_s is None else round(b.last_load_s, 3),
                "healthy": b.healthy,
                "resync": resync_doc(self._resync.get(b.address)),
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
