"""The ``/status`` document and the live gauges ``/metrics`` reads at scrape time.

Both read the service's parts through ``Observed`` (what ``RolloutService`` has), so
this module does not import the service.
"""

from __future__ import annotations

from typing import Any, Protocol

from prorl_async.capacity.autoscale import Autoscaler
from prorl_async.capacity.view import CapacityView
from prorl_async.config import ServerConfig
from prorl_async.core.jobstore import JobStore
from prorl_async.core.metrics import LiveState
from prorl_async.core.pipeline import Pipeline
from prorl_async.core.shared import Shared
from prorl_async.core.tenantview import callbacks_info, events_info, tenant_infos
from prorl_async.notify.sender import CallbackSender
from prorl_async.schemas import BackendInfo, StatusResponse
from prorl_async.tenancy import DEFAULT_TENANT, Tenant, Tenants

__all__ = ["Observed", "live_state", "status_document"]


class Observed(Protocol):
    """The parts of the service that status and metrics read."""

    config: ServerConfig
    shared: Shared
    store: JobStore
    pipeline: Pipeline
    tenants: Tenants
    callbacks: CallbackSender
    capacity: CapacityView
    autoscaler: Autoscaler | None
    poll_waiters: int


def _backends(svc: Observed) -> list[dict[str, Any]]:
    pool = svc.shared.pool
    return [] if pool is None else list(pool.snapshot())


def _backend_waiting(svc: Observed) -> int:
    pool = svc.shared.pool
    return 0 if pool is None else int(pool.waiting)


def _sandboxes(svc: Observed) -> int:
    runtime = svc.shared.runtime
    return 0 if runtime is None else int(runtime.live)


def _queue_depths(svc: Observed) -> dict[str, int]:
    return {s.value: n for s, n in svc.pipeline.queued.items()}


def _active_counts(svc: Observed) -> dict[str, int]:
    return {s.value: n for s, n in svc.pipeline.active.items()}


def _store_gauges(svc: Observed) -> dict[str, int]:
    st = svc.store.stats()
    gauges = {"rows": st.rows, "bytes": st.bytes, "cache_bytes": st.cache_bytes}
    if st.free_bytes is not None:
        gauges["free_bytes"] = st.free_bytes
    if st.kind == "sqlite":
        gauges["errors"] = st.errors
        gauges["unavailable"] = int(st.problem is not None)
    return gauges


def _enforcement(svc: Observed) -> dict[str, str]:
    runtime = svc.shared.runtime
    return {} if runtime is None else runtime.enforcement(svc.config.sandbox_limits)


def live_state(svc: Observed) -> LiveState:
    """The gauges ``/metrics`` reads at scrape time (the service's parts are created
    after its metrics, so each is looked up when read)."""
    return LiveState(
        queues=lambda: _queue_depths(svc),
        active=lambda: _active_counts(svc),
        poll_waiters=lambda: svc.poll_waiters,
        sandboxes=lambda: _sandboxes(svc),
        backends=lambda: _backends(svc),
        backend_waiting=lambda: _backend_waiting(svc),
        unfinished=lambda: svc.store.unfinished_count(),
        store=lambda: _store_gauges(svc),
    )


def status_document(svc: Observed, viewer: Tenant | None = None) -> StatusResponse:
    """The ``/status`` document; a non-admin ``viewer`` sees only its own tenant."""
    pipe, store = svc.pipeline, svc.store
    me = DEFAULT_TENANT if viewer is None else viewer.name
    only = None if viewer is None or viewer.admin else me
    return StatusResponse(
        state="running" if pipe.accepting else "stopped",
        queues=_queue_depths(svc),
        active=_active_counts(svc),
        workers={s.value: n for s, n in pipe.workers.items()},
        jobs=store.counts(),
        sandboxes=_sandboxes(svc),
        poll_waiters=svc.poll_waiters,
        backends=[_backend_info(b) for b in _backends(svc)],
        backend_waiting=_backend_waiting(svc),
        records=len(store),
        pools=svc.capacity.pools(),
        sandbox_budget=svc.capacity.budget(),
        idle_sandbox_seconds=svc.capacity.idle_sandbox_seconds(),
        jit_waiting=pipe.jit.waiting,
        autoscale=svc.autoscaler is not None,
        store=store.stats(),
        sandbox_enforcement=_enforcement(svc),
        last_seq=store.log.last(me),
        epoch=store.log.epoch,
        tenants=tenant_infos(svc.tenants, store.unfinished(), store.log, only),
        callbacks=callbacks_info(svc.config.callbacks.enabled, svc.callbacks.summary()),
        events=events_info(store.log),
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
