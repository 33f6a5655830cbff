"""``RolloutService``: the one façade over the pipeline, the job store and the shared parts.

Every operation a client can ask for is a method here (submit with its durable
acknowledgement, poll, read a result, the result cursor and event feed, cancel, the
LLM backends, the weights, the stage pools, status); the HTTP routes (``api``) only
decode, call one of them and encode, so the server, the tests, the benchmarks and an
embedding application all get the same answers.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec

from prorl_async.capacity.autoscale import Autoscaler
from prorl_async.capacity.budget import SandboxBudget
from prorl_async.capacity.view import CapacityView
from prorl_async.config import ServerConfig
from prorl_async.core.errors import (
    Conflict,
    Gone,
    NotFound,
    PayloadTooLarge,
    TooManyRequests,
    Unavailable,
    Unprocessable,
)
from prorl_async.core.handler import AgentHandler, HandlerRegistry, InstanceError
from prorl_async.core.job import Job, Stage
from prorl_async.core.jobstore import StoreUnavailable
from prorl_async.core.metrics import Metrics
from prorl_async.core.pipeline import Pipeline
from prorl_async.core.recovery import recover
from prorl_async.core.resultlog import LogEntry
from prorl_async.core.shared import Shared, open_shared
from prorl_async.core.tenantview import TenantCollector
from prorl_async.llm.pool import BackendPool
from prorl_async.llm.sampling import SamplingParamsError, check_sampling_params
from prorl_async.llm.weights import WeightUpdates
from prorl_async.notify.sender import CallbackSender
from prorl_async.schemas import (
    AddLLMServerRequest,
    CallbackInfo,
    CancelResponse,
    JobStatusResponse,
    PollResponse,
    ProcessRequest,
    ResultsResponse,
    StatusResponse,
    SubmitResponse,
    WorkersRequest,
)
from prorl_async.service.status import live_state, status_document
from prorl_async.store import JobStore, MemoryJobStore, SqliteJobStore, StateDirLock, set_aside
from prorl_async.tenancy import DEFAULT_TENANT, Tenant, Tenants
from prorl_async.util.tasks import cancel_and_wait

__all__ = ["RolloutService"]

log = logging.getLogger(__name__)

# Results the sweeper drops in one loop step at most (~1-2 ms of the loop's time).
_EXPIRE_SLICE = 512
# Seconds between two checks of the store's health (free space, an idle writer).
_WATCH_S = 1.0


class RolloutService:
    """Owns the store, the pipeline, the metrics and the server-wide shared parts."""

    def __init__(self, config: ServerConfig, registry: HandlerRegistry | None = None) -> None:
        self.config = config
        self.registry = registry if registry is not None else HandlerRegistry.discover()
        self.shared = Shared(config)
        self.store: JobStore = _make_store(config)
        self.state_lock = StateDirLock(config.state_dir)
        self._opened = False
        self.poll_waiters = 0
        self.metrics = Metrics(live_state(self))
        self.shared.metrics = self.metrics
        # Tenants (tokens, quotas, weights) and callbacks of finished jobs (API.md).
        self.tenants = Tenants(config.tenants, config.token)
        self.callbacks = CallbackSender(self.store.outbox, config.callbacks)
        workers = {
            Stage.INIT: config.init_workers,
            Stage.RUN: config.run_workers,
            Stage.EVAL: config.eval_workers,
        }
        self.pipeline = Pipeline(
            store=self.store,
            workers=workers,
            observer=self.metrics,
            stop_grace_s=config.stop_grace_s,
            jit_init=config.jit_init,
            shares=self.tenants,
        )
        self.pipeline.listeners.append(self.tenants)
        self.metrics.registry.register(
            TenantCollector(
                self.tenants, self.store.unfinished, self.store.log, self.callbacks.summary
            )
        )
        self.autoscaler: Autoscaler | None = None
        if config.autoscale:
            self.autoscaler = Autoscaler(self.pipeline, self._budget, config.autoscaling)
        self.capacity = CapacityView(self.pipeline, lambda: self.shared.runtime, self.autoscaler)
        self.metrics.registry.register(self.capacity)
        self._sweeper: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._budget_wired = False
        # Set if the job store's writer process is lost: the server then stops (a restart
        # requeues what was not committed); ``lost_reason`` says what happened.
        self.lost = asyncio.Event()
        self.lost_reason: str | None = None
        if isinstance(self.store, SqliteJobStore):
            self.store.on_lost = self._store_lost

    def _budget(self) -> SandboxBudget | None:
        runtime = self.shared.runtime
        return None if runtime is None else runtime.budget

    # -- lifecycle -------------------------------------------------------------------------

    def open(self) -> None:
        """Lock the state dir, open the store, requeue or fail what a dead server left.

        Raises ``StateDirBusy`` or ``StoreError`` (their messages name the other
        server or the file) and then holds nothing.
        """
        if self._opened:
            return
        self.state_lock.acquire()
        try:
            if self.config.reset_state and isinstance(self.store, SqliteJobStore):
                moved = set_aside(self.store.path)
                if moved is not None:
                    log.warning("--reset-state: moved %s to %s", self.store.path, moved)
            records = self.store.open()
        except BaseException:
            self.state_lock.release()
            raise
        self._opened = True
        recover(self, records)

    def announce(self, url: str) -> None:
        """Name this server's address in the state dir lock (for a refused second server)."""
        self.state_lock.announce(url)

    def start(self) -> None:
        self.open()
        budget = self._budget()
        if budget is not None and not self._budget_wired:
            if self.config.jit_init:
                # Just-in-time INIT also at the moment an INIT job would take a sandbox slot;
                # a pipeline change may open INIT's admission, so it re-offers free slots.
                budget.admit_when("init", self.pipeline.jit.slot_open)
                self.pipeline.changed.on_fire(budget.wake)
            # A RUN job waiting for a slot may wait for one held by a job queued for RUN.
            self.pipeline.slot_waiting = functools.partial(budget.waiting_at, "run")
            budget.on_demand(self.pipeline.rescue_run)
            self._budget_wired = True
        if self.shared.pool is not None:
            self.pipeline.jit.backend_capacity = self.shared.pool.capacity
        self.pipeline.start()
        if self.autoscaler is not None:
            self.autoscaler.start()
        if self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep(), name="retention-sweeper")
        if self._watcher is None:
            self._watcher = asyncio.create_task(self._watch(), name="store-watch")
        self.callbacks.start()

    async def stop(self) -> None:
        await self.pipeline.stop()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[RolloutService]:
        """The service open, its shared parts (LLM pool, sandbox runtime, tokenizer) up
        and its workers started; on exit every job is released and everything closed.

        The state dir lock comes first: nothing below may touch another server's state."""
        self.open()
        async with open_shared(self.shared):
            self.start()
            try:
                yield self
            finally:
                await self.aclose()

    async def aclose(self) -> None:
        """Stop intake, cancel and release every job, end workers, close handlers and store.

        Jobs cancelled by this shutdown stay unfinished in a durable store, so the
        next start requeues (or fails) them like after a crash.
        """
        self.store.freeze()
        if self.autoscaler is not None:
            await self.autoscaler.aclose()
        await self.pipeline.aclose()
        self.store.log.close()  # long-polls of /results and /events streams end now
        await self.callbacks.aclose()  # unsent deliveries stay in the outbox
        for task in (self._sweeper, self._watcher):
            if task is not None:
                await cancel_and_wait(task)
        self._sweeper = self._watcher = None
        for handler in self.registry.handlers():
            try:
                await handler.aclose()
            except Exception:
                log.exception("closing handler %r failed", handler.name)
        await self.store.aclose()
        self.state_lock.release()

    async def _sweep(self) -> None:
        interval = min(max(self.config.retention_s / 4, 0.05), 30.0)
        while True:
            # Periodic maintenance, not synchronisation: expiry is checked by deadline.
            await asyncio.sleep(interval)
            # In slices, the loop served between them: a pass at thousands of jobs a
            # second drops tens of thousands of results (~2 us each, more for their rows).
            now = time.monotonic()
            dropped = self.store.expire(now, _EXPIRE_SLICE)
            while dropped == _EXPIRE_SLICE:
                await asyncio.sleep(0)  # a yield to the loop, not a wait
                dropped = self.store.expire(now, _EXPIRE_SLICE)

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            # A sampling period, not synchronisation: the store's health and the loop's
            # lag are read on a clock.
            due = loop.time() + _WATCH_S
            await asyncio.sleep(_WATCH_S)
            self.metrics.lagged(loop.time() - due)
            await self.store.check()

    def _store_lost(self, what: str) -> None:
        log.critical(
            "%s: stopping the server; a restart on the same state dir requeues every job "
            "not committed",
            what,
        )
        self.lost_reason = what
        self.lost.set()

    def health(self) -> str | None:
        """Why this server cannot take jobs durably now (``/healthz`` answers 503 with it),
        or None."""
        if self.lost_reason is not None:
            return self.lost_reason
        problem = self.store.problem()
        return None if problem is None else problem.detail

    # -- submit ----------------------------------------------------------------------------

    def existing(self, job_id: str | None, tenant: str = DEFAULT_TENANT) -> tuple[str, str] | None:
        """(id, status) of an already-known id: idempotent resubmits create nothing."""
        if job_id is None:
            return None
        if self.foreign(job_id, tenant):
            raise Conflict(f"job_id: {job_id!r} is not available; choose another id")
        status = self.store.status(job_id)
        if status is not None:
            return job_id, status
        if self.store.is_tombstoned(job_id):
            return job_id, "cancelled"
        return None

    def foreign(self, job_id: str, tenant: str) -> bool:
        """Whether ``job_id`` is another tenant's job (to ``tenant`` it does not exist)."""
        owner = self.store.tenant_of(job_id)
        return owner is not None and owner != tenant

    def check_accepting(self, count: int = 1, tenant: str = DEFAULT_TENANT) -> None:
        fault = self.store.problem()
        if fault is not None:  # nothing created: the client retries after Retry-After
            raise fault
        problem = self.tenants.over_quota(tenant, count)
        if problem is not None:
            raise TooManyRequests(problem, retry_after=1)
        if not self.pipeline.accepting:
            raise Unavailable("server is stopped; POST /start to accept jobs", retry_after=5)
        if self.store.unfinished_count() + count > self.config.max_jobs:
            raise Unavailable(
                f"admission full: {self.store.unfinished_count()} unfinished jobs "
                f"(max_jobs={self.config.max_jobs})",
                retry_after=1,
            )

    def prepare(self, req: ProcessRequest, where: str = "") -> tuple[AgentHandler, Any]:
        handler = self.registry.get(req.task)
        if handler is None:
            known = ", ".join(self.registry.names())
            raise Unprocessable(f"{where}task: unknown task {req.task!r} (known: {known})")
        try:
            check_sampling_params(req.sampling_params)
            if req.callback_url is not None:
                problem = self.config.callbacks.target_problem(req.callback_url)
                if problem is not None:
                    raise Unprocessable(f"{where}callback_url: {problem}")
            instance = handler.validate(req.instance)
            handler.admit(instance, self.config)
            return handler, instance
        except InstanceError as exc:
            if not req.instance:  # nothing given: say that, not which field is missing
                msg = f"instance: missing; task {req.task!r} needs an instance ({exc})"
                raise Unprocessable(f"{where}{msg}") from None
            raise Unprocessable(f"{where}{exc}") from None
        except SamplingParamsError as exc:
            raise Unprocessable(f"{where}{exc}") from None

    def build_job(
        self, req: ProcessRequest, handler: AgentHandler, instance: Any, job_id: str
    ) -> Job:
        """A job for an admitted request (not yet queued)."""
        job = Job(
            job_id=job_id,
            task=req.task,
            handler=handler,
            instance=instance,
            sampling_params=req.sampling_params,
            timeout_s=req.timeout_s or self.config.default_timeout_s,
            metadata=req.metadata,
            shared=self.shared,
        )
        job.request = req
        job.callback_url = req.callback_url
        return job

    def create(
        self,
        req: ProcessRequest,
        handler: AgentHandler,
        instance: Any,
        tenant: str = DEFAULT_TENANT,
    ) -> Job:
        job = self.build_job(req, handler, instance, req.job_id or _new_job_id())
        job.tenant = tenant
        self.pipeline.submit(job)
        return job

    async def submit(
        self, req: ProcessRequest, tenant: str = DEFAULT_TENANT
    ) -> tuple[SubmitResponse, bool]:
        """Admit one job of ``tenant``; returns once the job is durable (it survives a
        crash from then on), with whether it is new (a known ``job_id`` creates nothing
        and answers its status)."""
        known = self.existing(req.job_id, tenant)
        if known is not None:
            await self.store.sync()  # what it answers is on disk too
            return SubmitResponse(job_id=known[0], status=known[1]), False
        self.check_accepting(1, tenant)
        handler, instance = self.prepare(req)
        job = self.create(req, handler, instance, tenant)
        await self._durable([job])
        return SubmitResponse(job_id=job.id, status="queued"), True

    async def _durable(self, jobs: list[Job]) -> None:
        """Wait for the commit of ``jobs`` (just created); if it cannot come in time, take
        them back (never acknowledged, never run) and raise ``StoreUnavailable``."""
        try:
            await self.store.sync()
        except StoreUnavailable:
            await asyncio.gather(*(self.pipeline.withdraw(job) for job in jobs))
            raise

    async def submit_batch(
        self, reqs: list[ProcessRequest], tenant: str = DEFAULT_TENANT
    ) -> list[str]:
        """Validate the whole batch first (one bad job rejects it), then admit; returns
        once every job is durable."""
        if len(reqs) > self.config.max_batch:
            raise PayloadTooLarge(f"jobs: {len(reqs)} jobs, over max_batch={self.config.max_batch}")
        ids, created = self._admit_batch(reqs, tenant)
        self.store.flush()  # a batch fills a commit of its own: no need to wait for others
        await self._durable(created)
        return ids

    def _admit_batch(self, reqs: list[ProcessRequest], tenant: str) -> tuple[list[str], list[Job]]:
        prepared: list[tuple[AgentHandler, Any] | None] = []
        new = 0
        for i, req in enumerate(reqs):
            if self.existing(req.job_id, tenant) is not None:
                prepared.append(None)
            else:
                prepared.append(self.prepare(req, where=f"jobs[{i}]."))
                new += 1
        self.check_accepting(new, tenant)
        ids, created = [], []
        for req, prep in zip(reqs, prepared, strict=True):
            known = self.existing(req.job_id, tenant)  # a duplicate id later in the same batch
            if known is not None or prep is None:
                ids.append(known[0] if known else str(req.job_id))
            else:
                created.append(self.create(req, *prep, tenant))
                ids.append(created[-1].id)
        return ids, created

    # -- poll ------------------------------------------------------------------------------

    async def result(
        self, job_id: str, tenant: str = DEFAULT_TENANT, wait: float = 0.0
    ) -> bytes | JobStatusResponse:
        """The job's result document (JSON bytes, as stored), or its status while it is
        not finished; waits up to ``wait`` seconds for it to end. Another tenant's job is
        unknown (``NotFound``)."""
        if self.foreign(job_id, tenant):
            raise NotFound(f"job_id: unknown job {job_id!r}")
        job = self.store.get(job_id)
        if job is not None:
            await self.wait_any([job], wait)
        body = (await self.store.results([job_id])).get(job_id)
        if body is not None:
            return body
        status = self.store.status(job_id)
        if status is None:
            raise NotFound(f"job_id: unknown job {job_id!r}")
        return JobStatusResponse(job_id=job_id, status=status)

    async def poll(
        self, job_ids: list[str], wait: float = 0.0, tenant: str = DEFAULT_TENANT
    ) -> PollResponse:
        """The finished results among ``job_ids``; if none has finished, waits up to
        ``wait`` seconds for the first. Results not yet committed are listed pending."""
        known, live, unknown = [], [], []
        for job_id in dict.fromkeys(job_ids):
            if self.store.status(job_id) is None or self.foreign(job_id, tenant):
                unknown.append(job_id)
                continue
            known.append(job_id)
            job = self.store.get(job_id)
            if job is not None and not job.terminal:
                live.append(job)
        if len(live) == len(known):  # nothing finished yet: wait for the first to end
            await self.wait_any(live, wait)
        done, pending = [], []
        bodies = await self.store.results(known, partial=True)  # committed ones now
        if not bodies and len(live) < len(known):
            # Ended, not committed (the store cannot commit now): wait for it, not spin.
            await self.store.committing(min(wait, self.config.max_wait_s))
            bodies = await self.store.results(known, partial=True)
        for job_id in known:
            body = bodies.get(job_id)
            if body is None:
                pending.append(job_id)
            else:
                done.append(msgspec.Raw(body))
        return PollResponse(done=done, pending=pending, unknown=unknown)

    async def wait_any(self, jobs: list[Job], wait: float) -> None:
        """Wait until one of ``jobs`` ends or ``wait`` seconds pass. Leaves no waiter behind."""
        if wait <= 0 or not jobs or any(j.terminal for j in jobs):
            return
        event = asyncio.Event()
        for job in jobs:
            job.add_waiter(event)
        self.poll_waiters += 1
        try:
            async with asyncio.timeout(min(wait, self.config.max_wait_s)):
                await event.wait()
        except TimeoutError:
            pass
        finally:
            self.poll_waiters -= 1
            for job in jobs:
                job.remove_waiter(event)

    # -- cancel ----------------------------------------------------------------------------

    async def cancel(self, ids: list[str], tenant: str | None = None) -> CancelResponse:
        """Cancel ``ids``; with ``tenant``, another tenant's ids are not found."""
        cancelled: list[str] = []
        finished: list[str] = []
        missing: list[str] = []
        todo: list[Job] = []
        for job_id in dict.fromkeys(ids):
            job = self.store.get(job_id)
            if tenant is not None and self.foreign(job_id, tenant):
                missing.append(job_id)
            elif job is not None and not job.terminal:
                todo.append(job)
            elif self.store.status(job_id) is not None or self.store.is_tombstoned(job_id):
                finished.append(job_id)
            else:
                missing.append(job_id)
        results = await asyncio.gather(*(self.pipeline.cancel(j) for j in todo))
        for job, ok in zip(todo, results, strict=True):
            (cancelled if ok else finished).append(job.id)
        # Cancelled ids stay cancelled, and a job said to be finished is: a crash after
        # this answer must not requeue either (as /process, it waits for the commit).
        await self.store.sync()
        return CancelResponse(cancelled=cancelled, already_finished=finished, not_found=missing)

    async def delete(self, job_id: str, tenant: str | None = None) -> bool:
        """Cancel the job if it runs, then forget it; False if the id is unknown (to
        ``tenant``)."""
        if self.store.status(job_id) is None:
            return False
        if tenant is not None and self.foreign(job_id, tenant):
            return False
        job = self.store.get(job_id)
        if job is not None and not job.terminal:
            await self.pipeline.cancel(job)
        self.store.delete(job_id)
        await self.store.sync()
        return True

    # -- capacity --------------------------------------------------------------------------

    def resize_workers(self, req: WorkersRequest) -> None:
        """Resize any subset of the stage pools now (shrinking never cancels a job)."""
        for stage in Stage:
            size = getattr(req, stage.value)
            if size is not None:
                log.info("workers: %s pool resized to %d", stage.value, size)
                self.pipeline.resize(stage, size)

    # -- results by cursor and the event feed ----------------------------------------------

    def cursor(self, tenant: str, after: int | None, default: int | None = None) -> int:
        """A result-log cursor of ``tenant``: ``after`` checked against retention
        (``Gone`` names the oldest seq still held), or when not given ``default`` (``None``:
        before the oldest result held)."""
        log = self.store.log
        if after is None:
            return log.oldest(tenant) - 1 if default is None else default
        if after < log.floor(tenant):
            oldest = log.oldest(tenant)
            raise Gone(
                f"after: cursor {after} is older than the retention; the oldest seq still "
                f"held is {oldest} (read on from after={oldest - 1}, and poll the ids you miss)",
                oldest_seq=oldest,
            )
        return after

    def last_seq(self, tenant: str) -> int:
        """The seq of ``tenant``'s latest committed result (a cursor for "from now on")."""
        return self.store.log.last(tenant)

    async def results_after(
        self, tenant: str, cursor: int, limit: int, wait: float = 0.0
    ) -> ResultsResponse:
        """Up to ``limit`` of ``tenant``'s results committed after ``cursor``, in seq
        order; if there are none, waits up to ``wait`` seconds for the first."""
        log = self.store.log
        entries = log.after(tenant, cursor, limit)
        if not entries and limit and wait > 0:
            await log.wait(tenant, cursor, min(wait, self.config.max_wait_s))
            entries = log.after(tenant, cursor, limit)
        docs = await self._documents(entries)
        cursor = entries[-1].seq if entries else cursor
        return ResultsResponse(results=docs, next=cursor, epoch=log.epoch)

    async def _documents(self, entries: list[LogEntry]) -> list[msgspec.Raw]:
        """The result documents of ``entries`` still held (not deleted or replaced since)."""
        store = self.store
        bodies = await store.results([e.job_id for e in entries])
        return [
            msgspec.Raw(bodies[e.job_id])
            for e in entries
            if e.job_id in bodies and store.seq_of(e.job_id) == e.seq
        ]

    async def events(
        self, tenant: str, cursor: int, batch: int, heartbeat_s: float
    ) -> AsyncGenerator[list[LogEntry], None]:
        """``tenant``'s results as they commit after ``cursor``, up to ``batch`` at a
        time; an empty list after ``heartbeat_s`` without any. Ends when the service
        closes. The caller pulls at its own pace: nothing is queued for it."""
        log = self.store.log
        log.streams += 1
        try:
            while not log.closed:
                entries = log.after(tenant, cursor, batch)
                if entries:
                    cursor = entries[-1].seq
                    yield entries
                    continue
                await log.wait(tenant, cursor, heartbeat_s)
                if not log.closed and not log.after(tenant, cursor, 1):
                    yield []
        finally:
            log.streams -= 1

    def event_consumer_dropped(self) -> None:
        """An event consumer was disconnected for not reading (counted in ``/status``)."""
        self.store.log.streams_dropped += 1

    def close_feeds(self) -> None:
        """End every long-poll of ``/results`` and every event stream now (shutdown)."""
        self.store.log.close()

    async def callback_state(self, job_id: str, tenant: str = DEFAULT_TENANT) -> CallbackInfo:
        """The delivery state of the job's ``callback_url`` (``NotFound``: unknown job, or
        none asked for)."""
        if self.store.status(job_id) is None or self.foreign(job_id, tenant):
            raise NotFound(f"job_id: unknown job {job_id!r}")
        info = await self.store.outbox.info(job_id)
        if info is not None:
            return info
        job = self.store.get(job_id)
        if job is None or job.terminal or job.callback_url is None:
            raise NotFound(f"job_id: job {job_id!r} has no callback_url")
        # Not ended yet: its delivery starts when it does.
        return CallbackInfo(
            job_id=job_id, url=job.callback_url, state="pending", attempts=0, last_error=None
        )

    # -- LLM backends and weights ----------------------------------------------------------

    def _pool(self) -> BackendPool:
        pool = self.shared.pool
        if pool is None:
            raise Unavailable("the LLM backend pool is not running", retry_after=1)
        return pool

    def backends(self) -> list[dict[str, Any]]:
        """The registered LLM backends (``[]`` while the pool is not running)."""
        pool = self.shared.pool
        return [] if pool is None else list(pool.snapshot())

    async def add_backend(self, req: AddLLMServerRequest) -> list[dict[str, Any]]:
        """Register (or update) an LLM backend; returns the backends."""
        pool = self._pool()
        try:
            await pool.register(
                req.address,
                api=req.api,
                weight_version=req.weight_version,
                max_inflight=req.max_inflight,
                weight=req.weight,
                model=req.model,
            )
        except ValueError as exc:
            raise Unprocessable(str(exc)) from None
        return list(pool.snapshot())

    def remove_backend(self, address: str) -> list[dict[str, Any]]:
        """Unregister a backend (its jobs fail over); ``NotFound`` if none has ``address``."""
        pool = self._pool()
        if not pool.remove(address):
            raise NotFound(f"address: no backend {address!r}")
        return list(pool.snapshot())

    def clear_backends(self) -> list[dict[str, Any]]:
        pool = self._pool()
        pool.clear()
        return list(pool.snapshot())

    def weights(self) -> WeightUpdates:
        """Pause, load and resume of the backends' weights (``llm.weights``)."""
        return self._pool().weights

    # -- observation ---------------------------------------------------------------------

    def status(self, viewer: Tenant | None = None) -> StatusResponse:
        """The ``/status`` document; a non-admin ``viewer`` sees only its own tenant."""
        return status_document(self, viewer)

    def task_names(self) -> list[str]:
        return list(self.registry.names())


_ID_BLOCK = 256
_ids: list[str] = []


def _new_job_id() -> str:
    """``j-``, the wall clock in milliseconds (12 hex digits) and 80 random bits (20 hex
    digits, from ``os.urandom`` a block of 256 at a time: one system call per 256 jobs).

    Ids sort by creation time, so the durable store's id index takes new ones at its
    right edge; random ids each landed on a random page of it (measured: the writer
    process spent ~20% more CPU per job). Within one millisecond they are random."""
    if not _ids:
        raw = os.urandom(10 * _ID_BLOCK).hex()
        _ids.extend(raw[i : i + 20] for i in range(0, len(raw), 20))
    return f"j-{int(time.time() * 1000):012x}{_ids.pop()}"


def _make_store(config: ServerConfig) -> JobStore:
    if config.store == "memory":
        return MemoryJobStore(retention_s=config.retention_s, tombstone_s=config.tombstone_s)
    return SqliteJobStore(
        path=Path(config.state_dir) / "jobs.sqlite3",
        retention_s=config.retention_s,
        tombstone_s=config.tombstone_s,
        cache_bytes=config.result_cache_bytes,
        commit_timeout_s=config.commit_timeout_s,
    )
