"""Prometheus metrics: counters/histograms fed by events, live gauges read at scrape time."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["LiveState", "Metrics"]

_STAGE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
_TOOL_BUCKETS = (0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300)


class LiveState:
    """Callables that read live server state; each returns the current value."""

    def __init__(
        self,
        *,
        queues: Callable[[], dict[str, int]],
        active: Callable[[], dict[str, int]],
        poll_waiters: Callable[[], int],
        sandboxes: Callable[[], int],
        backends: Callable[[], list[dict[str, Any]]],
        backend_waiting: Callable[[], int],
        unfinished: Callable[[], int],
        store: Callable[[], dict[str, int]] | None = None,
    ) -> None:
        self.queues = queues
        self.active = active
        self.poll_waiters = poll_waiters
        self.sandboxes = sandboxes
        self.backends = backends
        self.backend_waiting = backend_waiting
        self.unfinished = unfinished
        # rows, bytes (file size) and cache_bytes of the job store
        self.store = store if store is not None else dict


class _LiveCollector(Collector):
    def __init__(self, state: LiveState) -> None:
        self._state = state

    def collect(self) -> Iterator[Metric]:
        s = self._state
        yield _labelled("prorl_queue_depth", "Jobs waiting in a stage queue", "stage", s.queues())
        yield _labelled("prorl_active_jobs", "Jobs inside a stage now", "stage", s.active())
        yield GaugeMetricFamily(
            "prorl_poll_waiters", "Long-poll requests waiting now", value=s.poll_waiters()
        )
        yield GaugeMetricFamily("prorl_sandboxes", "Live sandboxes", value=s.sandboxes())
        yield GaugeMetricFamily(
            "prorl_unfinished_jobs", "Jobs admitted and not yet terminal", value=s.unfinished()
        )
        yield GaugeMetricFamily(
            "prorl_backend_waiting",
            "RUN stages waiting for an LLM backend (timer paused)",
            value=s.backend_waiting(),
        )
        store = s.store()
        for key, doc in _STORE_GAUGES.items():
            if key in store:
                yield GaugeMetricFamily(f"prorl_store_{key}", doc, value=store[key])
        backends = s.backends()
        inflight = {b["address"]: b["inflight"] for b in backends}
        yield _labelled("prorl_backend_inflight", "Jobs holding each backend", "backend", inflight)
        healthy = {b["address"]: int(b["healthy"]) for b in backends}
        yield _labelled("prorl_backend_healthy", "1 if the backend is healthy", "backend", healthy)


_STORE_GAUGES = {
    "rows": "Job records in the store (live and retained results)",
    "bytes": "Size of the job store in bytes (database and WAL file, or results held)",
    "cache_bytes": "Bytes of result documents held in memory",
}


def _labelled(name: str, doc: str, label: str, values: dict[str, int]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=[label])
    for key, value in values.items():
        family.add_metric([key], value)
    return family


class Metrics:
    """One registry per server (so several servers can live in one process)."""

    def __init__(self, state: LiveState) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.jobs_total = Counter(
            "prorl_jobs", "Jobs that ended, by status", ["status"], registry=self.registry
        )
        self.stage_seconds = Histogram(
            "prorl_stage_seconds",
            "Active seconds spent in a stage",
            ["stage"],
            buckets=_STAGE_BUCKETS,
            registry=self.registry,
        )
        self.tool_seconds = Histogram(
            "prorl_tool_seconds",
            "Seconds per tool call",
            ["tool"],
            buckets=_TOOL_BUCKETS,
            registry=self.registry,
        )
        # Label children resolved once: .labels() takes a lock and a dict walk per call.
        self._stage_children = {s: self.stage_seconds.labels(s) for s in ("init", "run", "eval")}
        self._status_children = {
            s: self.jobs_total.labels(s) for s in ("done", "failed", "cancelled", "timed_out")
        }
        for tool in ("bash", "python", "str_replace_editor"):
            self.tool_seconds.labels(tool)
        self.clamped_logprobs = Counter(
            "prorl_clamped_logprobs",
            "Missing or non-finite logprobs from backends, clamped",
            registry=self.registry,
        )
        self.weight_pause_seconds = Histogram(
            "prorl_weight_pause_seconds",
            "Seconds a backend was paused for a weight update",
            buckets=_STAGE_BUCKETS,
            registry=self.registry,
        )
        self.generations_interrupted = Counter(
            "prorl_generations_interrupted",
            "Generations interrupted by a weight-update pause (abort) and continued",
            registry=self.registry,
        )
        self.tokens_kept = Counter(
            "prorl_tokens_kept",
            "Tokens an interrupted generation had made, kept across the interruption",
            registry=self.registry,
        )
        self.tokens_discarded = Counter(
            "prorl_tokens_discarded",
            "Tokens an interrupted generation had made, thrown away (on_interrupt=regenerate)",
            registry=self.registry,
        )
        self.registry.register(_LiveCollector(state))

    # The backend pool's observer (llm.pool.PoolObserver).
    def interrupted(self, tokens_kept: int, tokens_discarded: int) -> None:
        self.generations_interrupted.inc()
        self.tokens_kept.inc(tokens_kept)
        self.tokens_discarded.inc(tokens_discarded)

    def paused(self, seconds: float) -> None:
        self.weight_pause_seconds.observe(seconds)

    def stage_finished(self, stage: str, seconds: float) -> None:
        self._stage_children[stage].observe(seconds)

    def job_finished(self, status: str) -> None:
        self._status_children[status].inc()

    def tool_called(self, tool: str, seconds: float) -> None:
        self.tool_seconds.labels(tool).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
