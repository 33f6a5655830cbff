"""Tenants, callbacks and the result log in ``/status`` and ``/metrics``.

Per-tenant queue and stage counts are read from the live jobs when asked (a scrape, a
``/status``), not kept up to date on every move.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from prorl_async.core.job import TERMINAL, Job
from prorl_async.core.resultlog import ResultLog
from prorl_async.schemas import CallbacksInfo, EventsInfo, TenantInfo
from prorl_async.tenancy.ledger import Tenants

__all__ = ["TenantCollector", "callbacks_info", "tenant_infos"]

_STAGES = ("init", "run", "eval")
_ENDS = ("done", "failed", "cancelled", "timed_out")


def _stage_counts(live: Iterable[Job]) -> dict[str, tuple[Counter[str], Counter[str]]]:
    """tenant -> (queued per stage, active per stage)."""
    out: dict[str, tuple[Counter[str], Counter[str]]] = {}
    for job in live:
        if job.status in TERMINAL:
            continue
        queued, active = out.setdefault(job.tenant, (Counter(), Counter()))
        if job.status.startswith("queued_"):
            queued[job.status[7:]] += 1
        else:
            active[job.status] += 1
    return out


def tenant_infos(
    tenants: Tenants, live: Iterable[Job], log: ResultLog, only: str | None = None
) -> dict[str, TenantInfo]:
    """Every tenant's line of ``/status`` (``only``: just that tenant's)."""
    counts = _stage_counts(live)
    names = [only] if only is not None else tenants.names()
    out = {}
    for name in names:
        tenant = tenants.get(name)
        queued, active = counts.get(name, (Counter(), Counter()))
        ended = tenants.ended.get(name, Counter())
        out[name] = TenantInfo(
            queues={s: queued[s] for s in _STAGES},
            active={s: active[s] for s in _STAGES},
            inflight=tenants.inflight[name],
            max_inflight=tenant.max_inflight,
            weight=tenant.weight,
            admin=tenant.admin,
            jobs={s: ended[s] for s in _ENDS},
            last_seq=log.last(name),
        )
    return out


def callbacks_info(enabled: bool, summary: dict[str, Any]) -> CallbacksInfo:
    return CallbacksInfo(
        enabled=enabled,
        pending=summary["pending"],
        inflight=summary["inflight"],
        attempts=summary["attempts"],
        delivered=summary["delivered"],
        retried=summary["retried"],
        failed=summary["failed"],
    )


def events_info(log: ResultLog) -> EventsInfo:
    return EventsInfo(streams=log.streams, dropped=log.streams_dropped)


class TenantCollector(Collector):
    """``prorl_tenant_*``, ``prorl_callbacks_*``, ``prorl_event_streams*`` at scrape time."""

    def __init__(
        self,
        tenants: Tenants,
        live: Callable[[], Iterable[Job]],
        log: ResultLog,
        callbacks: Callable[[], dict[str, Any]],
    ) -> None:
        self._tenants = tenants
        self._live = live
        self._log = log
        self._callbacks = callbacks

    def collect(self) -> Iterator[Metric]:
        infos = tenant_infos(self._tenants, self._live(), self._log)
        queue = GaugeMetricFamily(
            "prorl_tenant_queue_depth",
            "Jobs of a tenant in a stage queue",
            labels=["tenant", "stage"],
        )
        active = GaugeMetricFamily(
            "prorl_tenant_active_jobs",
            "Jobs of a tenant inside a stage",
            labels=["tenant", "stage"],
        )
        inflight = GaugeMetricFamily(
            "prorl_tenant_inflight", "Jobs of a tenant queued or running", labels=["tenant"]
        )
        ended = CounterMetricFamily(
            "prorl_tenant_jobs",
            "Jobs of a tenant that ended, by status",
            labels=["tenant", "status"],
        )
        for name, info in infos.items():
            for stage in _STAGES:
                queue.add_metric([name, stage], info.queues[stage])
                active.add_metric([name, stage], info.active[stage])
            inflight.add_metric([name], info.inflight)
            for status, n in info.jobs.items():
                ended.add_metric([name, status], n)
        yield from (queue, active, inflight, ended)
        yield from self._callback_metrics()
        yield GaugeMetricFamily(
            "prorl_completion_seq", "Last committed seq", value=self._log.committed
        )
        yield GaugeMetricFamily(
            "prorl_event_streams", "Open /events streams", value=self._log.streams
        )
        yield CounterMetricFamily(
            "prorl_event_streams_dropped",
            "/events streams cut for not reading",
            value=self._log.streams_dropped,
        )

    def _callback_metrics(self) -> Iterator[Metric]:
        summary = self._callbacks()
        yield GaugeMetricFamily(
            "prorl_callbacks_pending", "Callback deliveries not yet done", value=summary["pending"]
        )
        yield GaugeMetricFamily(
            "prorl_callbacks_inflight", "Callback attempts in flight", value=summary["inflight"]
        )
        total = CounterMetricFamily(
            "prorl_callbacks", "Callback attempts and outcomes", labels=["outcome"]
        )
        for outcome in ("attempts", "delivered", "retried", "failed"):
            total.add_metric([outcome], summary[outcome])
        yield total
