"""The pool of LLM backends: registration, routing, leases, health and failover.

A job takes ONE backend for its whole RUN stage (``async with pool.lease(timer) as llm``)
and makes every LLM call of that stage through it, so the engine's prefix cache keeps
hitting. The backend is picked by the fewest jobs in flight *now* divided by its
``weight``, ties going to the backend assigned least in total (:func:`least_inflight`).

Waiting: a backend at its ``max_inflight``, or no backend registered (a checkpoint swap
between ``clear()`` and ``add()``), or every registered backend unhealthy, makes the job
wait in FIFO order on a future (never a sleep loop). The wait pauses the job's timer and
is counted in :attr:`BackendPool.waiting`.

Registration (:meth:`BackendPool.register`) asks the engine's ``/v1/models`` for the model
name and its context window (``max_model_len``); an address that does not answer like an
engine is refused with :class:`RegistrationError`.

Health: connection errors, timeouts and 5xx count as failures; ``failure_threshold``
consecutive ones mark a backend unhealthy. It is then skipped for new leases and probed
(``GET {root}/health``) every ``probe_interval_s`` until it answers 200. A call that fails
that way is retried on another healthy backend (token-in makes this safe); the lease moves
with it and each Generation names the backend that produced it. When retries run out, or
no healthy backend is left to fail over to, the call raises :class:`BackendError`.

A stopping engine may keep a request's connection open and never answer it (vLLM after
SIGTERM), and a stopped one (SIGSTOP) answers nothing at all. So while a backend has calls
open it is probed too: ``failure_threshold`` consecutive failed probes (no answer within
``probe_timeout_s``, a refused connection, or a status other than 200) mark it unhealthy and
end its open calls at once, which then fail over like any other failure.

A weight call that gets no answer within ``weights_timeout_s`` (``llm.weights``) marks its
backend unhealthy the same way; that one is taken back only once it has been given the
current weights and version, not at its first 200.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any, Protocol

import aiohttp
import msgspec

from prorl_async.llm.backend import (
    Backend,
    BackendError,
    Lease,
    Picker,
    PoolConfig,
    least_inflight,
)
from prorl_async.llm.batching import PromptBatcher
from prorl_async.llm.engines import (
    EngineApi,
    EngineError,
    EngineUnavailable,
    ModelInfo,
    complete,
    engine_connector,
    fetch_model_info,
    models_url,
    server_root,
)
from prorl_async.llm.generation import Generation, Segment
from prorl_async.llm.weights import WeightUpdates
from prorl_async.util.tasks import cancel_and_wait
from prorl_async.util.timer import PausableTimer

__all__ = [
    "Backend",
    "BackendError",
    "BackendPool",
    "PoolObserver",
    "PoolStats",
    "RegistrationError",
    "Lease",
    "Picker",
    "PoolConfig",
    "least_inflight",
]


log = logging.getLogger(__name__)


class PoolObserver(Protocol):
    """What the pool reports of weight updates (the server's metrics implement it)."""

    def interrupted(self, tokens_kept: int, tokens_discarded: int) -> None: ...
    def paused(self, seconds: float) -> None: ...


class PoolStats(msgspec.Struct):
    """Counters of weight-update interruptions since the pool started."""

    interrupted: int = 0
    tokens_kept: int = 0
    tokens_discarded: int = 0


class RegistrationError(ValueError):
    """An address that does not answer like an engine; the message says what was tried."""


class _Waiter(msgspec.Struct):
    future: asyncio.Future[Backend]
    avoid: frozenset[str]


class BackendPool:
    """Registered LLM backends and the leases jobs hold on them (an async context manager).

    It owns an ``aiohttp.ClientSession`` (unless one is given) and the health-probe task;
    ``aclose()`` is idempotent and fails every job still waiting with :class:`BackendError`.
    """

    def __init__(
        self,
        config: PoolConfig | None = None,
        *,
        session: aiohttp.ClientSession | None = None,
        picker: Picker = least_inflight,
    ) -> None:
        self.config = config or PoolConfig()
        self.picker = picker
        self.observer: PoolObserver | None = None
        self.stats = PoolStats()
        self._weights: WeightUpdates | None = None
        self._backends: dict[str, Backend] = {}
        self._waiters: collections.deque[_Waiter] = collections.deque()
        self._session = session
        self._owns_session = session is None
        # Set while some backend is unhealthy or has calls open: the probe loop then runs.
        self._attention = asyncio.Event()
        self._probe_task: asyncio.Task[None] | None = None
        # One per vLLM backend address, with ``config.batch_prompts`` > 1.
        self._batchers: dict[str, PromptBatcher] = {}
        self._closed = False

    async def __aenter__(self) -> BackendPool:
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=engine_connector())
        self._probe_task = asyncio.create_task(self._probe_loop(), name="backend-probe")
        self._weights = WeightUpdates(self, self._session)
        return self

    @property
    def batchers(self) -> dict[str, PromptBatcher]:
        """The prompt batcher of each vLLM backend that has had calls (``batch_prompts`` > 1)."""
        return dict(self._batchers)

    @property
    def weights(self) -> WeightUpdates:
        """Pause, load and resume the engines' weights in place."""
        if self._weights is None:
            raise RuntimeError("BackendPool is not open (use 'async with BackendPool()')")
        return self._weights

    def poke(self) -> None:
        """Hand freed capacity to waiting jobs (after a resume)."""
        self._dispatch()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop probing, fail waiting jobs, close the owned session. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        for w in self._waiters:
            if not w.future.done():
                w.future.set_exception(BackendError("the backend pool is closed"))
        self._waiters.clear()
        if self._weights is not None:
            await self._weights.aclose()
        for b in self._backends.values():
            _unblock(b)  # calls waiting for a resume go on (and fail: the pool is closed)
        task, self._probe_task = self._probe_task, None
        if task is not None:
            await cancel_and_wait(task)
        for batcher in self._batchers.values():
            await batcher.aclose()
        if self._owns_session and self._session is not None:
            await self._session.close()

    # -- registry --------------------------------------------------------------------

    def add(
        self,
        address: str,
        *,
        api: EngineApi = "vllm",
        weight_version: int | str | None = None,
        max_inflight: int | None = None,
        weight: float = 1.0,
        model: str | None = None,
    ) -> Backend:
        """Register a backend, or update it (and mark it healthy) if the address is known."""
        b = self._backends.get(address) or Backend(address, api=api)
        if self._weights is not None:
            self._weights.forget(address)  # what it serves is what this registration says
        b.configure(
            api=api,
            weight_version=weight_version,
            max_inflight=max_inflight,
            weight=weight,
            model=model or self.config.model,
        )
        self._backends.setdefault(address, b)
        self._dispatch()
        return b

    async def register(
        self,
        address: str,
        *,
        api: EngineApi = "vllm",
        weight_version: int | str | None = None,
        max_inflight: int | None = None,
        weight: float = 1.0,
        model: str | None = None,
    ) -> Backend:
        """Check that ``address`` answers like an engine, then :meth:`add` it with the model
        name and context window the engine reports."""
        Backend(address, api=api)  # validates the address before any request
        info = await self._model_info(address, api)
        b = self.add(
            address,
            api=api,
            weight_version=weight_version,
            max_inflight=max_inflight,
            weight=weight,
            model=model or info.model,
        )
        b.max_model_len = info.max_model_len
        if info.root is not None and b.weights_path is None:
            b.weights_path = info.root
        return b

    async def _model_info(self, address: str, api: EngineApi) -> ModelInfo:
        assert self._session is not None
        timeout = self.config.register_timeout_s
        try:
            return await fetch_model_info(self._session, address, timeout, api)
        except EngineError as exc:
            hint = await self._v1_hint(address, api, exc)
            raise RegistrationError(
                f"address: {address} does not answer like a {api} engine: GET "
                f"{models_url(api, address)} failed ({_cause(exc)}){hint}"
            ) from None

    async def _v1_hint(self, address: str, api: EngineApi, exc: EngineError) -> str:
        root = address.rstrip("/")
        if api != "vllm" or root.endswith("/v1") or "HTTP 404" not in str(exc):
            return ""
        assert self._session is not None
        try:
            await fetch_model_info(self._session, f"{root}/v1", self.config.probe_timeout_s)
        except EngineError:
            return "; a vLLM address ends in /v1 (http://host:port/v1)"
        return f"; did you mean {root}/v1? (vLLM serves its API under /v1)"

    def remove(self, address: str) -> bool:
        """Unregister ``address``; jobs holding it keep it until their lease ends."""
        b = self._backends.pop(address, None)
        if b is not None:
            _unblock(b)
            if self._weights is not None:
                self._weights.forget(address)
        return b is not None

    def clear(self) -> None:
        """Unregister every backend; new leases wait for the next :meth:`add`."""
        for b in self._backends.values():
            _unblock(b)
            if self._weights is not None:
                self._weights.forget(b.address)
        self._backends.clear()

    def get(self, address: str) -> Backend | None:
        return self._backends.get(address)

    @property
    def backends(self) -> list[Backend]:
        return list(self._backends.values())

    def capacity(self) -> int | None:
        """RUN jobs the healthy backends serve at once: the sum of their ``max_inflight``
        (``None``: unknown, when some backend has no ``max_inflight`` or none is healthy)."""
        healthy = [b.max_inflight for b in self._backends.values() if b.healthy]
        if not healthy or any(n is None for n in healthy):
            return None
        return sum(n for n in healthy if n is not None)

    @property
    def waiting(self) -> int:
        """Jobs waiting for a backend right now."""
        return sum(1 for w in self._waiters if not w.future.done())

    def snapshot(self) -> list[dict[str, Any]]:
        """The ``/status`` ``backends`` list (API.md fields, registration order)."""
        return [b.snapshot() for b in self._backends.values()]

    # -- leases ----------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def lease(self, timer: PausableTimer | None = None) -> AsyncIterator[Lease]:
        """Hold one backend for a job's RUN stage; give it back however the body ends."""
        if self._closed or self._probe_task is None:
            raise RuntimeError("BackendPool is not open (use 'async with BackendPool()')")
        lease = Lease(self._call, await self._acquire(frozenset(), timer), timer)
        try:
            yield lease
        finally:
            held = lease._release_hold()
            if held is not None:
                self._release(held)

    async def _acquire(self, avoid: frozenset[str], timer: PausableTimer | None) -> Backend:
        if not self._waiters:
            b = self._pick(avoid)
            if b is not None:
                return self._reserve(b)
        waiter = _Waiter(asyncio.get_running_loop().create_future(), avoid)
        self._waiters.append(waiter)
        try:
            with timer.paused() if timer is not None else contextlib.nullcontext():
                return await waiter.future
        except BaseException:
            self._abandon(waiter)
            raise

    def _abandon(self, waiter: _Waiter) -> None:
        fut = waiter.future
        if fut.done() and not fut.cancelled() and fut.exception() is None:
            self._release(fut.result())  # handed a backend just as we were cancelled
        with contextlib.suppress(ValueError):
            self._waiters.remove(waiter)

    def _pick(self, avoid: frozenset[str]) -> Backend | None:
        free = [b for b in self._backends.values() if b.available()]
        preferred = [b for b in free if b.address not in avoid]
        candidates = preferred or free
        return self.picker(candidates) if candidates else None

    def _reserve(self, b: Backend) -> Backend:
        b.inflight += 1
        b.assigned += 1
        return b

    def _release(self, b: Backend) -> None:
        b.inflight -= 1
        self._dispatch()

    def _dispatch(self) -> None:
        """Hand free capacity to waiting jobs, first come first served."""
        while self._waiters:
            w = self._waiters[0]
            if w.future.done():
                self._waiters.popleft()
                continue
            b = self._pick(w.avoid)
            if b is None:
                return
            self._waiters.popleft()
            w.future.set_result(self._reserve(b))

    # -- calls, retries and failover -------------------------------------------------

    async def _call(
        self, lease: Lease, prompt_ids: list[int], max_tokens: int, sampling: dict[str, Any]
    ) -> Generation:
        """One turn: failover on engine errors, and an aborted request (a pause for a weight
        update) continued from the tokens it made, under the weights that follow."""
        turn = _Turn(prompt_ids, max_tokens)
        tried: set[str] = set()
        last: EngineUnavailable | None = None
        failures = 0
        while failures <= self.config.retries:
            b = lease.backend
            await self._until_resumed(b, lease.timer)
            if self._weights is not None and self._weights.pending(b):
                last = EngineUnavailable(b.address, "a weight operation timed out on it")
                failures += 1
                await self._fail_over(lease, b, tried, failures, last)
                continue
            try:
                gen = await self._complete(b, turn.prompt(), turn.left(), sampling, lease.timer)
            except EngineUnavailable as exc:
                last, failures = exc, failures + 1
                await self._fail_over(lease, b, tried, failures, exc)
                continue
            except EngineError as exc:
                raise BackendError(str(exc), address=b.address) from exc
            b.failures = 0
            aborted = gen.finish_reason == "abort"
            if not (aborted and self.config.on_interrupt == "regenerate"):
                turn.add(gen)  # else the turn starts over: what it made is thrown away
            if not aborted or turn.left() == 0:
                return turn.generation(gen)
            self._interrupted(b, gen)
            if not b.paused:  # aborted, but not by our pause: the engine is going away
                last, failures = EngineUnavailable(b.address, "aborted by the engine"), failures + 1
                await self._fail_over(lease, b, tried, failures, last)
        attempts = self.config.retries + 1
        msg = f"LLM call failed after {attempts} attempts: {last}"
        raise BackendError(msg, address=last.address if last else None) from last

    async def _fail_over(
        self, lease: Lease, b: Backend, tried: set[str], failures: int, exc: EngineError
    ) -> None:
        self._failed(b)
        tried.add(b.address)
        if failures <= self.config.retries:
            await self._move(lease, frozenset(tried), failures - 1, exc)

    def _interrupted(self, b: Backend, gen: Generation) -> None:
        made = len(gen.token_ids)
        kept, discarded = (0, made) if self.config.on_interrupt == "regenerate" else (made, 0)
        self.stats.interrupted += 1
        self.stats.tokens_kept += kept
        self.stats.tokens_discarded += discarded
        if self.observer is not None:
            self.observer.interrupted(kept, discarded)

    async def _until_resumed(self, b: Backend, timer: PausableTimer | None) -> None:
        """Wait (timer paused: it is not the job's time) while ``b`` is paused for weights."""
        if not b.paused:
            return
        with timer.paused() if timer is not None else contextlib.nullcontext():
            await b.resumed.wait()

    async def _complete(
        self,
        b: Backend,
        prompt_ids: list[int],
        max_tokens: int,
        sampling: dict[str, Any],
        timer: PausableTimer | None = None,
    ) -> Generation:
        assert self._session is not None
        timeout = self.config.request_timeout_s
        if b.api == "vllm" and b.model is None:
            b.model = (await fetch_model_info(self._session, b.address, timeout)).model
        sent = b.weight_version
        try:
            # Expired by the health probes if the engine stops answering (see module doc).
            async with asyncio.timeout(None) as stall:
                b.open_calls[stall] = timer
                b.idle.clear()
                self._attention.set()
                try:
                    if self.config.batch_prompts > 1 and b.api == "vllm":
                        assert b.model is not None
                        gen = await self._batcher(b).complete(
                            b.model, prompt_ids, max_tokens, sampling
                        )
                    else:
                        gen = await complete(
                            self._session,
                            b.api,
                            b.address,
                            prompt_ids,
                            max_tokens,
                            sampling,
                            model=b.model,
                            timeout_s=timeout,
                        )
                finally:
                    b.open_calls.pop(stall, None)
                    if not b.open_calls:
                        b.idle.set()
        except TimeoutError:
            n = self.config.failure_threshold
            msg = f"engine stopped answering ({n} health probes failed while the call was open)"
            raise EngineUnavailable(b.address, msg) from None
        # The version registered when the tokens came back: a checkpoint swap registered
        # while the request was held produced (some of) them with the new weights.
        got = b.weight_version
        segment = Segment(0, len(gen.token_ids), sent, got if got != sent else None)
        return msgspec.structs.replace(gen, weight_version=got, segments=[segment])

    def _batcher(self, b: Backend) -> PromptBatcher:
        batcher = self._batchers.get(b.address)
        if batcher is None:
            assert self._session is not None
            batcher = PromptBatcher(
                self._session,
                b.address,
                max_prompts=self.config.batch_prompts,
                timeout_s=self.config.request_timeout_s,
            )
            self._batchers[b.address] = batcher
        return batcher

    async def _move(
        self, lease: Lease, avoid: frozenset[str], attempt: int, cause: EngineError
    ) -> None:
        """Move the lease to the best other backend (or back to the same one, after a pause).

        With no backend registered at all (a checkpoint swap) it waits for one, like a new job.
        """
        if self._backends and not any(b.healthy for b in self._backends.values()):
            n = len(self._backends)
            msg = f"no healthy backend to fail over to ({n} registered); last error: {cause}"
            raise BackendError(msg, address=cause.address) from cause
        old = lease._release_hold()
        assert old is not None
        old.inflight -= 1  # give our slot back first: it may be the only one there is
        new = self._pick(avoid)
        if new is not None:
            self._reserve(new)
        self._dispatch()
        if new is None:
            new = await self._acquire(avoid, lease.timer)
        lease._hold(new)
        if new is old and self.config.retry_backoff_s > 0:
            await asyncio.sleep(self.config.retry_backoff_s * 2**attempt)

    # -- health ----------------------------------------------------------------------

    def _failed(self, b: Backend) -> None:
        b.failures += 1
        if b.healthy and b.failures >= self.config.failure_threshold:
            self._mark_unhealthy(b, f"{b.failures} calls in a row failed")

    def _mark_unhealthy(self, b: Backend, why: str) -> None:
        log.warning(
            "LLM backend %s marked unhealthy: %s; probing %s/health",
            b.address,
            why,
            server_root(b.address),
        )
        b.healthy = False
        self._attention.set()

    def lost(self, b: Backend, why: str) -> None:
        """A weight call gave up on ``b``: unhealthy now, and its open calls end (they
        fail over like any engine failure). It comes back through ``weights.resync``."""
        if b.healthy:
            self._mark_unhealthy(b, why)
        for stall in list(b.open_calls):
            stall.reschedule(asyncio.get_running_loop().time())

    def revive(self, b: Backend) -> None:
        """``b`` answers again: healthy, and given waiting jobs."""
        b.healthy, b.failures, b.probe_failures = True, 0, 0
        log.info("LLM backend %s healthy again", b.address)
        self._dispatch()

    async def _probe_loop(self) -> None:
        """Probe unhealthy backends (to take them back) and backends with calls open (to
        find one that stopped answering), every ``probe_interval_s`` while there are any."""
        while True:
            await self._attention.wait()
            # A probe period, not synchronisation: health is sampled on a clock.
            await asyncio.sleep(self.config.probe_interval_s)
            targets = [b for b in self._backends.values() if not b.healthy or b.open_calls]
            if not targets:
                self._attention.clear()
                continue
            answers = await asyncio.gather(*(self._probe(b) for b in targets))
            for b, ok in zip(targets, answers, strict=True):
                if self._backends.get(b.address) is b:
                    self._probed(b, ok)
            self._dispatch()

    def _probed(self, b: Backend, ok: bool) -> None:
        if not b.healthy:
            if ok and self._weights is not None and self._weights.pending(b):
                self._weights.resync(b)  # taken back once it has the current weights
            elif ok:
                self.revive(b)
            return
        b.probe_failures = 0 if ok else b.probe_failures + 1
        if b.probe_failures >= self.config.failure_threshold:
            self._mark_unhealthy(b, f"{b.probe_failures} health probes failed with calls open")
            for stall in list(b.open_calls):
                stall.reschedule(asyncio.get_running_loop().time())

    async def _probe(self, b: Backend) -> bool:
        assert self._session is not None
        url = f"{server_root(b.address)}/health"
        timeout = aiohttp.ClientTimeout(total=self.config.probe_timeout_s)
        try:
            async with self._session.get(url, timeout=timeout) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False


def _cause(exc: EngineError) -> str:
    text = str(exc)
    prefix = f"{exc.address}: "
    return text[len(prefix) :] if text.startswith(prefix) else text


def _unblock(b: Backend) -> None:
    # An unregistered (or closing) backend is no longer paused by us: calls waiting for
    # its resume go on rather than wait for a resume that will never be asked for.
    b.paused = False
    b.resumed.set()


class _Turn:
    """One turn's tokens so far, across the engine calls an interruption splits it into."""

    __slots__ = ("prompt_ids", "max_tokens", "ids", "logprobs", "segments", "clamped")

    def __init__(self, prompt_ids: list[int], max_tokens: int) -> None:
        self.prompt_ids, self.max_tokens = prompt_ids, max_tokens
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.segments: list[Segment] = []
        self.clamped = 0

    def prompt(self) -> list[int]:
        # The caller's buffer as is until a call was interrupted (no copy on the hot path).
        return self.prompt_ids + self.ids if self.ids else self.prompt_ids

    def left(self) -> int:
        return self.max_tokens - len(self.ids)

    def add(self, gen: Generation) -> None:
        at = len(self.ids)
        for seg in gen.segment_list():
            if seg.end > seg.start:
                self.segments.append(
                    msgspec.structs.replace(seg, start=seg.start + at, end=seg.end + at)
                )
        self.ids.extend(gen.token_ids)
        self.logprobs.extend(gen.logprobs)
        self.clamped += gen.clamped

    def generation(self, last: Generation) -> Generation:
        # An abort that filled max_tokens is a turn cut at its length.
        finish = "length" if last.finish_reason == "abort" else last.finish_reason
        if len(self.ids) == len(last.token_ids) and finish == last.finish_reason:
            return last  # one uninterrupted call: its own Generation
        return Generation(
            self.ids,
            self.logprobs,
            finish,
            last.backend,
            last.weight_version,
            self.clamped,
            self.segments,
        )
