"""Capacity as /status and /metrics show it, read from live state at request/scrape time."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from prorl_async.schemas import BudgetInfo, StagePoolInfo

if TYPE_CHECKING:
    from prorl_async.capacity.autoscale import Autoscaler
    from prorl_async.capacity.protocols import BudgetedRuntime, StagedPipeline

__all__ = ["CapacityView"]


class CapacityView(Collector):
    """Pools, sandbox budget, idle sandbox-seconds and autoscaler decisions."""

    def __init__(
        self,
        pipeline: StagedPipeline,
        runtime: Callable[[], BudgetedRuntime | None],
        autoscaler: Autoscaler | None,
    ) -> None:
        self.pipeline = pipeline
        self._runtime = runtime
        self.autoscaler = autoscaler

    def pools(self) -> dict[str, StagePoolInfo]:
        active = self.pipeline.active
        return {
            s.value: StagePoolInfo(configured=p.size, live=p.live, busy=active[s])
            for s, p in self.pipeline.pools.items()
        }

    def budget(self) -> BudgetInfo | None:
        runtime = self._runtime()
        if runtime is None:
            return None
        b = runtime.budget
        warm = runtime.warm
        return BudgetInfo(
            max=b.capacity,
            live=b.live,
            waiting=b.waiting,
            peak=b.peak,
            wait_seconds=round(b.wait_seconds, 3),
            warm_ready=0 if warm is None else warm.ready,
        )

    def idle_sandbox_seconds(self) -> dict[str, float]:
        out = {stage: st.idle_sandbox_seconds for stage, st in self.pipeline.stats.items()}
        runtime = self._runtime()
        warm = None if runtime is None else runtime.warm
        if warm is not None:
            out["warm"] = warm.live_idle_seconds()
        return {k: round(v, 3) for k, v in out.items()}

    # -- Prometheus ------------------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        yield self._workers()
        yield from self._budget_metrics()
        idle = CounterMetricFamily(
            "prorl_idle_sandbox_seconds",
            "Seconds sandboxes were alive but waiting (stage queue, or warm and unused)",
            labels=["stage"],
        )
        for stage, seconds in self.idle_sandbox_seconds().items():
            idle.add_metric([stage], seconds)
        yield idle
        waiting = self.pipeline.jit.waiting
        yield GaugeMetricFamily(
            "prorl_jit_waiting", "INIT workers held back by just-in-time INIT", value=waiting
        )
        yield self._decisions()

    def _workers(self) -> Metric:
        family = GaugeMetricFamily(
            "prorl_stage_workers",
            "Workers per stage: configured size, alive, busy in a job",
            labels=["stage", "state"],
        )
        for stage, info in self.pools().items():
            family.add_metric([stage, "configured"], info.configured)
            family.add_metric([stage, "live"], info.live)
            family.add_metric([stage, "busy"], info.busy)
        return family

    def _budget_metrics(self) -> Iterator[Metric]:
        info = self.budget()
        if info is None:
            return
        if info.max is not None:
            yield GaugeMetricFamily(
                "prorl_sandbox_budget", "Live sandboxes allowed at once", value=info.max
            )
        yield GaugeMetricFamily(
            "prorl_sandbox_budget_waiting",
            "Sandbox starts waiting for a budget slot (their job's timer paused)",
            value=info.waiting,
        )
        yield CounterMetricFamily(
            "prorl_sandbox_budget_wait_seconds",
            "Seconds sandbox starts spent waiting for a budget slot",
            value=info.wait_seconds,
        )
        yield GaugeMetricFamily(
            "prorl_warm_sandboxes", "Warm sandboxes ready to be taken", value=info.warm_ready
        )

    def _decisions(self) -> Metric:
        family = CounterMetricFamily(
            "prorl_autoscale_decisions",
            "Pool resizes made by the autoscaler",
            labels=["stage", "direction"],
        )
        if self.autoscaler is not None:
            for (stage, direction), n in sorted(self.autoscaler.decisions.items()):
                family.add_metric([stage, direction], n)
        return family
