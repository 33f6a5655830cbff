"""The autoscaler: the control law on a real pipeline, then the server under load."""

from __future__ import annotations

import asyncio
import logging
import math
import sys

import pytest

from prorl_async.capacity import AutoscaleConfig, Autoscaler, SandboxBudget
from prorl_async.config import ConfigError, load_config
from prorl_async.core.job import Stage
from prorl_async.core.pipeline import Pipeline
from prorl_async.store import MemoryJobStore
from prorl_async.util.timer import PausableTimer
from tests.capacity.budgeted import BudgetedHandler
from tests.capacity.test_budget import scrape
from tests.capacity.timers import entered
from tests.helpers import ServerFactory


def _pipeline() -> Pipeline:
    store = MemoryJobStore(retention_s=60, tombstone_s=60)
    return Pipeline(store=store, workers={Stage.INIT: 4, Stage.RUN: 4, Stage.EVAL: 4})


def test_littles_law_sizes_and_hysteresis(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="prorl_async.capacity.autoscale")
    pipe = _pipeline()
    budget = SandboxBudget(20)
    cfg = AutoscaleConfig(shrink_after=3, run_max=100)
    scaler = Autoscaler(pipe, lambda: budget, cfg)
    assert scaler.tick() == []  # nothing measured yet: no guess
    # INIT: 0.2 s active (plus 0.3 s waiting for a slot); RUN 2 s; EVAL 0.1 s, no sandbox.
    pipe.stats["init"].finished(0.5, 0.2)
    pipe.stats["run"].finished(2.0, 2.0)
    pipe.stats["eval"].finished(0.1, 0.1)
    budget.taken_by["init"] = 1  # INIT took a slot per job, EVAL none
    per_job = scaler.sandbox_seconds_per_job()
    assert per_job is not None and math.isclose(per_job, 0.2 + 2.0)
    x_max = scaler.max_throughput()
    assert x_max is not None and math.isclose(x_max, 20 / 2.2)
    pipe.queued[Stage.INIT] = 50  # backlogs: carry all the budget allows
    pipe.queued[Stage.RUN] = 5
    # RUN needs ceil(X * W) + 1 = 20: it grows at once. INIT wants 3 and EVAL (empty
    # queue, nothing arriving) 1, fewer than their 4: a shrink waits for three ticks.
    made = {d.stage: d.new for d in scaler.tick()}
    assert made == {"run": math.ceil(x_max * 2.0) + 1} == {"run": 20}
    assert scaler.desired("init", x_max) == 3
    assert pipe.workers[Stage.INIT] == 4 and pipe.workers[Stage.RUN] == 20
    assert "autoscale run: 4 -> 20 workers (X=9.09 jobs/s * W=2.000s)" in caplog.text
    # Demand collapses: empty queues, nothing arriving.
    pipe.queued[Stage.INIT] = pipe.queued[Stage.RUN] = 0
    assert scaler.tick() == []
    assert {d.stage: d.new for d in scaler.tick()} == {"init": 1, "eval": 1}
    assert {d.stage: d.new for d in scaler.tick()} == {"run": 1}
    assert pipe.workers == {Stage.INIT: 1, Stage.RUN: 1, Stage.EVAL: 1}
    assert scaler.decisions[("run", "up")] == 1 and scaler.decisions[("run", "down")] == 1


def test_run_is_capped_at_what_the_backends_serve() -> None:
    pipe = _pipeline()
    scaler = Autoscaler(pipe, lambda: SandboxBudget(100), AutoscaleConfig())
    pipe.stats["run"].finished(4.0, 1.0)  # 3 of every 4 seconds waiting for a backend
    pipe.active[Stage.RUN] = 8
    # 6 of the 8 wait for a backend now
    timers = [entered(pipe.stats["run"], key, active=0.5, paused=key < 6) for key in range(8)]
    assert pipe.stats["run"].paused() == 6
    assert scaler.desired("run", 50.0) == 8 - 6 + 1  # the 2 decoding, plus one
    # The ratio above is history (e.g. the start, more jobs than decoding slots): with
    # no RUN job waiting for a backend now, the backends are not what bounds RUN.
    for timer in timers[:6]:
        timer.resume()
    assert scaler.desired("run", 50.0) == 51
    pipe.stats["run"] = type(pipe.stats["run"])()
    pipe.stats["run"].finished(1.0, 1.0)  # no backend wait: Little's law alone
    assert scaler.desired("run", 50.0) == 51


async def test_autoscale_grows_pools_under_load_within_the_budget(
    make_server: ServerFactory,
) -> None:
    handler = BudgetedHandler()
    autoscaling = {"interval_s": 0.2, "run_max": 32}
    async with make_server(
        handlers=(handler,),
        runtime="local",
        max_sandboxes=6,
        init_workers=1,
        run_workers=1,
        eval_workers=1,
        autoscale=True,
        autoscaling=autoscaling,
    ) as srv:
        pipe = srv.service.pipeline
        instance = {"init_s": 0.02, "run_s": 0.3, "eval_s": 0.02}
        ids = await srv.client.submit_batch([{"task": "budgeted", "instance": instance}] * 60)
        peak_run = 0
        pending = set(ids)
        while pending:
            polled = await srv.client.poll(list(pending), wait=0.1)
            pending -= {r["job_id"] for r in polled["done"]}
            peak_run = max(peak_run, pipe.active[Stage.RUN])
        status = await srv.client.status()
        assert status["autoscale"] is True
        # One RUN worker at the start; the budget of 6 allows ~6 at once and it got there.
        assert peak_run >= 4 and pipe.pools[Stage.RUN].size >= 4, (peak_run, status["pools"])
        assert srv.runtime.budget.peak <= 6
        text = await scrape(srv.url)
        assert 'prorl_autoscale_decisions_total{direction="up",stage="run"}' in text


def test_autoscaling_bounds_from_config_and_errors_name_the_field() -> None:
    cfg = load_config(overrides={"autoscale": True, "autoscaling": {"run_max": 9}}, env={})
    assert cfg.autoscale and cfg.autoscaling.bounds("run") == (1, 9)
    with pytest.raises(ConfigError, match="run_min/run_max"):
        load_config(overrides={"autoscaling": {"run_min": 5, "run_max": 2}}, env={})
    with pytest.raises(ConfigError, match="warm_sandboxes"):
        load_config(overrides={"warm_sandboxes": -1}, env={})
    env = {"PRORL_MAX_SANDBOXES": "12", "PRORL_AUTOSCALE": "true"}
    cfg = load_config(env=env)
    assert cfg.max_sandboxes == 12 and cfg.autoscale is True


async def test_cli_max_sandboxes_0_exits_2_naming_it() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "prorl_async.cli",
        "serve",
        "--autoscale",
        "--max-sandboxes",
        "0",
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await proc.communicate()
    assert proc.returncode == 2 and b"max_sandboxes must be >= 1" in err


async def test_sandbox_seconds_count_only_the_evals_that_take_a_sandbox(
    make_server: ServerFactory,
) -> None:
    # Half the EVALs hold a fresh sandbox for 0.2 s, half take none and last no time:
    # EVAL adds ~0.5 * 0.2 = 0.1 sandbox-seconds per job. Scaling the mean EVAL time of
    # all jobs (~0.1 s) by the sandboxed share (~0.5) would count ~0.05, and so overrate
    # what the budget carries.
    swe = {"eval_s": 0.2, "eval_sandbox": True}
    async with make_server(
        handlers=(BudgetedHandler(),), runtime="local", max_sandboxes=64, eval_workers=8
    ) as srv:
        ids = await srv.client.submit_batch(
            [{"task": "budgeted", "instance": swe if i % 2 else {}} for i in range(40)]
        )
        docs = [await srv.client.result(i, wait=30) for i in ids]
        assert all(d is not None and d["status"] == "done" for d in docs)
        budget = srv.runtime.budget
        scaler = Autoscaler(srv.service.pipeline, lambda: budget, AutoscaleConfig())
        per_job = scaler.sandbox_seconds_per_job()
        st = srv.service.pipeline.stats
        init_active, run_service = st["init"].active.value, st["run"].service.value
        assert per_job is not None and init_active is not None and run_service is not None
        held_to_run = init_active + run_service
        held_to_run += st["run"].idle_sandbox_seconds / st["run"].service.count
        eval_part = per_job - held_to_run
        assert 0.08 <= eval_part <= 0.2, (eval_part, per_job)


def test_a_shift_to_sandboxed_evals_shows_within_tens_of_jobs() -> None:
    # 100 math-like EVALs without a sandbox, then 40 swe-like ones holding one for 3 s:
    # the sandboxed share is a recent average (EWMA), not a since-start count (40/140).
    pipe = _pipeline()
    budget = SandboxBudget(20)
    scaler = Autoscaler(pipe, lambda: budget, AutoscaleConfig())
    pipe.stats["init"].finished(0.1, 0.1, 1)
    pipe.stats["run"].finished(1.0, 1.0)
    budget.taken_by["init"] = 1
    for _ in range(100):
        pipe.stats["eval"].finished(0.02, 0.02)
    before = scaler.sandbox_seconds_per_job()
    for _ in range(40):
        pipe.stats["eval"].finished(3.0, 3.0, 1)
    budget.taken_by["eval"] = 40
    after = scaler.sandbox_seconds_per_job()
    assert before is not None and math.isclose(before, 1.1)
    assert after is not None and after - 1.1 >= 0.8 * 3.0, after


def test_sandboxes_started_on_first_use_count_in_run() -> None:
    # sandbox_start = on_first_use: INIT takes no slot; half the RUNs start a sandbox at
    # their first tool call and hold it for their 2 s, the others answer in 0.5 s and
    # take none. S = 0.5 * 2 = 1 sandbox-second per job, not 0 (unbounded throughput).
    pipe = _pipeline()
    budget = SandboxBudget(20)
    scaler = Autoscaler(pipe, lambda: budget, AutoscaleConfig())
    pipe.stats["init"].finished(0.01, 0.01)
    for i in range(200):
        pipe.stats["run"].finished(*((2.0, 2.0, 1) if i % 2 else (0.5, 0.5, 0)))
    pipe.stats["eval"].finished(0.01, 0.01)
    budget.taken_by["run"] = 100
    per_job = scaler.sandbox_seconds_per_job()
    assert per_job is not None and math.isclose(per_job, 1.0, rel_tol=0.1), per_job
    x_max = scaler.max_throughput()
    assert x_max is not None and math.isclose(x_max, 20 / per_job)


def test_jobs_getting_longer_show_before_they_finish() -> None:
    # 100 EVALs of 0.02 s finished; now 4 EVALs (swe-like) have run 2 s and go on. Sized
    # from finished jobs only, EVAL would get ceil(10 * 0.02) + 1 = 2 workers, and the
    # longer EVALs would show only as the few it runs finish.
    pipe = _pipeline()
    scaler = Autoscaler(pipe, lambda: SandboxBudget(20), AutoscaleConfig())
    st = pipe.stats["eval"]
    for _ in range(100):
        st.finished(0.02, 0.02)
    assert scaler.desired("eval", 10.0) == 2
    timers: dict[object, PausableTimer] = {key: entered(st, key, active=2.0) for key in range(4)}
    assert scaler.service_time("eval") == 2.0
    assert scaler.desired("eval", 10.0) == math.ceil(10 * 2.0) + 1
    timers["straggler"] = entered(st, "straggler", active=500.0)  # the median ignores it
    assert scaler.service_time("eval") == 2.0
    for key, timer in timers.items():
        st.leave(key, timer)
    assert scaler.service_time("eval") == st.active.value


def test_run_is_sized_for_all_the_budget_carries_while_jobs_wait_upstream() -> None:
    # Just-in-time INIT keeps RUN's queue empty and RUN's arrivals follow RUN's own
    # size: sizing RUN from 1.2x its arrivals while 30 jobs wait in INIT's queue shrank
    # it step by step (a slow spiral). Jobs waiting upstream are RUN's demand too.
    pipe = _pipeline()
    scaler = Autoscaler(pipe, lambda: SandboxBudget(20), AutoscaleConfig())
    pipe.stats["run"].arrivals.add()  # one arrival in the window: rate ~ 1 job/s at most
    assert scaler.stage_throughput("run", 9.0) <= 1.2
    pipe.queued[Stage.INIT] = 30
    assert scaler.stage_throughput("run", 9.0) == 9.0
    assert scaler.stage_throughput("eval", 9.0) == 9.0
    pipe.queued[Stage.INIT] = 0
    pipe.queued[Stage.EVAL] = 5  # a queue after RUN is not RUN's demand
    assert scaler.stage_throughput("run", 9.0) <= 1.2


def test_a_full_pool_with_a_queue_grows_into_free_budget_slots() -> None:
    # 100 short EVALs measured: Little's law wants 2 workers. Now 4 long EVALs fill the
    # pool of 4, 6 more wait, and 3 budget slots are free: the pool alone holds them back.
    pipe = _pipeline()
    budget = SandboxBudget(20)
    scaler = Autoscaler(pipe, lambda: budget, AutoscaleConfig())
    for _ in range(100):
        pipe.stats["eval"].finished(0.02, 0.02)
    assert scaler.desired("eval", 1.0) == 2
    pipe.queued[Stage.EVAL], pipe.active[Stage.EVAL] = 6, 4
    budget.live = 17
    assert scaler.backlog_floor("eval") == 4 + 3
    assert scaler.desired("eval", 1.0) == 7
    budget.live = 20  # no free slot: more workers would only wait for one
    assert scaler.desired("eval", 1.0) == 2
    budget.live, pipe.active[Stage.EVAL] = 17, 3  # an idle worker: the pool is not the bound
    assert scaler.desired("eval", 1.0) == 2
    unbounded = Autoscaler(pipe, lambda: None, AutoscaleConfig())
    pipe.active[Stage.EVAL] = 4
    assert unbounded.backlog_floor("eval") == 4 + 6
