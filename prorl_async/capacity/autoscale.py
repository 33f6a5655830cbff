"""The autoscaler: sets each stage's concurrency from measurements, every interval.

Little's law, applied twice (no tuning constants beyond the hysteresis):

1. The sandbox budget bounds throughput: a job holds sandboxes for ``S`` sandbox-seconds
   on average, so at most ``X_max = B / S`` jobs per second fit in a budget of ``B``.
   ``S`` is measured per stage: INIT's active time (its sandbox is held, the slot wait
   is not), RUN's wall time and its queue's idle sandbox-seconds per job, and the
   recent share of EVALs that take a fresh sandbox times *those* EVALs' active time
   (in a math/swe mix, the mean over all EVALs would count the sandbox-free ones too);
   likewise for RUN's own starts (sandboxes started on first use take their slot there).
2. A stage whose jobs take ``W_s`` active seconds (measured; waits for a sandbox slot
   or a backend excluded: more workers do not shorten those) needs ``X_s * W_s``
   workers to carry ``X_s`` jobs per second; one worker is added for variance. When
   the jobs in the stage have already run longer (median) than ``W_s``, that is used:
   finished jobs alone lag after a shift to longer jobs (e.g. swe after math EVALs),
   the more so the fewer workers the stage has. ``X_s``
   is ``X_max`` while jobs wait in the stage's queue or any queue before it, else
   ``min(X_max, 1.2 * the stage's arrival rate)``: jobs already inside the pipeline keep
   the later stages provisioned after intake stops. A stage whose workers are all busy
   while jobs wait in its queue and budget slots are free gets at least one more worker
   per such job (the pool, not the budget, holds them back then).
3. RUN is also capped by what the LLM backends serve: while some RUN jobs wait for a
   backend now (timer paused), only the others are decoding; more workers would only
   hold sandboxes waiting (and, with just-in-time INIT, the RUN size bounds INIT too).

Hysteresis: a stage grows as soon as the target is above its size, and shrinks only
after ``shrink_after`` consecutive ticks asked for at least 10% fewer workers.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec

from prorl_async.schemas import Stage

if TYPE_CHECKING:
    from prorl_async.capacity.budget import SandboxBudget
    from prorl_async.capacity.protocols import StagedPipeline

__all__ = ["AutoscaleConfig", "Autoscaler", "Decision"]

log = logging.getLogger(__name__)

STAGES = ("init", "run", "eval")
# RUN counts as backend-bound when its wall time is this much above its active time.
_BACKEND_BOUND = 1.2


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


class Autoscaler:
    """Owns one background task that resizes ``pipeline``'s pools every ``interval_s``."""

    def __init__(
        self,
        pipeline: StagedPipeline,
        budget: Callable[[], SandboxBudget | None],
        config: AutoscaleConfig,
    ) -> None:
        self.pipeline = pipeline
        self.config = config
        self.decisions: dict[tuple[str, str], int] = {}
        self._budget = budget
        self._low_ticks = dict.fromkeys(STAGES, 0)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
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

    def sandbox_seconds_per_job(self) -> float | None:
        """``S``: sandbox-seconds one job holds (``None`` until every stage has a sample)."""
        st = self.pipeline.stats
        a_init, w_run = st["init"].active.value, st["run"].service.value
        a_eval = st["eval"].active.value
        if a_init is None or w_run is None or a_eval is None:
            return None
        budget = self._budget()
        taken = {} if budget is None else budget.taken_by
        init_n, run_n = (max(st[s].service.count, 1) for s in ("init", "run"))
        holds_init = min(taken.get("init", 0) / init_n, 1.0)
        queue_idle = st["run"].idle_sandbox_seconds / run_n
        held = holds_init * (a_init + w_run + queue_idle)
        # RUN and EVAL: the recent share of the stage's jobs that took a sandbox in it (in
        # RUN: sandboxes started on first use) times *their* active time.
        for stage in ("run", "eval"):
            held += (st[stage].sandboxed.value or 0.0) * (st[stage].sandboxed_active.value or 0.0)
        return held

    def max_throughput(self) -> float | None:
        """``X_max`` in jobs/s: ``None`` until every stage was measured, ``inf`` when the
        budget does not bind (no budget, or jobs that use no sandbox)."""
        per_job = self.sandbox_seconds_per_job()
        if per_job is None:
            return None
        budget = self._budget()
        if budget is None or budget.capacity is None or per_job <= 0:
            return math.inf
        return budget.capacity / per_job

    def stage_throughput(self, stage: str, x_max: float) -> float:
        """``X_s``: what the stage must carry: all it can while jobs wait in its queue or
        any queue before it. Its own arrival rate would not do then: with just-in-time
        INIT, RUN's queue stays empty and RUN's arrivals follow RUN's own size, so sizing
        RUN from them only follows its own size down."""
        upstream = STAGES[: STAGES.index(stage) + 1]
        if any(self.pipeline.queued[Stage(s)] > 0 for s in upstream):
            return x_max
        return min(x_max, self.pipeline.stats[stage].arrivals.rate() * 1.2)

    def desired(self, stage: str, x: float) -> int:
        st = self.pipeline.stats[stage]
        w = self.service_time(stage)
        if w is None:
            return self.pipeline.pools[Stage(stage)].size
        lo, hi = self.config.bounds(stage)
        want = hi if math.isinf(x) else math.ceil(x * w) + 1
        want = max(want, self.backlog_floor(stage))
        if stage == "run" and st.service.value is not None:
            want = min(want, self._backend_cap(st.service.value, hi))
        return min(max(want, lo), hi)

    def backlog_floor(self, stage: str) -> int:
        """Workers the stage needs at least now: while jobs wait in its queue behind a
        pool whose workers are all busy and sandbox-budget slots are free, the pool
        alone holds them back, so it gets one more worker per waiting job the free
        slots could serve (0: the pool is not what holds jobs back).

        Little's law sizes for the mean; this keeps the budget working through what
        the mean misses, e.g. a run of long EVALs at the end of a mix, or RUN full
        while just-in-time INIT waits for it with slots free."""
        size, queued = self.pipeline.pools[Stage(stage)].size, self.pipeline.queued[Stage(stage)]
        if queued == 0 or self.pipeline.active[Stage(stage)] < size:
            return 0
        budget = self._budget()
        free = None if budget is None else budget.free
        more = queued if free is None else min(queued, free)
        return size + more if more else 0

    def service_time(self, stage: str) -> float | None:
        """``W_s``: the recent mean active time of finished jobs, or the median time the
        jobs in the stage have already run if that is longer (jobs got longer)."""
        st = self.pipeline.stats[stage]
        if st.active.value is None:
            return None
        return max(st.active.value, st.running_age() or 0.0)

    def _backend_cap(self, wall: float, hi: int) -> int:
        """RUN jobs decoding now, plus one, while some RUN job waits for a backend now.

        Counted now, not from the recent wall/active ratio times RUN's busy workers: that
        ratio remembers a saturation past (e.g. the start, when more jobs than decoding
        slots entered RUN), so it scaled a RUN pool the budget held small down further.
        """
        run = self.pipeline.stats["run"]
        active, busy, waiting = run.active.value, self.pipeline.active[Stage.RUN], run.paused()
        if not active or wall <= active * _BACKEND_BOUND or busy == 0 or waiting == 0:
            return hi
        return busy - waiting + 1

    def tick(self) -> list[Decision]:
        """One control step: measure, decide, resize. Returns what changed."""
        x_max = self.max_throughput()
        if x_max is None:
            return []
        made = []
        for stage in STAGES:
            x = self.stage_throughput(stage, x_max)
            decision = self._decide(stage, self.desired(stage, x), x)
            if decision is not None:
                self.pipeline.resize(Stage(stage), decision.new)
                made.append(decision)
        return made

    def _decide(self, stage: str, want: int, x: float) -> Decision | None:
        size = self.pipeline.pools[Stage(stage)].size
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
        w = self.service_time(stage) or 0.0
        reason = f"X={x:.2f} jobs/s * W={w:.3f}s"
        log.debug("autoscale %s: %d -> %d workers (%s)", stage, old, new, reason)
        return Decision(stage, old, new, reason)
