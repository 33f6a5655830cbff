"""The rollout service: admission, polling, cancel and status on top of the pipeline.

HTTP routes are thin wrappers around this class, so the same logic serves the
server, the tests and the benchmarks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from pathlib import Path
from typing import Any

from prorl_async.capacity.autoscale import Autoscaler
from prorl_async.capacity.budget import SandboxBudget
from prorl_async.capacity.view import CapacityView
from prorl_async.config import ServerConfig
from prorl_async.core.errors import Conflict, TooManyRequests, Unavailable, Unprocessable
from prorl_async.core.handler import AgentHandler, HandlerRegistry, InstanceError
from prorl_async.core.job import Job, Stage
from prorl_async.core.metrics import LiveState, Metrics
from prorl_async.core.pipeline import Pipeline
from prorl_async.core.recovery import recover
from prorl_async.core.shared import Shared
from prorl_async.core.tenantview import TenantCollector, callbacks_info, events_info, tenant_infos
from prorl_async.llm.sampling import SamplingParamsError, check_sampling_params
from prorl_async.notify.sender import CallbackSender
from prorl_async.schemas import (
    BackendInfo,
    CancelResponse,
    ProcessRequest,
    StatusResponse,
    WorkersRequest,
)
from prorl_async.store import JobStore, MemoryJobStore, SqliteJobStore, StateDirLock, set_aside
from prorl_async.tenancy import DEFAULT_TENANT, Tenant, Tenants

__all__ = ["RolloutService"]

log = logging.getLogger(__name__)

# Results the sweeper drops in one loop step at most (~1-2 ms of the loop's time).
_EXPIRE_SLICE = 512


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
        self.metrics = Metrics(self._live_state())
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
        self._admission_set = False

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
        if budget is not None and self.config.jit_init and not self._admission_set:
            # Just-in-time INIT also at the moment an INIT job would take a sandbox slot;
            # a pipeline change may open INIT's admission, so it re-offers free slots.
            budget.admit_when("init", self.pipeline.jit.slot_open)
            self.pipeline.changed.on_fire(budget.wake)
            self._admission_set = True
        if self.shared.pool is not None:
            self.pipeline.jit.backend_capacity = self.shared.pool.capacity
        self.pipeline.start()
        if self.autoscaler is not None:
            self.autoscaler.start()
        if self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep(), name="retention-sweeper")
        self.callbacks.start()

    async def stop(self) -> None:
        await self.pipeline.stop()

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
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
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

    def submit(self, req: ProcessRequest, tenant: str = DEFAULT_TENANT) -> tuple[str, str, bool]:
        """Admit one job of ``tenant``: (job_id, status, created)."""
        known = self.existing(req.job_id, tenant)
        if known is not None:
            return known[0], known[1], False
        self.check_accepting(1, tenant)
        handler, instance = self.prepare(req)
        job = self.create(req, handler, instance, tenant)
        return job.id, job.status, True

    def submit_batch(self, reqs: list[ProcessRequest], tenant: str = DEFAULT_TENANT) -> list[str]:
        """Validate the whole batch first (one bad job rejects it), then admit."""
        prepared: list[tuple[AgentHandler, Any] | None] = []
        new = 0
        for i, req in enumerate(reqs):
            if self.existing(req.job_id, tenant) is not None:
                prepared.append(None)
            else:
                prepared.append(self.prepare(req, where=f"jobs[{i}]."))
                new += 1
        self.check_accepting(new, tenant)
        ids = []
        for req, prep in zip(reqs, prepared, strict=True):
            known = self.existing(req.job_id, tenant)  # a duplicate id later in the same batch
            if known is not None or prep is None:
                ids.append(known[0] if known else str(req.job_id))
            else:
                ids.append(self.create(req, *prep, tenant).id)
        return ids

    # -- poll ------------------------------------------------------------------------------

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

    # -- status ----------------------------------------------------------------------------

    def _backends(self) -> list[dict[str, Any]]:
        pool = self.shared.pool
        return [] if pool is None else list(pool.snapshot())

    def _backend_waiting(self) -> int:
        pool = self.shared.pool
        return 0 if pool is None else int(pool.waiting)

    def _sandboxes(self) -> int:
        runtime = self.shared.runtime
        return 0 if runtime is None else int(runtime.live)

    def _queue_depths(self) -> dict[str, int]:
        return {s.value: n for s, n in self.pipeline.queued.items()}

    def _active_counts(self) -> dict[str, int]:
        return {s.value: n for s, n in self.pipeline.active.items()}

    def _poll_waiters(self) -> int:
        return self.poll_waiters

    def _live_state(self) -> LiveState:
        # Read at scrape time; the pipeline and store are created after the metrics.
        return LiveState(
            queues=self._queue_depths,
            active=self._active_counts,
            poll_waiters=self._poll_waiters,
            sandboxes=self._sandboxes,
            backends=self._backends,
            backend_waiting=self._backend_waiting,
            unfinished=lambda: self.store.unfinished_count(),
            store=self._store_gauges,
        )

    def _store_gauges(self) -> dict[str, int]:
        st = self.store.stats()
        return {"rows": st.rows, "bytes": st.bytes, "cache_bytes": st.cache_bytes}

    def status(self, viewer: Tenant | None = None) -> StatusResponse:
        """The ``/status`` document; a non-admin ``viewer`` sees only its own tenant."""
        pipe = self.pipeline
        me = DEFAULT_TENANT if viewer is None else viewer.name
        only = None if viewer is None or viewer.admin else me
        return StatusResponse(
            state="running" if pipe.accepting else "stopped",
            queues=self._queue_depths(),
            active=self._active_counts(),
            workers={s.value: n for s, n in pipe.workers.items()},
            jobs=self.store.counts(),
            sandboxes=self._sandboxes(),
            poll_waiters=self.poll_waiters,
            backends=[_backend_info(b) for b in self._backends()],
            backend_waiting=self._backend_waiting(),
            records=len(self.store),
            pools=self.capacity.pools(),
            sandbox_budget=self.capacity.budget(),
            idle_sandbox_seconds=self.capacity.idle_sandbox_seconds(),
            jit_waiting=pipe.jit.waiting,
            autoscale=self.autoscaler is not None,
            store=self.store.stats(),
            sandbox_enforcement=self._enforcement(),
            last_seq=self.store.log.last(me),
            epoch=self.store.log.epoch,
            tenants=tenant_infos(self.tenants, self.store.unfinished(), self.store.log, only),
            callbacks=callbacks_info(self.config.callbacks.enabled, self.callbacks.summary()),
            events=events_info(self.store.log),
        )

    def _enforcement(self) -> dict[str, str]:
        runtime = self.shared.runtime
        return {} if runtime is None else runtime.enforcement(self.config.sandbox_limits)


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
    )


def _backend_info(b: dict[str, Any]) -> BackendInfo:
    return BackendInfo(
        address=b["address"],
        inflight=b["inflight"],
        assigned=b["assigned"],
        healthy=b["healthy"],
        weight_version=b.get("weight_version"),
        max_model_len=b.get("max_model_len"),
    )
