"""Seeded chaos over the server pipeline ("Nothing may hang").

One in-process server per seed, on a TEST DOUBLE sandbox runtime (``ChaosRuntime``: the
real start path, budget and warm pool over process-less sandboxes whose starts succeed,
fail or hang as the schedule says) and scripted LLM backends. The seed picks the server
(budget at its floor, warm pool on or off and above the budget, stage workers, JIT INIT,
store) and a random schedule of: job bursts (one at once, the start-up race), sandbox
starts failing or hanging, idle warm sandboxes dying, backends killed and revived or
answering 503s / hanging / dropping, cancels and ``POST /workers`` resizes.

Then the chaos stops (backends back, faults off, starts work) and the property is
checked: every job reaches a terminal state within its active-time budget plus a
bound, and ``/status`` returns to idle: nothing queued or active, nobody waiting for a
slot, a backend or the JIT admission, and no live sandbox or budget slot but the warm pool's.

Knobs: ``PRORL_CHAOS_SEED=N[,M]`` or ``--chaos-seed N`` replays seeds, ``PRORL_CHAOS_SEEDS=K``
runs seeds 0..K-1 (default: ``conftest.CI_SEEDS``), ``PRORL_CHAOS_DURATION_S`` is the
length of the chaos phase (default 3 s). The schedule and the server are fixed by the
seed; which start or request meets which fault also depends on timing, so a replay
re-runs the same schedule, not the same interleaving.
"""

from __future__ import annotations

import asyncio
import collections
import os
import random
from typing import Any, Literal

import msgspec
import pytest

import prorl_async.core.shared as shared_module
from prorl_async import AgentHandler, Job, run_agent, start_sandbox
from prorl_async.client import RolloutError
from prorl_async.sandbox import RuntimeConfig, SandboxLimits, SandboxSpec, WarmPool
from prorl_async.sandbox.runtime import SandboxStartError
from prorl_async.scripted_llm import LatencyModel, ScriptedLLM
from tests.chaos.fake_runtime import FakeRuntime, FakeSandbox, FakeStart
from tests.helpers import Server, ServerFactory, eventually

DURATION_S = float(os.environ.get("PRORL_CHAOS_DURATION_S", "3"))
# Past the longest job budget, once the chaos has stopped: time for the backends to be
# found healthy again and the queues to drain. A liveness bound, not a latency target.
BOUND_S = 30.0
TIMEOUTS_S = (1.0, 3.0)  # each job's active-time budget is drawn from this range
TERMINAL = {"done", "failed", "cancelled", "timed_out"}
# What the chaos may fail a job with: a sandbox start failing, an LLM backend failing
# (dead, 503, dropped), a budget running out. Anything else (an AttributeError, a
# KeyError...) is a bug the chaos found.
EXPECTED_ERRORS = {
    "SandboxStartError",
    "TimeoutError",
    "BackendError",
    "EngineUnavailable",
    "EngineRejected",
    "MalformedResponse",
}


# -- the test doubles ------------------------------------------------------------------------


class ChaosRuntime(FakeRuntime):
    """Starts succeed after a short delay, fail, or hang (until cancelled: by the job's
    timeout, a cancel, the warm pool giving its slot back, or the server closing) at the
    rates the schedule sets."""

    def __init__(self, config: RuntimeConfig, rng: random.Random) -> None:
        super().__init__(config, script=self._chaos)
        self.rng = rng
        self.fail_rate = 0.0
        self.hang_rate = 0.0
        self.outcomes: collections.Counter[str] = collections.Counter()

    async def _chaos(self, start: FakeStart) -> None:
        x = self.rng.random()
        if x < self.fail_rate:
            self.outcomes["fail"] += 1
            await asyncio.sleep(0)
            raise SandboxStartError("chaos: this sandbox start failed")
        if x < self.fail_rate + self.hang_rate:
            self.outcomes["hang"] += 1
            await asyncio.Event().wait()  # never set: ends only by cancellation
        self.outcomes["ok"] += 1
        await asyncio.sleep(self.rng.uniform(0.0, 0.03))  # the start's own latency


class ChaosInstance(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    # "warm": the warm pool's spec (as math/code/swe INIT); the others can never use one.
    spec: Literal["warm", "files", "limits"] = "warm"
    eval_sandbox: bool = False  # a fresh sandbox in EVAL (as the code task's tests)


class NoTools:
    specs: list[dict[str, Any]] = []

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        raise AssertionError(f"no tools here, {name} called")


def _spec(kind: str, limits: SandboxLimits) -> SandboxSpec:
    if kind == "files":
        return SandboxSpec(files={"task.txt": "x"}, limits=limits)
    if kind == "limits":
        return SandboxSpec(limits=msgspec.structs.replace(limits, max_processes=64))
    return SandboxSpec(limits=limits)


class ChaosHandler(AgentHandler):
    """A TEST DOUBLE task: a sandbox from INIT to the end of RUN, one agent loop on the
    backends, optionally a fresh sandbox of another spec in EVAL."""

    name = "chaos"
    instance_type = ChaosInstance

    async def init(self, job: Job) -> None:
        inst: ChaosInstance = job.instance
        limits = job.shared.config.sandbox_limits
        job.state["sandbox"] = await start_sandbox(job, _spec(inst.spec, limits))

    async def run(self, job: Job) -> None:
        messages = [{"role": "user", "content": "What is 6 * 7?"}]
        await run_agent(job, messages=messages, tools=NoTools(), max_turns=2)

    async def eval(self, job: Job) -> None:
        runtime = job.shared.runtime
        assert runtime is not None
        if job.instance.eval_sandbox:
            limits = job.shared.config.sandbox_limits
            async with await runtime.start(_spec("files", limits), job.scope):
                pass
        job.reward = 1.0


# -- the schedule ----------------------------------------------------------------------------


class Chaos:
    """Drives one seed's schedule against a running server."""

    def __init__(
        self, seed: int, srv: Server, runtime: ChaosRuntime, llms: list[ScriptedLLM]
    ) -> None:
        self.rng = random.Random(seed)
        self.srv = srv
        self.runtime = runtime
        self.llms = llms
        self.killed: set[int] = set()
        self.ids: list[str] = []
        self.timeout: dict[str, float] = {}
        self.actions: collections.Counter[str] = collections.Counter()

    async def submit(self, n: int) -> None:
        jobs: list[dict[str, Any]] = []
        for _ in range(n):
            timeout = round(self.rng.uniform(*TIMEOUTS_S), 2)
            instance = {
                "spec": self.rng.choice(["warm", "warm", "files", "limits"]),
                "eval_sandbox": self.rng.random() < 0.3,
            }
            jobs.append({"task": "chaos", "instance": instance, "timeout_s": timeout})
        ids = await self.srv.client.submit_batch(jobs)
        for job_id, job in zip(ids, jobs, strict=True):
            self.timeout[job_id] = job["timeout_s"]
        self.ids += ids

    async def step(self) -> None:
        rng, client = self.rng, self.srv.client
        what = rng.choice(
            [
                "submit",
                "submit",
                "submit",
                "cancel",
                "workers",
                "kill",
                "revive",
                "faults",
                "sandbox",
                "sandbox",
                "warm_dies",
            ]
        )
        self.actions[what] += 1
        if what == "submit":
            await self.submit(rng.randint(1, 4))
        elif what == "cancel" and self.ids:
            await client.cancel(rng.sample(self.ids, min(len(self.ids), rng.randint(1, 2))))
        elif what == "workers":
            sizes = {"init": rng.randint(1, 4), "run": rng.randint(1, 4), "eval": rng.randint(1, 3)}
            chosen = dict(rng.sample(sorted(sizes.items()), rng.randint(1, 3)))
            await client.set_workers(**chosen)
        elif what == "kill":
            alive = [i for i in range(len(self.llms)) if i not in self.killed]
            if alive:
                i = rng.choice(alive)
                self.killed.add(i)
                await self.llms[i].kill()
        elif what == "revive" and self.killed:
            i = rng.choice(sorted(self.killed))
            self.killed.discard(i)
            await self.llms[i].revive()
        elif what == "faults":
            rng.choice(self.llms).set_faults(
                error_rate=rng.choice([0.0, 0.0, 0.3, 1.0]),
                hang_rate=rng.choice([0.0, 0.0, 0.1]),
                drop_rate=rng.choice([0.0, 0.0, 0.2]),
            )
        elif what == "sandbox":
            self.runtime.fail_rate = rng.choice([0.0, 0.0, 0.3, 1.0])
            self.runtime.hang_rate = rng.choice([0.0, 0.0, 0.2, 0.5]) * (1 - self.runtime.fail_rate)
        elif what == "warm_dies":
            warm = self.runtime.warm
            idle = list(warm._idle) if isinstance(warm, WarmPool) else []
            if idle:
                sb = rng.choice(idle)[0]
                assert isinstance(sb, FakeSandbox)
                sb.dead = True

    async def heal(self) -> None:
        """The chaos stops: every backend back and healthy, sandbox starts work again."""
        for i in sorted(self.killed):
            await self.llms[i].revive()
        self.killed.clear()
        for llm in self.llms:
            llm.set_faults(error_rate=0.0, hang_rate=0.0, drop_rate=0.0)
        self.runtime.fail_rate = self.runtime.hang_rate = 0.0


# -- the test --------------------------------------------------------------------------------


def server_config(rng: random.Random) -> dict[str, Any]:
    return {
        "runtime": "local",  # replaced by ChaosRuntime (get_runtime is patched)
        "store": rng.choice(["memory", "sqlite"]),
        "max_sandboxes": rng.choice([1, 1, 2, 2, 3]),  # the budget at (or near) its floor
        "warm_sandboxes": rng.choice([0, 0, 1, 2, 4]),  # off, within and above the budget
        "init_workers": rng.randint(1, 4),
        "run_workers": rng.randint(1, 6),
        "eval_workers": rng.randint(1, 3),
        "jit_init": rng.random() < 0.7,
        "max_tokens": 32,
        "pool": {
            "failure_threshold": 2,
            "probe_interval_s": 0.1,
            "probe_timeout_s": 0.5,
            "retries": 2,
            "retry_backoff_s": 0.01,
            "request_timeout_s": 2.0,
        },
        "sandbox": {"close_grace_s": 0.2},
    }


async def test_every_job_ends_and_the_server_returns_to_idle(
    make_server: ServerFactory, monkeypatch: pytest.MonkeyPatch, chaos_seed: int
) -> None:
    seed = chaos_seed
    rng = random.Random(seed)
    cfg = server_config(rng)
    where = f"chaos seed {seed} (replay: PRORL_CHAOS_SEED={seed} pytest tests/chaos), {cfg}"
    runtimes: list[ChaosRuntime] = []

    def chaos_runtime(name: str, config: RuntimeConfig | None = None) -> ChaosRuntime:
        assert config is not None
        runtimes.append(ChaosRuntime(config, random.Random(f"{seed}-starts")))
        return runtimes[-1]

    monkeypatch.setattr(shared_module, "get_runtime", chaos_runtime)
    latency = LatencyModel(ttft_s=rng.uniform(0.0, 0.03), per_token_s=0.0005)
    n_llms = rng.choice([1, 2])
    async with (
        ScriptedLLM(policy="finish", seed=seed, latency=latency) as llm_a,
        ScriptedLLM(policy="finish", seed=seed + 1, latency=latency) as llm_b,
        make_server(handlers=(ChaosHandler(),), **cfg) as srv,
    ):
        llms = [llm_a, llm_b][:n_llms]
        for llm in llms:
            await srv.client.add_llm_server(llm.address)
        (runtime,) = runtimes
        chaos = Chaos(seed, srv, runtime, llms)
        # A burst at once: the start-up race with the warm pool still filling.
        await chaos.submit(rng.randint(2, 8))
        loop = asyncio.get_running_loop()
        end = loop.time() + DURATION_S
        while loop.time() < end:
            try:
                await chaos.step()
            except RolloutError as exc:
                pytest.fail(f"{where}: the server refused a chaos request: {exc}")
            # Pacing of the schedule (load generation), not synchronisation: the property
            # below must hold whatever the timing.
            await asyncio.sleep(rng.expovariate(1 / 0.08))
        await chaos.heal()
        summary = (
            f"{len(chaos.ids)} jobs, actions {dict(chaos.actions)}, "
            f"sandbox starts {dict(runtime.outcomes)}"
        )

        # Every job ends within its budget plus a bound (after the chaos has stopped).
        results = await results_within(srv, chaos.ids, max(TIMEOUTS_S) + BOUND_S, where)
        statuses = collections.Counter(r["status"] for r in results.values())
        assert set(statuses) <= TERMINAL, f"{where}: {statuses}"
        for res in results.values():
            error = res["error"]
            if res["status"] == "timed_out":
                assert error["type"] == "TimeoutError", f"{where}: {error}"
            if res["status"] == "failed":
                assert error["type"] in EXPECTED_ERRORS, f"{where}: {res['job_id']}: {error}"
        # /status returns to idle: warm sandboxes (ready or starting) are all that is left.
        warm = runtime.warm if isinstance(runtime.warm, WarmPool) else None

        async def idle() -> bool:
            status = await srv.client.status()
            budget = status["sandbox_budget"]
            warm_ready = 0 if warm is None else warm.ready
            warm_held = 0 if warm is None else warm.ready + warm.starting
            return (
                set(status["queues"].values()) == {0}
                and set(status["active"].values()) == {0}
                and status["jit_waiting"] == 0
                and status["backend_waiting"] == 0
                and budget["waiting"] == 0
                and budget["live"] == warm_held
                and status["sandboxes"] == warm_ready
                and sum(status["jobs"].values()) == len(chaos.ids)
            )

        async def state() -> str:
            return f"{where}: idle after every job ended; status {await srv.client.status()}"

        await eventually(idle, timeout=10, what=state)
        budget = runtime.budget
        assert budget.capacity is not None and budget.peak <= budget.capacity, where
        errors = collections.Counter(
            f"{r['error']['stage']}:{r['error']['type']}" for r in results.values() if r["error"]
        )
        print(f"chaos seed {seed}: {summary}, outcomes {dict(statuses)}, errors {dict(errors)}")  # noqa: T201


async def results_within(
    srv: Server, ids: list[str], bound: float, where: str
) -> dict[str, dict[str, Any]]:
    """Every job's result document, or fail naming the jobs still unfinished."""
    results: dict[str, dict[str, Any]] = {}
    pending = list(ids)
    try:
        async with asyncio.timeout(bound):
            while pending:
                out = await srv.client.poll(pending, wait=5)
                for res in out["done"]:
                    results[res["job_id"]] = res
                assert not out["unknown"], f"{where}: jobs forgotten: {out['unknown']}"
                pending = out["pending"]
    except TimeoutError:
        store = srv.service.store
        stuck = {i: _where_is(store.get(i)) for i in pending[:10]}
        status = await srv.client.status()
        pytest.fail(f"{where}: {len(pending)} jobs not ended within {bound:g}s: {stuck}; {status}")
    return results


def _where_is(job: Job | None) -> str:
    if job is None:
        return "unknown"
    stage = job.queue_stage.value if job.queue_stage is not None else None
    return f"status {job.status}, queued for {stage}, timer running {job.timer.running}"
