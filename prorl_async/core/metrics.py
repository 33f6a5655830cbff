"""Prometheus metrics: counters/histograms fed by events, live gauges read at scrape time.

The two updated for every job (``prorl_jobs_total``, ``prorl_stage_seconds``) are plain
counts in this process, turned into metric families at scrape time: no lock and no
child lookup on the pipeline's path.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
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
        if "errors" in store:
            yield CounterMetricFamily(
                "prorl_store_errors",
                "Commits the storage refused (once per fault) or that failed, and writers lost",
                value=store["errors"],
            )
        backends = s.backends()
        inflight = {b["address"]: b["inflight"] for b in backends}
        yield _labelled("prorl_backend_inflight", "Jobs holding each backend", "backend", inflight)
        healthy = {b["address"]: int(b["healthy"]) for b in backends}
        yield _labelled("prorl_backend_healthy", "1 if the backend is healthy", "backend", healthy)


_STORE_GAUGES = {
    "rows": "Job records in the store (live and retained results)",
    "bytes": "Size of the job store in bytes (database and WAL file, or results held)",
    "cache_bytes": "Bytes of result documents held in memory",
    "free_bytes": "Free bytes on the state dir's file system (sampled every second)",
    "unavailable": "1 while the store cannot commit (storage refused, writer stalled)",
}


def _labelled(name: str, doc: str, label: str, values: dict[str, int]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=[label])
    for key, value in values.items():
        family.add_metric([key], value)
    return family


class _Counts:
    """A labelled counter without a lock: one int per label value (one event loop)."""

    def __init__(self, labels: tuple[str, ...]) -> None:
        self.values = dict.fromkeys(labels, 0)
        self.created = time.time()


class _Observations:
    """A labelled histogram without a lock: per label value, counts per bucket and a sum."""

    def __init__(self, labels: tuple[str, ...], buckets: tuple[float, ...]) -> None:
        self.bounds = buckets
        self.counts = {label: [0] * (len(buckets) + 1) for label in labels}
        self.sums = dict.fromkeys(labels, 0.0)

    def observe(self, label: str, value: float) -> None:
        self.counts[label][bisect_left(self.bounds, value)] += 1
        self.sums[label] += value


class _EventCollector(Collector):
    """``prorl_jobs_total`` and ``prorl_stage_seconds`` from their counts, at scrape time."""

    def __init__(self, jobs: _Counts, stages: _Observations) -> None:
        self._jobs = jobs
        self._stages = stages

    def collect(self) -> Iterator[Metric]:
        jobs = CounterMetricFamily("prorl_jobs", "Jobs that ended, by status", labels=["status"])
        for status, n in self._jobs.values.items():
            jobs.add_metric([status], n, created=self._jobs.created)
        yield jobs
        obs = self._stages
        hist = HistogramMetricFamily(
            "prorl_stage_seconds", "Active seconds spent in a stage", labels=["stage"]
        )
        for stage, counts in obs.counts.items():
            total, buckets = 0, []
            for bound, n in zip((*obs.bounds, float("inf")), counts, strict=True):
                total += n
                buckets.append((_le(bound), total))
            hist.add_metric([stage], buckets, obs.sums[stage])
        yield hist


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


class Metrics:
    """One registry per server (so several servers can live in one process)."""

    def __init__(self, state: LiveState) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.jobs_total = _Counts(("done", "failed", "cancelled", "timed_out"))
        self.stage_seconds = _Observations(("init", "run", "eval"), _STAGE_BUCKETS)
        self.registry.register(_EventCollector(self.jobs_total, self.stage_seconds))
        self.tool_seconds = Histogram(
            "prorl_tool_seconds",
            "Seconds per tool call",
            ["tool"],
            buckets=_TOOL_BUCKETS,
            registry=self.registry,
        )
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
        # How late the server's 1-s heartbeat woke: the longest in the last minute. A
        # blocked event loop shows here (every request waited as long).
        self._lags: deque[float] = deque(maxlen=60)
        self.loop_lag = Gauge(
            "prorl_loop_lag_seconds",
            "Longest event-loop lag in the last minute (a 1-s heartbeat's lateness)",
            registry=self.registry,
        )
        self.loop_lag.set_function(lambda: max(self._lags, default=0.0))
        self.registry.register(_LiveCollector(state))

    def lagged(self, seconds: float) -> None:
        """A heartbeat woke ``seconds`` late."""
        self._lags.append(max(seconds, 0.0))

    # The backend pool's observer (llm.pool.PoolObserver).
    def interrupted(self, tokens_kept: int, tokens_discarded: int) -> None:
        self.generations_interrupted.inc()
        self.tokens_kept.inc(tokens_kept)
        self.tokens_discarded.inc(tokens_discarded)

    def paused(self, seconds: float) -> None:
        self.weight_pause_seconds.observe(seconds)

    def stage_finished(self, stage: str, seconds: float) -> None:
        self.stage_seconds.observe(stage, seconds)

    def job_finished(self, status: str) -> None:
        self.jobs_total.values[status] += 1

    def tool_called(self, tool: str, seconds: float) -> None:
        self.tool_seconds.labels(tool).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
