"""The autoscaler: sets each stage's concurrency from measurements, every interval.

Little's law, applied twice (no tuning constants beyond the hysteresis):

1. The sandbox budget bounds throughput: a job holds sandboxes for ``S`` sandbox-seconds
   on average (measured: the integral of live sandboxes over completed jobs), so at
   most ``X_max = B / S`` jobs per second fit in a budget of ``B``. The target
   throughput is ``X = X_max`` while jobs wait in INIT's queue, else
   ``min(X_max, arrival rate)``.
2. A stage whose jobs take ``W_s`` seconds (wall time, measured) needs ``X * W_s``
   workers to carry ``X`` jobs per second; one worker is added for variance.

Hysteresis: a stage grows as soon as the target is above its size, and shrinks only
after ``shrink_after`` consecutive ticks asked for at least 10% fewer workers.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec

from prorl_async.job import Stage

if TYPE_CHECKING:
    from prorl_async.capacity.budget import SandboxBudget
    from prorl_async.pipeline import Pipeline

__all__ = ["AutoscaleConfig", "Autoscaler", "Decision"]

log = logging.getLogger(__name__)

STAGES = ("init", "run", "eval")


class AutoscaleConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Bounds and pace of the autoscaler (``[autoscaling]`` in the TOML config)."""

    interval_s: float = 1.0
    shrink_after: int = 3
    init_min: int = 1
    init_max: int = 64
    run_min: int = 1
    run_max: int = 512
    eval_min: int = 1
    eval_max: int = 128

    def bounds(self, stage: str) -> tuple[int, int]:
        return getattr(self, f"{stage}_min"), getattr(self, f"{stage}_max")

    def problem(self) -> str | None:
        """What is wrong with these settings, or ``None``."""
        if self.interval_s <= 0:
            return f"autoscaling.interval_s must be > 0, got {self.interval_s}"
        if self.shrink_after < 1:
            return f"autoscaling.shrink_after must be >= 1, got {self.shrink_after}"
        for stage in STAGES:
            lo, hi = self.bounds(stage)
            if not 1 <= lo <= hi:
                return f"autoscaling.{stage}_min/{stage}_max must be 1 <= min <= max, got {lo}/{hi}"
        return None


class Decision(msgspec.Struct, frozen=True):
    stage: str
    old: int
    new: int
    reason: str


class _SandboxSeconds:
    """Integral of live sandboxes over time, read per tick."""

    def __init__(self, live: Callable[[], int]) -> None:
        self._live = live
        self.total = 0.0
        self._last = time.monotonic()

    def tick(self) -> None:
        now = time.monotonic()
        self.total += self._live() * (now - self._last)
        self._last = now


class Autoscaler:
    """Owns one background task that resizes ``pipeline``'s pools every ``interval_s``."""

    def __init__(
        self,
        pipeline: Pipeline,
        budget: Callable[[], SandboxBudget | None],
        config: AutoscaleConfig,
    ) -> None:
        self.pipeline = pipeline
        self.config = config
        self.decisions: dict[tuple[str, str], int] = {}
        self.arrivals = pipeline.stats["init"].arrivals
        self._budget = budget
        self._low_ticks = dict.fromkeys(STAGES, 0)
        self._sandbox_s = _SandboxSeconds(self._live_sandboxes)
        self._done_at_start = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._done_at_start = self._completed()
            self._task = asyncio.create_task(self._loop(), name="autoscaler")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task])
            self._task = None

    async def _loop(self) -> None:
        while True:
            # A control period, not synchronisation: the controller samples on a clock.
            await asyncio.sleep(self.config.interval_s)
            try:
                self.tick()
            except Exception:
                log.exception("autoscaler tick failed; pools left as they are")

    # -- the control law ---------------------------------------------------------------

    def _live_sandboxes(self) -> int:
        budget = self._budget()
        return 0 if budget is None else budget.live

    def _completed(self) -> int:
        return self.pipeline.stats["eval"].service.count

    def target_throughput(self) -> float | None:
        """Jobs/s the pools should carry: ``None`` until a job has completed, ``inf`` when
        nothing bounds it (jobs waiting and no sandboxes used)."""
        done = self._completed() - self._done_at_start
        if done <= 0:
            return None
        budget = self._budget()
        x_max = math.inf
        per_job = self._sandbox_s.total / done
        if budget is not None and budget.capacity is not None and per_job > 0:
            x_max = budget.capacity / per_job
        backlog = self.pipeline.queued[self._stage("init")] > 0
        return x_max if backlog else min(x_max, self.arrivals.rate() * 1.2)

    def desired(self, stage: str, x: float) -> int:
        w = self.pipeline.stats[stage].service.value
        if w is None:
            return self.pipeline.pools[self._stage(stage)].size
        lo, hi = self.config.bounds(stage)
        if math.isinf(x):
            return hi
        return min(max(math.ceil(x * w) + 1, lo), hi)

    def tick(self) -> list[Decision]:
        """One control step: measure, decide, resize. Returns what changed."""
        self._sandbox_s.tick()
        x = self.target_throughput()
        if x is None:
            return []
        made = []
        for stage in STAGES:
            decision = self._decide(stage, self.desired(stage, x), x)
            if decision is not None:
                self.pipeline.resize(self._stage(stage), decision.new)
                made.append(decision)
        return made

    def _decide(self, stage: str, want: int, x: float) -> Decision | None:
        size = self.pipeline.pools[self._stage(stage)].size
        if want > size:
            self._low_ticks[stage] = 0
            return self._record(stage, size, want, x, "up")
        if want < size * 0.9 and size - want >= 1:
            self._low_ticks[stage] += 1
            if self._low_ticks[stage] >= self.config.shrink_after:
                self._low_ticks[stage] = 0
                return self._record(stage, size, want, x, "down")
        else:
            self._low_ticks[stage] = 0
        return None

    def _record(self, stage: str, old: int, new: int, x: float, direction: str) -> Decision:
        key = (stage, direction)
        self.decisions[key] = self.decisions.get(key, 0) + 1
        w = self.pipeline.stats[stage].service.value or 0.0
        reason = f"X={x:.2f} jobs/s * W={w:.3f}s"
        log.debug("autoscale %s: %d -> %d workers (%s)", stage, old, new, reason)
        return Decision(stage, old, new, reason)

    @staticmethod
    def _stage(name: str) -> Stage:
        return Stage(name)
