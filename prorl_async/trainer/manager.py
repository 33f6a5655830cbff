"""``RolloutManager``: asynchronous GRPO/DAPO batches across many rollout servers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Coroutine, Iterable
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import aiohttp

from prorl_async.client import (
    BadGatewayError,
    GatewayTimeoutError,
    RolloutClient,
    RolloutError,
)
from prorl_async.trainer.cluster import load_cluster
from prorl_async.trainer.dispatch import Dispatcher, Settings, result_cost
from prorl_async.trainer.errors import (
    PromptsExhausted,
    RolloutStalled,
    TrainerError,
    WeightsFailed,
    WeightsTimeout,
)
from prorl_async.trainer.filters import GroupFilter, resolve_filter
from prorl_async.trainer.group import Group
from prorl_async.trainer.loop import LoopLag
from prorl_async.trainer.poller import PollHandlers, poll_loop, sync
from prorl_async.trainer.progress import Progress
from prorl_async.trainer.retry import transport_class
from prorl_async.trainer.servers import QUARANTINE_AFTER, ServerPool, ServerState
from prorl_async.trainer.staleness import Staleness
from prorl_async.trainer.watchdog import cancel_on_servers, expired_groups, stall_report

__all__ = ["RolloutManager"]

log = logging.getLogger(__name__)

DEFAULT_CAPACITY = 64
ENGINES_CHECK_S = 2.0
"""How often a server in rotation is checked for LLM engines (after a swap form set_weights)."""
_CLOSE_TIMEOUT_S = 10.0


class RolloutManager:
    """Keeps many rollout servers busy and hands out batches of filtered GRPO groups.

    ``async with RolloutManager(servers=[...], prompts=jobs, group_size=8, batch_groups=64)
    as m: batch = await m.next_batch()``. See docs/trainer.md.
    """

    def __init__(
        self,
        *,
        servers: Iterable[str] | None = None,
        cluster: str | Path | None = None,
        prompts: Iterable[dict[str, Any]],
        group_size: int,
        batch_groups: int,
        max_inflight_groups: int | None = None,
        server_queue: int | None = None,
        group_filter: str | GroupFilter | None = "nonzero_std",
        on_batch_full: Literal["carry", "cancel"] = "carry",
        max_version_lag: int | None = 1,
        token: str | None = None,
        max_infra_retries: int = 3,
        sample_deadline_s: float | None = 3600.0,
        stall_timeout_s: float = 600.0,
        run_id: str | None = None,
        progress: bool | None = None,
    ) -> None:
        self.urls = _server_urls(servers, cluster)
        _positive(group_size=group_size, batch_groups=batch_groups)
        inflight = 2 * batch_groups if max_inflight_groups is None else max_inflight_groups
        _positive(max_inflight_groups=inflight, stall_timeout_s=stall_timeout_s)
        if sample_deadline_s is not None:
            _positive(sample_deadline_s=sample_deadline_s)
        if server_queue is not None and server_queue < 0:
            raise ValueError(f"server_queue must be >= 0 or None, got {server_queue}")
        self.server_queue = server_queue
        if max_infra_retries < 0:
            raise ValueError(f"max_infra_retries must be >= 0, got {max_infra_retries}")
        if on_batch_full not in ("carry", "cancel"):
            raise ValueError(f"on_batch_full must be 'carry' or 'cancel', got {on_batch_full!r}")
        self.settings = Settings(
            group_size=group_size,
            batch_groups=batch_groups,
            max_inflight_groups=inflight,
            group_filter=resolve_filter(group_filter),
            max_infra_retries=max_infra_retries,
            carry=on_batch_full == "carry",
        )
        self.run_id = run_id or uuid.uuid4().hex[:10]
        self.sample_deadline_s = sample_deadline_s
        self.stall_timeout_s = stall_timeout_s
        self._staleness = Staleness(max_version_lag, batch_groups)
        self._prompts = iter(prompts)
        self._token = token
        self._progress = Progress(enabled=progress)
        self._session: aiohttp.ClientSession | None = None
        self._dispatcher: Dispatcher | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._lag = LoopLag()
        self._backends: list[str] | None = None
        self._swaps = 0  # set_weights(backends=...) calls started, and those pushing now
        self._swapping = 0
        self._closed = False

    # -- lifecycle ---------------------------------------------------------------------

    async def __aenter__(self) -> RolloutManager:
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        try:
            servers = await asyncio.gather(*(self._open_server(u) for u in self.urls))
            if all(s.quarantined for s in servers):
                raise TrainerError(f"no rollout server answered /status: {', '.join(self.urls)}")
        except BaseException:
            await self.aclose()
            raise
        pool = ServerPool(list(servers))
        dispatcher = Dispatcher(self.settings, self._prompts, pool, self._staleness, self.run_id)
        self._dispatcher = dispatcher
        handlers = PollHandlers(
            dispatcher.on_done, dispatcher.on_lost, dispatcher.server_failed, self._recovered
        )
        for server in pool:
            self._spawn(poll_loop(server, handlers, dispatcher.backoff))
        self._spawn(self._feed())
        self._spawn(self._lag.run())
        if self.sample_deadline_s is not None:
            self._spawn(self._watch_deadlines(self.sample_deadline_s))
        self._spawn(self._watch_engines())
        dispatcher.wake.set()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop the loops, cancel this manager's unfinished jobs on every server. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._progress.done()
        tasks, self._tasks = list(self._tasks), set()
        for task in tasks:
            task.cancel()
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
            if self._dispatcher is not None:
                self._dispatcher.wake.close()
                # shielded: a cancelled close still stops this manager's jobs on the servers
                await asyncio.shield(self._cancel_everything())
        finally:
            if self._session is not None:
                await self._session.close()

    async def _cancel_everything(self) -> None:
        assert self._dispatcher is not None
        _, ids = self._dispatcher.cancel_live()
        for server in self._dispatcher.pool:
            ids.update(dict.fromkeys(server.orphans, server.url))
            server.orphans.clear()
        try:
            async with asyncio.timeout(_CLOSE_TIMEOUT_S):
                await cancel_on_servers(self._dispatcher.pool, ids)
        except TimeoutError:
            log.warning("cancelling %d jobs on close timed out", len(ids))

    async def _open_server(self, url: str) -> ServerState:
        client = RolloutClient(url, token=self._token, session=self._session)
        server = ServerState(url, client, window(DEFAULT_CAPACITY, self.server_queue))
        try:
            status = await client.status()
        except Exception as exc:
            if transport_class(exc) is None:
                raise TrainerError(f"{url}: /status failed: {exc}") from exc
            log.warning("rollout server %s is unreachable (%s); quarantined", url, exc)
            server.stats.errors += 1
            server.quarantine()
            return server
        run_workers = int((status.get("workers") or {}).get("run") or DEFAULT_CAPACITY)
        server.capacity = window(run_workers, self.server_queue)
        sync(server, status)  # read results by cursor from the server's present on
        return server

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(self._guard(coro))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _guard(self, coro: Coroutine[Any, Any, None]) -> None:
        try:
            await coro
        except Exception as exc:
            if not isinstance(exc, TrainerError):  # a TrainerError reaches the caller as is
                log.exception("rollout manager loop failed")
            if self._dispatcher is not None:
                self._dispatcher.error = exc
                self._dispatcher.notify()

    # -- background loops --------------------------------------------------------------

    async def _feed(self) -> None:
        """One pass per wake-up; ``wake.wait()`` yields to the loop even when already woken."""
        dispatcher = self._require()
        while True:
            await dispatcher.wake.wait()
            dispatcher.admit()
            await dispatcher.dispatch()
            self._draw()

    async def _watch_deadlines(self, deadline_s: float) -> None:
        dispatcher = self._require()
        tick = min(1.0, deadline_s / 4)
        while True:
            await asyncio.sleep(tick)
            for group in expired_groups(dispatcher.reg, deadline_s, time.monotonic()):
                log.warning("prompt %s passed its %.0f s deadline; dropped", group.uid, deadline_s)
                dispatcher.fail_group(group, "deadline")

    async def _watch_engines(self) -> None:
        """A server in rotation with no LLM engine (restarted while this manager was not
        talking to it, so never quarantined) is quarantined: _recovered() then gives it
        the weights before it serves again."""
        dispatcher = self._require()
        while True:
            await asyncio.sleep(ENGINES_CHECK_S)
            for server in dispatcher.pool.healthy if self._backends is not None else ():
                swaps = self._swaps
                try:
                    status = await server.client.status()
                except Exception as exc:
                    if transport_class(exc) is None and not isinstance(exc, RolloutError):
                        raise
                    continue  # its poll loop counts transport failures
                if status.get("backends") or server.quarantined:
                    continue
                if self._swapping or swaps != self._swaps:
                    continue  # a swap between its clear and its add, perhaps
                log.warning("%s has no LLM engine (restarted?); quarantined", server.url)
                server.failures = max(server.failures, QUARANTINE_AFTER - 1)
                dispatcher.server_failed(server, ConnectionResetError("no LLM engine"))

    async def _recovered(self, server: ServerState) -> None:
        """Back from quarantine: the current weights first (a restarted server has none),
        then into rotation. A push that fails (an engine of the set is gone, or the server
        again) leaves it quarantined, to be probed and pushed again after a backoff; it
        must not end the server's poll loop."""
        while self._backends is not None and self._staleness.current is not None:
            version, backends = self._staleness.current, self._backends
            try:
                pushed = await self._push_weights(server, version, backends)
            except TrainerError as exc:
                log.warning("%s refused the weights (%s); still quarantined", server.url, exc)
                pushed = False
            if not pushed:
                server.failures += 1
                await asyncio.sleep(self._require().backoff.delay(server.failures))
                return
            if (version, backends) == (self._staleness.current, self._backends):
                break  # else set_weights() changed them meanwhile (it skipped this server)
        server.recover()
        self._require().wake.set()

    # -- public API --------------------------------------------------------------------

    async def next_batch(self) -> list[Group]:
        """Exactly ``batch_groups`` groups that passed the filter and are fresh enough.

        Cancellable at any await (a batch not handed out goes back to the ready queue);
        otherwise ends with a batch or an error (docs/trainer.md, "Errors").
        """
        dispatcher = self._require()
        start = time.monotonic()
        dispatcher.hungry = True
        self._staleness.batch_requested()
        while (batch := dispatcher.take_batch()) is None:
            self._raise_if_stuck(dispatcher)
            dispatcher.progress.clear()
            dispatcher.wake.set()
            await self._wait_progress(dispatcher, start)
            self._draw()
        if not self.settings.carry:
            dispatcher.hungry = False
            try:
                await self._cancel_unfinished(dispatcher)
            except BaseException:
                dispatcher.put_back(batch)
                raise
        dispatcher.hand_out(batch)
        dispatcher.metrics.batch_fill_s.append(time.monotonic() - start)
        self._progress.done()
        dispatcher.wake.set()
        return batch

    async def set_weights(
        self,
        *,
        version: int,
        backends: Iterable[str] | None = None,
        path: str | None = None,
        mode: str = "abort",
    ) -> None:
        """Give the servers the weights of ``version``, one of two ways.

        ``path``: every server loads that checkpoint directory on its engines in place
        (``POST /weights/load``: pause in ``mode``, load, resume; work in flight is kept).
        ``backends``: every server is pointed at these engine addresses instead (a swap).

        Raises :class:`WeightsTimeout` naming the engines that did not answer a load
        within their server's ``pool.weights_timeout_s`` (the version is recorded: the
        other engines serve it, and those are given it before they serve again), and
        :class:`WeightsFailed` naming the engines that failed their load (they serve their
        old weights; the version is recorded for the others).
        """
        dispatcher = self._require()
        if isinstance(version, bool) or not isinstance(version, int):
            raise TypeError(f"version must be an int, got {version!r}")
        if (backends is None) == (path is None):
            raise ValueError("set_weights: give exactly one of backends (a swap) or path")
        if mode not in ("abort", "keep", "wait"):
            raise ValueError(f"mode must be 'abort', 'keep' or 'wait', got {mode!r}")
        self._staleness.check(version)
        partial: list[WeightsFailed] = []
        if path is not None:
            loads = (self._load_weights(s, version, path, mode) for s in dispatcher.pool.healthy)
            partial = _partial(await asyncio.gather(*loads, return_exceptions=True))
        else:
            addresses = list(backends or ())
            if not addresses:
                raise ValueError("backends: give at least one LLM backend address")
            await self._swap(dispatcher, version, addresses)
        self._staleness.set_version(version)
        dispatcher.wake.set()
        if partial:
            # As the server answers: a timeout (504) wins over a failed load (502).
            timeouts = [p for p in partial if isinstance(p, WeightsTimeout)]
            kind = WeightsTimeout if timeouts else WeightsFailed
            engines = [e for p in timeouts or partial for e in p.engines]
            raise kind("; ".join(map(str, partial)), engines) from (timeouts or partial)[0]

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        """Start no group inside the block; on entry, wait until the groups running now
        have finished (they stay ready for the next batch).

        For work that shares the engines with the rollouts, such as a held-out evaluation:
        nothing of training runs while it does, so it neither queues behind rollouts nor
        leaves them generated for free. The wait is bounded as ``next_batch()`` is
        (``stall_timeout_s`` without a result raises :class:`RolloutStalled`); a
        ``next_batch()`` inside the block waits for the groups already ready or running.
        """
        dispatcher = self._require()
        dispatcher.holds += 1
        try:
            start = time.monotonic()
            while dispatcher.reg.groups:
                if dispatcher.error is not None:
                    raise dispatcher.error
                dispatcher.progress.clear()
                dispatcher.wake.set()
                await self._wait_progress(dispatcher, start)
            yield
        finally:
            dispatcher.holds -= 1
            dispatcher.wake.set()

    def metrics(self) -> dict[str, Any]:
        """Counters, waste by cause, version lags, per-server state; see docs/trainer.md."""
        dispatcher = self._require()
        out = dispatcher.metrics.to_dict()
        out["servers"] = {
            s.url: s.stats.to_dict(len(s.inflight), s.quarantined) for s in dispatcher.pool
        }
        out["prompts_taken"] = dispatcher.index
        out["inflight_groups"] = len(dispatcher.reg.groups)
        out["ready_groups"] = len(dispatcher.ready)
        out["resubmit_groups"] = len(dispatcher.resubmit)
        out["current_version"] = self._staleness.current
        out["loop_lag_ms"] = self._lag.to_dict()
        return out

    # -- helpers -----------------------------------------------------------------------

    def _require(self) -> Dispatcher:
        if self._closed:
            raise TrainerError("the RolloutManager is closed")
        if self._dispatcher is None:
            raise TrainerError("use the RolloutManager inside 'async with'")
        return self._dispatcher

    def _raise_if_stuck(self, dispatcher: Dispatcher) -> None:
        if dispatcher.error is not None:
            raise dispatcher.error
        idle = not dispatcher.reg.groups and not dispatcher.resubmit
        if idle and dispatcher.exhausted:
            m = dispatcher.metrics
            raise PromptsExhausted(
                f"prompts ran out: {len(dispatcher.ready)} of {self.settings.batch_groups} groups "
                f"ready for this batch ({m.returned} returned before, {m.filtered} filtered, "
                f"{m.failed} failed, {m.stale} stale)"
            )

    async def _wait_progress(self, dispatcher: Dispatcher, start: float) -> None:
        since = max(dispatcher.last_result, start)
        remaining = self.stall_timeout_s - (time.monotonic() - since)
        try:
            async with asyncio.timeout(max(remaining, 0.0)):
                await dispatcher.progress.wait()
        except TimeoutError:
            report = stall_report(dispatcher, self.stall_timeout_s, self._lag.to_dict())
            raise RolloutStalled(report["message"], report) from None

    async def _cancel_unfinished(self, dispatcher: Dispatcher) -> None:
        groups, ids = dispatcher.cancel_live()
        for group in groups:
            dispatcher.reg.release(group.uid)
        for result in await cancel_on_servers(dispatcher.pool, ids):
            dispatcher.metrics.waste("cancelled", *result_cost(result))

    async def _swap(self, dispatcher: Dispatcher, version: int, addresses: list[str]) -> None:
        """Push ``addresses`` at ``version`` to every server in rotation; one back from
        quarantine meanwhile was given the previous weights, so it is pushed these too."""
        self._swaps += 1
        self._swapping += 1
        try:
            pushed: list[ServerState] = []
            while missed := [s for s in dispatcher.pool.healthy if s not in pushed]:
                pushed += missed
                await asyncio.gather(*(self._push_weights(s, version, addresses) for s in missed))
        finally:
            self._swapping -= 1
        self._backends = addresses

    async def _load_weights(self, server: ServerState, version: int, path: str, mode: str) -> None:
        try:
            await server.client.load_weights(version, path, mode)
        except GatewayTimeoutError as exc:
            if not exc.timed_out:  # not our server's answer: something in between
                self._require().server_failed(server, exc)
                return
            engines = ", ".join(exc.timed_out)
            msg = (
                f"{server.url}: set_weights(path=...): engine {engines} did not answer within "
                f"the server's pool.weights_timeout_s; it is out of rotation until it answers "
                f"and is given version {version}: {exc.detail}"
            )
            raise WeightsTimeout(msg, list(exc.timed_out)) from exc
        except BadGatewayError as exc:
            if not exc.failed:  # not our server's answer: something in between
                self._require().server_failed(server, exc)
                return
            msg = (
                f"{server.url}: set_weights(path=...): engine {', '.join(exc.failed)} failed "
                f"the load of version {version} and serves its old weights: {exc.detail}"
            )
            raise WeightsFailed(msg, list(exc.failed)) from exc
        except Exception as exc:
            if transport_class(exc) is None:
                raise TrainerError(f"{server.url}: set_weights(path=...) failed: {exc}") from exc
            self._require().server_failed(server, exc)

    async def _push_weights(self, server: ServerState, version: int, addresses: list[str]) -> bool:
        """``False``: the server was unreachable, and is quarantined."""
        try:
            await server.client.clear_llm_server()
            for address in addresses:
                await server.client.add_llm_server(address, weight_version=version)
        except Exception as exc:
            if transport_class(exc) is None:
                raise TrainerError(f"{server.url}: set_weights failed: {exc}") from exc
            # It may have lost its engines (a clear whose answer was lost), or be down and
            # come back with none: out of rotation until _recovered() gives it the weights.
            server.failures = max(server.failures, QUARANTINE_AFTER - 1)
            self._require().server_failed(server, exc)
            return False
        return True

    def _draw(self) -> None:
        dispatcher = self._dispatcher
        if dispatcher is not None:
            self._progress.draw(
                len(dispatcher.ready),
                self.settings.batch_groups,
                dispatcher.pool.inflight,
                dispatcher.metrics.pass_rate,
            )


def window(run_workers: int, server_queue: int | None) -> int:
    """Jobs this manager keeps on a server with ``run_workers`` RUN workers: those, plus
    ``server_queue`` queued behind them (None: as many again). Jobs waiting at the server
    start the moment a worker frees, where a window of exactly the workers leaves each
    freed one idle for a round trip (the result read, the next submit and its commit):
    on a fast engine whose requests finish together that idled it a third of the time."""
    return run_workers + (run_workers if server_queue is None else server_queue)


def _partial(outcomes: list[Any]) -> list[WeightsFailed]:
    """The loads some engines did not take (timed out or failed); any other error is
    raised as is."""
    for out in outcomes:
        if isinstance(out, BaseException) and not isinstance(out, WeightsFailed):
            raise out
    return [out for out in outcomes if isinstance(out, WeightsFailed)]


def _server_urls(servers: Iterable[str] | None, cluster: str | Path | None) -> list[str]:
    if (servers is None) == (cluster is None):
        raise ValueError("give exactly one of servers=[...] or cluster='cluster.json'")
    urls = [s.url for s in load_cluster(cluster).servers] if cluster else list(servers or ())
    if not urls:
        raise ValueError("servers: give at least one rollout server URL")
    bad = [u for u in urls if not u.startswith(("http://", "https://"))]
    if bad:
        raise ValueError(f"servers: not an http(s) URL: {bad}")
    return [u.rstrip("/") for u in dict.fromkeys(urls)]


def _positive(**values: float) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not value > 0:
            raise ValueError(f"{name} must be > 0, got {value!r}")
