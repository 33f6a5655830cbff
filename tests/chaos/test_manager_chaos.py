"""Seeded chaos over the trainer side: ``RolloutManager`` against real servers ("Nothing may hang").

Per seed: two or three REAL rollout servers, each its own process on its own state dir
(SQLite, so a restart brings its jobs back; now and then the memory store, which forgets
them), each behind a TEST DOUBLE network proxy; three scripted vLLM-protocol engines; a
``RolloutManager`` with a small ``group_size`` and ``batch_groups`` over ``planted``
prompts (a finite list that runs out, or endless). The servers, proxies and engines are
run by a process of their own (``tests/chaos/sidecar.py``), so the test's process carries
only the manager, the trainer loop and the schedule. While a trainer loop takes batches and calls
``set_weights(version=, backends=[...])`` (the swap form) at the seed's cadence (every
batch, every other one, at random with jumps and double updates, late, or never), the
schedule SIGKILLs servers (down until restarted), restarts them on the same state dir
(also crash-restarts), SIGSTOPs them for up to 5 s, makes their proxies answer 503 or cut
connections after the server answered, makes engines answer 503, cut or hang, and kills
and revives engines. Then the chaos stops (everything back up, faults off) and the
trainer takes ``RECOVERY_BATCHES`` more batches with no weight change.

Properties, on every run:

- every ``next_batch()`` returns, or raises an error docs/trainer.md "Errors" lists for
  it, within ``stall_timeout_s + MARGIN_S`` of the last result or of the call, as
  documented (``RolloutStalled`` only while the chaos lasts; ``PromptsExhausted`` only
  once the prompts ran out and nothing runs), and within ``NO_BATCH_S`` in any case;
- no prompt is returned twice, every group is the ``group_size`` samples of its prompt
  (right prompt, sample order, planted reward, no infrastructure failure inside), and
  nothing is lost: every prompt taken is returned, filtered (seen by the filter),
  failed or cancelled (counted), or still held (running, ready, to regenerate);
- no returned group lags the version current when it is returned by more than
  ``max_version_lag``;
- no beat of the manager's own heartbeat (``LoopLag``, behind ``metrics()["loop_lag_ms"]``)
  is more than 100 ms late for reasons of this process: its lateness net of the time
  the loop's thread waited, runnable, for a CPU meanwhile, on the run queue or stolen by
  the hypervisor (``BeatAccount``; on this shared 2-core VM those waits alone exceed
  100 ms now and then); ``loop_lag_ms`` itself is reported;
  a watchdog thread fails the test if the loop stops altogether;
- after ``aclose()`` no job is left unfinished on any server (all are live by then, and
  only this manager submits to them), and no server process outlives the test.

Knobs: ``PRORL_CHAOS_SEED=N[,M]`` or ``--chaos-seed N`` replays seeds,
``PRORL_CHAOS_SEEDS=K`` runs seeds 0..K-1 (default: ``CI_SEEDS`` below),
``PRORL_CHAOS_DURATION_S`` is the length of the chaos phase (default 8 s here). The setup
and the schedule are fixed by the seed; which request meets which fault also depends on
timing, so a replay re-runs the same schedule, not the same interleaving.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import json
import os
import random
import re
import sys
import time
from collections.abc import Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from handlers.planted import PlantedInstance, planted_reward
from prorl_async.client import RolloutClient
from prorl_async.trainer import (
    Group,
    PromptsExhausted,
    RolloutManager,
    RolloutStalled,
    TrainerError,
    nonzero_std,
)
from prorl_async.trainer.loop import LoopLag
from prorl_async.trainer.retry import classify_result
from prorl_async.trainer.watchdog import stall_report
from tests.proctree import descendants
from tests.trainer.checks import check_accounting
from tests.trainer.loopwatch import loop_watch

# This module's default set (tests/chaos/conftest.py reads it), each cadence once: 2 never
# (on_batch_full="cancel", hangs ended by the server's timeout), 3 late (no staleness
# bound, finite prompts run out, memory store), 7 every (max_version_lag=0, 3 servers),
# 10 every other batch, 14 random with jumps and double updates (hangs ended by the
# sample deadline). Seeds 1, 2, 3, 8 and 14 found the bugs fixed with this test.
CI_SEEDS = (2, 3, 7, 10, 14)
DURATION_S = float(os.environ.get("PRORL_CHAOS_DURATION_S", "8"))
STALL_TIMEOUT_S = 20.0
# next_batch() ends within stall_timeout_s of the last result or of the call; the margin
# is for the calls it makes after that (cancel mode cancels the unfinished groups) and
# for WATCH_S, how often the test looks.
MARGIN_S = 5.0
WATCH_S = 0.5
# Results that keep coming without ever filling a batch (no stall is ever declared).
NO_BATCH_S = 90.0
LOOP_LAG_MS = 100.0  # a heartbeat's delay this process caused (see BeatAccount)
RECOVERY_BATCHES = 2
# set_weights() has no bound of its own but the client's timeout (30 s of slack).
SET_WEIGHTS_BOUND_S = 30.0 + MARGIN_S
STOP_S = (0.2, 5.0)  # how long a SIGSTOP lasts
N_ENGINES = 3
MAX_ATTEMPT = 30  # attempts of one sample looked for on the servers after aclose()
POOL_TOML = """\
[pool]
failure_threshold = 2
probe_interval_s = 0.1
probe_timeout_s = 0.5
retries = 2
retry_backoff_s = 0.01
request_timeout_s = 2.0
"""


# -- the seed's setup --------------------------------------------------------------------------


@dataclass(frozen=True)
class Setup:
    servers: int
    run_workers: tuple[int, ...]
    stores: tuple[str, ...]
    on_restart: tuple[str, ...]
    group_size: int
    batch_groups: int
    max_inflight_groups: int | None
    group_filter: str | None
    on_batch_full: str
    max_version_lag: int | None
    max_infra_retries: int
    sample_deadline_s: float | None
    prompts: int | None  # None: endless
    cadence: str
    init_fail_rate: float
    hang_rate: float
    run_s: float
    ttft_s: float

    @classmethod
    def draw(cls, rng: random.Random) -> Setup:
        n = rng.choice([2, 3, 3])
        deadline = rng.choice([None, 6.0, 10.0])
        return cls(
            servers=n,
            run_workers=tuple(rng.randint(2, 6) for _ in range(n)),
            stores=tuple(rng.choice(["sqlite", "sqlite", "sqlite", "memory"]) for _ in range(n)),
            on_restart=tuple(rng.choice(["requeue", "requeue", "fail"]) for _ in range(n)),
            group_size=rng.randint(2, 4),
            batch_groups=rng.randint(2, 4),
            max_inflight_groups=rng.choice([None, None, 3, 6]),
            group_filter=rng.choice(["nonzero_std", "nonzero_std", None]),
            on_batch_full=rng.choice(["carry", "carry", "cancel"]),
            max_version_lag=rng.choice([0, 1, 1, 2, None]),
            max_infra_retries=rng.randint(1, 4),
            sample_deadline_s=deadline,
            prompts=rng.choice([None, None, rng.randint(15, 120)]),
            cadence=rng.choice(["every", "every2", "random", "late", "never"]),
            init_fail_rate=rng.choice([0.0, 0.05, 0.2]),
            # hanging samples end by the sample deadline, or by the job's own timeout
            hang_rate=rng.choice([0.0, 0.03]),
            run_s=rng.choice([0.01, 0.03, 0.08]),
            ttft_s=rng.uniform(0.0, 0.02),
        )


def prompt(rng: random.Random, i: int, setup: Setup) -> dict[str, Any]:
    """A planted job; about half of them ``random`` (the only kind ``nonzero_std`` keeps)."""
    outcome = rng.choice(["random", "random", "right", "wrong"])
    job: dict[str, Any] = {
        "task": "planted",
        "instance": {
            "outcome": outcome,
            "seed": i,
            "run_s": setup.run_s,
            "sigma": 1.0,
            "init_fail_rate": setup.init_fail_rate,
            "hang": rng.random() < setup.hang_rate,
        },
    }
    if job["instance"]["hang"] and (setup.sample_deadline_s is None or rng.random() < 0.5):
        job["timeout_s"] = 2.0  # ends timed_out on the server: a task failure, returned
    return job


# -- the test doubles, in a process of their own ------------------------------------------------


class SidecarProc:
    """The servers, proxies and engines (``tests/chaos/sidecar.py``), in a process of
    their own. Owned by the test's exit stack: :meth:`aclose` ends it, and it ends every
    server process it started."""

    def __init__(self) -> None:
        self._proc: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        root = str(Path(__file__).resolve().parents[2])
        path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": path}
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.chaos.sidecar",
            env=env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )

    async def call(self, op: str, **args: Any) -> Any:
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        async with self._lock:
            proc.stdin.write((json.dumps({"op": op, **args}) + "\n").encode())
            await proc.stdin.drain()
            async with asyncio.timeout(60):
                line = await proc.stdout.readline()
        assert line, f"the sidecar exited (status {proc.returncode})"
        answer = json.loads(line)
        assert "error" not in answer, f"sidecar: {answer['error']}"
        return answer["ok"]

    async def aclose(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.returncode is None and proc.stdin is not None:
            proc.stdin.close()  # end of input: it closes everything and exits
            try:
                async with asyncio.timeout(10):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


# -- the rig ---------------------------------------------------------------------------------


@dataclass
class Server:
    """What the test knows of one rollout server (a process of the sidecar's)."""

    name: str
    url: str = ""  # its own, for the test's direct questions; the manager uses its proxy's
    up: bool = False
    stopped: bool = False
    starts: int = 0


class Rig:
    """Servers behind proxies, engines, and who registers the engines on a (re)started
    server: the deployment (the test) until the trainer's first ``set_weights``, then the
    manager (it gives the weights to a server back from quarantine, or found with none)."""

    def __init__(self, sidecar: SidecarProc, urls: list[str], engines: list[str]) -> None:
        self.sidecar = sidecar
        self.servers = [Server(f"server{i}") for i in range(len(urls))]
        self.urls = urls  # the proxies', which the manager uses
        self.engines = engines
        self.engine_up = [True] * len(engines)
        self.synced = False  # the trainer has set weights at least once

    def alive_engines(self) -> list[str]:
        return [e for e, up in zip(self.engines, self.engine_up, strict=True) if up]

    async def start(self, i: int) -> None:
        server = self.servers[i]
        server.url = await self.sidecar.call("start", i=i)
        server.up, server.stopped, server.starts = True, False, server.starts + 1
        if not self.synced:
            await self.deploy_backends(server.url)

    async def kill(self, i: int) -> None:
        await self.sidecar.call("kill", i=i)
        self.servers[i].up = self.servers[i].stopped = False

    async def stop(self, i: int) -> None:
        await self.sidecar.call("stop", i=i)
        self.servers[i].stopped = True

    async def cont(self, i: int) -> None:
        if self.servers[i].stopped:
            await self.sidecar.call("cont", i=i)
            self.servers[i].stopped = False

    async def deploy_backends(self, url: str) -> None:
        """The deployment registers the live engines at version 0 (direct, no proxy)."""
        async with RolloutClient(url) as client:
            for address in self.alive_engines():
                await client.add_llm_server(address, weight_version=0)


# -- the chaos schedule ------------------------------------------------------------------------


class Chaos:
    """Injects one seed's schedule of faults until stopped; :meth:`heal` undoes them all."""

    ACTIONS = [
        *["kill", "restart", "restart", "stop", "stop", "net", "net"],
        *["engine_faults", "engine_faults", "engine_kill", "engine_revive"],
    ]

    def __init__(self, rng: random.Random, rig: Rig) -> None:
        self.rng = rng
        self.rig = rig
        self.actions: collections.Counter[str] = collections.Counter()
        self._resumes: set[asyncio.Task[None]] = set()

    async def run(self, duration_s: float) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + duration_s
        while loop.time() < end:
            # the schedule's pacing, not synchronisation: the properties hold for any timing
            await asyncio.sleep(self.rng.expovariate(1 / 0.4))
            await self.step()

    async def step(self) -> None:
        rng, rig = self.rng, self.rig
        what = rng.choice(self.ACTIONS)
        running = [i for i, s in enumerate(rig.servers) if s.up and not s.stopped]
        if what == "kill" and len(running) >= 2:
            await rig.kill(rng.choice(running))
        elif what == "restart":
            i = rng.randrange(len(rig.servers))
            await rig.kill(i)  # a crash, if it was up
            await rig.start(i)
        elif what == "stop" and len(running) >= 2:
            i = rng.choice(running)
            await rig.stop(i)
            task = asyncio.create_task(self._resume(i, rng.uniform(*STOP_S)))
            self._resumes.add(task)
            task.add_done_callback(self._resumes.discard)
        elif what == "net":
            i = rng.randrange(len(rig.servers))
            await rig.sidecar.call(
                "proxy",
                i=i,
                error_rate=rng.choice([0.0, 0.0, 0.1, 0.3]),
                drop_rate=rng.choice([0.0, 0.0, 0.1, 0.2]),
            )
        elif what == "engine_faults":
            i = rng.randrange(len(rig.engines))
            await rig.sidecar.call(
                "engine_faults",
                i=i,
                error_rate=rng.choice([0.0, 0.0, 0.3, 1.0]),
                drop_rate=rng.choice([0.0, 0.0, 0.2]),
                hang_rate=rng.choice([0.0, 0.0, 0.1]),
            )
        elif what == "engine_kill" and sum(rig.engine_up) >= 2:
            i = rng.choice([i for i, up in enumerate(rig.engine_up) if up])
            rig.engine_up[i] = False
            await rig.sidecar.call("engine_kill", i=i)
        elif what == "engine_revive" and not all(rig.engine_up):
            i = rng.choice([i for i, up in enumerate(rig.engine_up) if not up])
            await rig.sidecar.call("engine_revive", i=i)
            rig.engine_up[i] = True
        else:
            return
        self.actions[what] += 1

    async def _resume(self, i: int, after_s: float) -> None:
        await asyncio.sleep(after_s)  # how long the SIGSTOP lasts: part of the schedule
        await self.rig.cont(i)

    async def heal(self) -> None:
        """The chaos stops: every server and engine up, no fault left."""
        rig = self.rig
        for task in list(self._resumes):
            task.cancel()
        await asyncio.gather(*self._resumes, return_exceptions=True)
        for i, server in enumerate(rig.servers):
            await rig.cont(i)
            if not server.up:
                await rig.start(i)
        for i in range(len(rig.engines)):
            if not rig.engine_up[i]:
                await rig.sidecar.call("engine_revive", i=i)
                rig.engine_up[i] = True
            await rig.sidecar.call(
                "engine_faults", i=i, error_rate=0.0, drop_rate=0.0, hang_rate=0.0
            )
        for i in range(len(rig.servers)):
            await rig.sidecar.call("proxy", i=i, error_rate=0.0, drop_rate=0.0)


# -- the trainer and what it checks ---------------------------------------------------------


class Ledger:
    """Every prompt the manager took and what became of it, as the trainer sees it."""

    def __init__(self, setup: Setup, rng: random.Random) -> None:
        self.setup = setup
        self._rng = rng
        self.taken: list[dict[str, Any]] = []
        self.ran_out = False
        self.returned: dict[str, Group] = {}
        self.job_ids: set[str] = set()
        self.filtered: set[str] = set()
        base = nonzero_std if setup.group_filter == "nonzero_std" else None
        self._base = base

    def prompts(self) -> Iterator[dict[str, Any]]:
        i = 0
        while self.setup.prompts is None or i < self.setup.prompts:
            job = prompt(self._rng, i, self.setup)
            self.taken.append(job)
            yield job
            i += 1
        self.ran_out = True

    def group_filter(self, group: Group) -> bool:
        """The seed's filter, recording what it drops (a dropped prompt is final)."""
        keep = self._base is None or self._base(group)
        if not keep:
            assert group.prompt_uid not in self.filtered, group.prompt_uid
            self.filtered.add(group.prompt_uid)
        return keep

    def check_batch(self, batch: list[Group], run: str, current: int | None, where: str) -> None:
        setup = self.setup
        assert len(batch) == setup.batch_groups, f"{where}: a batch of {len(batch)}"
        for group in batch:
            uid = group.prompt_uid
            assert uid not in self.returned, f"{where}: {uid} returned twice"
            assert uid not in self.filtered, f"{where}: {uid} returned after it was filtered"
            self.returned[uid] = group
            index = int(uid[1:])
            assert group.job is self.taken[index], f"{where}: {uid} is not prompt {index}"
            assert len(group.results) == setup.group_size, f"{where}: {uid} {group.results}"
            inst = msgspec.convert(group.job["instance"], PlantedInstance)
            for k, result in enumerate(group.results):
                mine = result["metadata"]["prorl_trainer"]
                key = f"{uid}-{k}"
                got = (mine["run"], mine["prompt_uid"], mine["sample"], mine["sample_key"])
                assert got == (run, uid, k, key), f"{where}: {uid} sample {k}: {mine}"
                assert result["job_id"] == f"{run}-{uid}-{k}-{mine['attempt']}", where
                assert result["job_id"] not in self.job_ids, f"{where}: {key} returned twice"
                self.job_ids.add(result["job_id"])
                assert classify_result(result) != "infra", f"{where}: {key}: {result['error']}"
                if result["status"] == "done":
                    assert result["reward"] == planted_reward(inst, key), f"{where}: {key}"
            if self._base is not None:
                assert self._base(group), f"{where}: {uid} passed the filter: {group.rewards}"
            lag_bound = setup.max_version_lag
            if (
                lag_bound is not None
                and current is not None
                and group.min_weight_version is not None
            ):
                lag = current - group.min_weight_version
                assert lag <= lag_bound, f"{where}: {uid} lags {lag} > {lag_bound} versions"

    def check_final(self, m: RolloutManager, where: str) -> dict[str, Any]:
        """Nothing lost: every prompt taken is returned, dropped as counted, or still held."""
        metrics = m.metrics()
        check_accounting(metrics)
        g = metrics["groups"]
        assert metrics["prompts_taken"] == len(self.taken), f"{where}: {metrics}"
        assert g["returned"] == len(self.returned), f"{where}: {metrics}"
        assert g["filtered"] == len(self.filtered), f"{where}: {metrics}"
        dispatcher = m._dispatcher
        assert dispatcher is not None
        running = set(dispatcher.reg.groups)
        ready = [grp.prompt_uid for grp in dispatcher.ready]
        regen = [state.uid for state in dispatcher.resubmit]
        held = running | set(ready) | set(regen)
        assert len(held) == len(running) + len(ready) + len(regen), f"{where}: held twice"
        final = set(self.returned) | self.filtered
        assert not held & final, f"{where}: held and final: {sorted(held & final)}"
        assert not set(self.returned) & self.filtered, where
        dropped = len(self.taken) - len(final) - len(held)
        assert dropped == g["failed"] + g["cancelled"], f"{where}: {dropped} unaccounted, {g}"
        assert sum(g["failed_by"].values()) == g["failed"], f"{where}: {g}"
        return metrics


class Trainer:
    """Takes batches and sets weights at the seed's cadence, checking every answer."""

    def __init__(
        self, m: RolloutManager, rig: Rig, ledger: Ledger, rng: random.Random, where: str
    ) -> None:
        self.m, self.rig, self.ledger, self.rng, self.where = m, rig, ledger, rng, where
        self.setup = ledger.setup
        self.batches = 0
        self.version = 0
        self.current: int | None = None  # the version the manager holds
        self.unsynced: int | None = None  # a version whose set_weights failed
        self.late_at = rng.randint(2, 4)
        self.exhausted = False
        self.errors: collections.Counter[str] = collections.Counter()
        self.waits: list[float] = []

    async def start(self) -> None:
        if self.setup.cadence in ("every", "every2", "random"):
            await self.set_weights(0)

    async def step(self, phase: str) -> bool:
        """One ``next_batch()`` (and, in the chaos phase, a boundary); False once exhausted."""
        loop = asyncio.get_running_loop()
        where = f"{self.where}, {phase} phase, batch {self.batches + 1}"
        start = loop.time()
        try:
            batch = await self.next_batch(where)
        except PromptsExhausted:
            self.check_exhausted(where)
            return False
        except RolloutStalled:
            self.waits.append(loop.time() - start)
            if phase != "chaos":
                pytest.fail(f"{where}: stalled after the chaos stopped: {await self.diagnosis()}")
            self.errors["stalled"] += 1
            if self.unsynced is not None:  # perhaps why: a server left with no engine
                await self.set_weights(self.unsynced)
            return True
        except TrainerError as exc:
            pytest.fail(f"{where}: next_batch() raised an error it does not document: {exc!r}")
        self.waits.append(loop.time() - start)
        self.batches += 1
        current = self.m.metrics()["current_version"]
        assert current == self.current, f"{where}: the manager holds {current}, not {self.current}"
        self.ledger.check_batch(batch, self.m.run_id, current, where)
        if phase == "chaos":
            await self.boundary()
            await asyncio.sleep(self.rng.uniform(0.0, 0.2))  # the training step
        return True

    async def next_batch(self, where: str) -> list[Group]:
        """``next_batch()``, failing the test past its documented bound: it ends within
        ``stall_timeout_s`` of the last result or of the call (plus ``MARGIN_S``)."""
        dispatcher = self.m._dispatcher
        assert dispatcher is not None
        call = asyncio.ensure_future(self.m.next_batch())
        start = time.monotonic()
        try:
            while not call.done():
                await asyncio.wait({call}, timeout=WATCH_S)
                now = time.monotonic()
                quiet = now - max(start, dispatcher.last_result)
                if not call.done() and quiet > STALL_TIMEOUT_S + MARGIN_S:
                    pytest.fail(
                        f"{where}: next_batch() did not end {quiet:.1f} s after the last result "
                        f"(stall_timeout_s {STALL_TIMEOUT_S:g}): {await self.diagnosis()}"
                    )
                if not call.done() and now - start > NO_BATCH_S:
                    pytest.fail(
                        f"{where}: results but no batch for {NO_BATCH_S:g} s: "
                        f"{await self.diagnosis()}"
                    )
        finally:
            if not call.done():
                call.cancel()
                await asyncio.wait({call})
        return call.result()

    async def diagnosis(self) -> str:
        """What the manager holds and waits for; where each server and engine is; what
        the servers say of the oldest samples (asked directly, not through the proxies)."""
        dispatcher = self.m._dispatcher
        assert dispatcher is not None
        report = stall_report(dispatcher, STALL_TIMEOUT_S, {})
        rig = self.rig
        direct = dict(zip(rig.urls, rig.servers, strict=True))
        seen: dict[str, Any] = {}
        for sample in report["samples"][:5]:
            server = direct.get(sample["server"] or "")
            if server is None or not server.up or server.stopped:
                continue
            async with RolloutClient(server.url) as client:
                out = await client.poll([sample["job_id"]])
                status = await client.status()
            seen[sample["job_id"]] = {
                "done": [(r["status"], r["error"]) for r in out["done"]],
                "pending": out["pending"],
                "unknown": out["unknown"],
                "server": {k: status[k] for k in ("queues", "active", "backend_waiting")},
                "backends": [
                    (b["address"], b["healthy"], b["weight_version"]) for b in status["backends"]
                ],
            }
        servers = [(s.name, s.up, s.stopped, s.starts) for s in rig.servers]
        return (
            f"{report['message']}; last result {time.monotonic() - dispatcher.last_result:.1f} s "
            f"ago; {report['servers']}; oldest {report['samples'][:5]}; on their servers "
            f"{seen}; metrics {self.m.metrics()}; servers (name, up, stopped, starts) "
            f"{servers}; engines up {rig.engine_up}"
        )

    def check_exhausted(self, where: str) -> None:
        metrics = self.m.metrics()
        assert self.ledger.ran_out, f"{where}: PromptsExhausted with prompts left"
        assert metrics["inflight_groups"] == metrics["resubmit_groups"] == 0, f"{where}: {metrics}"
        assert metrics["ready_groups"] < self.setup.batch_groups, f"{where}: {metrics}"
        self.exhausted = True

    async def boundary(self) -> None:
        """The seed's ``set_weights`` cadence, after a batch."""
        cadence, rng = self.setup.cadence, self.rng
        if self.unsynced is not None:
            await self.set_weights(self.unsynced)  # retry what failed (a trainer must)
        elif cadence == "every":
            await self.set_weights(self.version + 1)
        elif cadence == "every2" and self.batches % 2 == 0:
            await self.set_weights(self.version + 1)
        elif cadence == "late" and self.batches >= self.late_at:
            await self.set_weights(max(self.version + 1, self.batches))
        elif cadence == "random" and rng.random() < 0.5:
            await self.set_weights(self.version + rng.choice([0, 1, 1, 2]))
            if rng.random() < 0.2:  # two updates between batches: more regeneration
                await self.set_weights(self.version + 1)

    async def set_weights(self, version: int) -> None:
        # The trainer swaps to engines it has running (a dead one may refuse the swap).
        alive = self.rig.alive_engines()
        backends = self.rng.sample(alive, self.rng.randint(1, len(alive)))
        try:
            await asyncio.wait_for(
                self.m.set_weights(version=version, backends=backends), SET_WEIGHTS_BOUND_S
            )
        except TimeoutError:
            pytest.fail(f"{self.where}: set_weights() did not end in {SET_WEIGHTS_BOUND_S:g} s")
        except TrainerError as exc:
            # documented: a server refused /add_llm_server (an engine died meanwhile)
            assert "set_weights failed" in str(exc), f"{self.where}: {exc!r}"
            self.errors["set_weights"] += 1
            self.unsynced = version
            return
        self.version = self.current = version
        self.unsynced = None
        self.rig.synced = True

    async def resync(self) -> None:
        """After the chaos: a swap that failed is done again, now that every engine is up."""
        if self.unsynced is not None:
            await self.set_weights(self.unsynced)
            assert self.unsynced is None, f"{self.where}: set_weights failed after the chaos"


# -- what the loop lag is made of --------------------------------------------------------------


class BeatAccount:
    """The manager's own heartbeat (``LoopLag``), beat by beat, net of waits for a CPU.

    ``LoopLag`` measures how late its 100 ms heartbeat wakes: wall-clock time. On this
    shared 2-core VM a runnable thread can wait well over 100 ms for a CPU: on the run
    queue (another process, a vLLM engine, holds both), or with its virtual CPU taken by
    the hypervisor (steal). Neither says anything about the loop. So at every beat of
    the manager's heartbeat this reads how long the loop's thread waited on the run queue
    since the previous beat (Linux schedstat) and the most any CPU was stolen meanwhile
    (/proc/stat): lateness minus both is what this process caused (a step holding the
    loop, a GC pause). It keeps the latest beat of all with what explains it, the worst
    beat net of both with its CPU time, and the longest GC pause. (The test doubles run
    in another process, so they hold no GIL here.)
    """

    def __init__(self) -> None:
        self.beats = 0
        self.late_ms = self.late_queued_ms = self.late_stolen_ms = 0.0
        self.held_ms = self.held_cpu_ms = 0.0
        self.gc_ms = 0.0
        self._gc_start = 0.0
        self._mark: tuple[float, float, list[float]] | None = None

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        record = LoopLag.record

        def counted(lag: LoopLag, late_s: float) -> None:
            self.beat(late_s)
            record(lag, late_s)

        monkeypatch.setattr(LoopLag, "record", counted)
        gc.callbacks.append(self._gc)

    def uninstall(self) -> None:
        gc.callbacks.remove(self._gc)

    def _gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_start = time.monotonic()
        else:
            self.gc_ms = max(self.gc_ms, (time.monotonic() - self._gc_start) * 1000)

    def beat(self, late_s: float) -> None:
        mark = time.thread_time(), _runqueue_s(), _steal_s()
        if self._mark is not None:
            self.beats += 1
            late_ms = max(late_s, 0.0) * 1000
            queued_ms = (mark[1] - self._mark[1]) * 1000
            stolen = [now - then for now, then in zip(mark[2], self._mark[2], strict=True)]
            stolen_ms = max(stolen, default=0.0) * 1000
            if late_ms > self.late_ms:
                self.late_ms, self.late_queued_ms, self.late_stolen_ms = (
                    late_ms,
                    queued_ms,
                    stolen_ms,
                )
            held_ms = max(late_ms - queued_ms - stolen_ms, 0.0)
            if held_ms > self.held_ms:
                self.held_ms, self.held_cpu_ms = held_ms, (mark[0] - self._mark[0]) * 1000
        self._mark = mark

    def __str__(self) -> str:
        return (
            f"{self.beats} beats, the latest of all {self.late_ms:.0f} ms late with "
            f"{self.late_queued_ms:.0f} ms on the run queue and {self.late_stolen_ms:.0f} ms "
            f"stolen meanwhile; net of those at most {self.held_ms:.0f} ms "
            f"({self.held_cpu_ms:.0f} ms on the loop's CPU); longest GC {self.gc_ms:.0f} ms"
        )


def _runqueue_s() -> float:
    """Seconds this thread has waited, runnable, for a CPU (Linux schedstat; 0 without)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


_TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def _steal_s() -> list[float]:
    """Seconds the hypervisor took from each CPU (``steal`` of /proc/stat; [] without)."""
    try:
        with open("/proc/stat") as f:
            lines = [line.split() for line in f if re.match(r"cpu\d", line)]
        return [int(fields[8]) * _TICK_S for fields in lines]
    except (OSError, IndexError, ValueError):
        return []


# -- the test --------------------------------------------------------------------------------


def _server_args(setup: Setup, i: int, config: Path) -> list[str]:
    """``serve`` arguments of server ``i`` (the state dir is given apart)."""
    return [
        "--config",
        str(config),
        "--run-workers",
        str(setup.run_workers[i]),
        "--store",
        setup.stores[i],
        "--on-restart",
        setup.on_restart[i],
    ]


async def unfinished_jobs(url: str, ids: list[str]) -> dict[str, Any]:
    """What a server still has queued or running: the counts (only the manager submits
    to it), and which of ``ids`` (every id the manager may have used) are not finished."""
    async with RolloutClient(url) as client:
        status = await client.status()
        pending = [
            job_id
            for at in range(0, len(ids), 1000)
            for job_id in (await client.poll(ids[at : at + 1000]))["pending"]
        ]
    left = {f"queued {k}": v for k, v in status["queues"].items() if v}
    left.update({f"active {k}": v for k, v in status["active"].items() if v})
    if status["backend_waiting"]:
        left["backend_waiting"] = status["backend_waiting"]
    if pending:
        left["ids"] = pending
    return left


@pytest.mark.timeout(DURATION_S + 150)
async def test_every_batch_ends_nothing_is_lost_and_nothing_is_left(
    tmp_path: Path, chaos_seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed = chaos_seed
    rng = random.Random(seed)
    setup = Setup.draw(rng)
    where = (
        f"manager chaos seed {seed} (replay: PRORL_CHAOS_SEED={seed} pytest "
        f"tests/chaos/test_manager_chaos.py), {setup}"
    )
    config = tmp_path / "server.toml"
    config.write_text(POOL_TOML)
    specs = [
        [str(tmp_path / f"server{i}" / "state"), _server_args(setup, i, config)]
        for i in range(setup.servers)
    ]
    ledger = Ledger(setup, random.Random(f"{seed}-prompts"))
    sidecar = SidecarProc()
    pids: list[int] = []
    async with AsyncExitStack() as stack:
        # the sidecar ends every server process it started when it ends, whatever happens
        stack.push_async_callback(sidecar.aclose)
        await sidecar.start()
        engines = await sidecar.call("engines", n=N_ENGINES, seed=seed * 10, ttft_s=setup.ttft_s)
        rig = Rig(sidecar, await sidecar.call("servers", specs=specs, seed=seed), engines)
        await asyncio.gather(*(rig.start(i) for i in range(setup.servers)))
        chaos = Chaos(random.Random(f"{seed}-chaos"), rig)
        beat = await stack.enter_async_context(loop_watch(stuck_s=20.0))
        beats = BeatAccount()
        beats.install(monkeypatch)
        stack.callback(beats.uninstall)
        m = await stack.enter_async_context(
            RolloutManager(
                servers=rig.urls,
                prompts=ledger.prompts(),
                group_size=setup.group_size,
                batch_groups=setup.batch_groups,
                max_inflight_groups=setup.max_inflight_groups,
                group_filter=ledger.group_filter,
                on_batch_full=setup.on_batch_full,  # type: ignore[arg-type]
                max_version_lag=setup.max_version_lag,
                max_infra_retries=setup.max_infra_retries,
                sample_deadline_s=setup.sample_deadline_s,
                stall_timeout_s=STALL_TIMEOUT_S,
                run_id=f"chaos{seed}",
                progress=False,
            )
        )
        trainer = Trainer(m, rig, ledger, random.Random(f"{seed}-trainer"), where)
        await trainer.start()
        schedule = asyncio.create_task(chaos.run(DURATION_S))
        try:
            while not schedule.done() and await trainer.step("chaos"):
                pass
        finally:
            if not schedule.done():
                schedule.cancel()
            await asyncio.wait({schedule})
        if not schedule.cancelled():
            schedule.result()  # a bug of the schedule itself fails the test here
        await chaos.heal()
        await trainer.resync()
        for _ in range(RECOVERY_BATCHES):
            if trainer.exhausted or not await trainer.step("recovery"):
                break
        metrics = ledger.check_final(m, where)
        lag = metrics["loop_lag_ms"]
        assert beats.beats > 0, where
        assert beats.held_ms <= LOOP_LAG_MS, f"{where}: the loop was held: {beats}; {lag}"
        assert beat.ticks > 0
        await m.aclose()
        # Every server is up again; the manager cancelled what it had not finished.
        ids = [
            f"{m.run_id}-p{i}-{k}-{attempt}"
            for i in range(len(ledger.taken))
            for k in range(setup.group_size)
            for attempt in range(MAX_ATTEMPT)
        ]
        left = {s.name: await unfinished_jobs(s.url, ids) for s in rig.servers}
        assert not any(left.values()), f"{where}: jobs left after aclose(): {left}"
        net = await sidecar.call("injected")
        injected = {f"net{i}": counts for i, counts in enumerate(net) if counts}
        summary = (
            f"manager chaos seed {seed}: {trainer.batches} batches, errors "
            f"{dict(trainer.errors)}, longest wait {max(trainer.waits, default=0):.1f} s, "
            f"loop lag {lag} ms ({beats}), actions {dict(chaos.actions)}, starts "
            f"{[s.starts for s in rig.servers]}, injected {injected}, groups "
            f"{metrics['groups']}, retries {metrics['retries']}, versions {metrics['version_lag']}"
        )
        pids = await sidecar.call("pids")
    assert pids and not set(pids) & descendants(), f"{where}: server processes outlived it"
    print(summary)  # noqa: T201
