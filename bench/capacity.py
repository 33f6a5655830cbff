"""Stage capacity: static pool configurations against ``--autoscale`` on two workloads.

One run, side by side, on in-process servers with a memory-derived sandbox budget
(physical memory / 1 GiB per sandbox), with two kinds of job:

- math-like jobs: INIT 0.1 s, RUN 1.0 s LLM-bound, EVAL 0.02 s;
- swe-like jobs: INIT 0.3 s, RUN 1.5 s LLM-bound, EVAL 3.0 s in a fresh sandbox.

Workloads (all jobs submitted at once, in order):

- ``mixed``: half math-like, half swe-like, shuffled;
- ``shift``: the mix changes partway through, as when a curriculum or a dataset mix
  changes: a first half 90% math-like, then a second half 90% swe-like.

The LLM backends decode at most 16 requests at once. Sandboxes are the ``budgeted``
TEST DOUBLE (tests/capacity/budgeted.py): each takes a real slot of the server's
sandbox budget from INIT to the end of RUN (and a fresh one in a swe EVAL) without
starting a process, so eight servers per workload fit in a few minutes on two shared cores.
Static configurations run as the server did before just-in-time INIT (``jit_init`` off);
``--autoscale`` starts from the defaults with it on.

Printed per configuration: completed jobs/s, p50/p99 job latency (submit to result),
idle sandbox-seconds (alive, waiting in a queue), and the ratios the issue targets.
A second part starts real bwrap sandboxes for math jobs (scripted LLM test double) and
prints INIT p50 with and without warm sandboxes. A third compares just-in-time INIT with
eager INIT on real bwrap sandboxes behind one slow backend that decodes two requests at a
time: the peak of live sandboxes and RUN's idle sandbox-seconds (these timings used to be
asserted in tests/capacity/test_jit.py, which now checks the gate's decisions only).

    python bench/capacity.py [--jobs 128] [--workload mixed|shift|both] [--skip-warm]
                             [--skip-jit] [--jit-only]
"""

from __future__ import annotations

import argparse
import logging
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prorl_async.api.app import run_server  # noqa: E402
from prorl_async.capacity import default_max_sandboxes  # noqa: E402
from prorl_async.client import RolloutClient  # noqa: E402
from prorl_async.config import load_config  # noqa: E402
from prorl_async.core.handler import HandlerRegistry  # noqa: E402
from prorl_async.sandbox import SandboxLimits  # noqa: E402
from tests.capacity.budgeted import BudgetedHandler  # noqa: E402

GiB = 1 << 30
LLM_SLOTS = 16
MATH = {"init_s": 0.1, "run_s": 1.0, "eval_s": 0.02}
SWE = {"init_s": 0.3, "run_s": 1.5, "eval_s": 3.0, "eval_sandbox": True}
# What an operator would pick: the defaults, pools tuned for one job type alone (math:
# RUN at the backends' 16 decoding slots, a small EVAL; swe: EVAL sized for 3-s suites),
# and generous / INIT-heavy variants. RUN below the backends' slots is not in the grid.
STATIC = [
    (8, 64, 16),  # the defaults
    (4, 16, 4),  # tuned for math-like jobs alone
    (8, 16, 16),
    (4, 64, 32),  # tuned for swe-like jobs alone
    (16, 64, 32),
    (32, 32, 8),
]


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def mixed(n: int, rng: random.Random, math_share: float = 0.5) -> list[dict[str, Any]]:
    n_math = round(n * math_share)
    jobs = [{"task": "budgeted", "instance": MATH if i < n_math else SWE} for i in range(n)]
    rng.shuffle(jobs)
    return jobs


def workload(kind: str, n: int) -> list[dict[str, Any]]:
    rng = random.Random(12)
    if kind == "mixed":
        return mixed(n, rng)
    return mixed(n // 2, rng, 0.9) + mixed(n - n // 2, rng, 0.1)


DESCRIBE = {
    "mixed": "half math-like, half swe-like, shuffled",
    "shift": "first half 90% math-like, then second half 90% swe-like",
}


async def run_config(
    name: str, jobs: list[dict[str, Any]], budget: int, **overrides: Any
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as state:
        cfg = load_config(
            overrides={
                "port": 0,
                "state_dir": state,
                "runtime": "local",
                "max_sandboxes": budget,
                **overrides,
            },
            env={},
        )
        registry = HandlerRegistry.discover()
        registry.register(BudgetedHandler(llm_slots=LLM_SLOTS))
        async with run_server(cfg, registry) as (_, url), RolloutClient(url) as client:
            t0 = time.perf_counter()
            ids = await client.submit_batch(jobs)
            docs = await drain(client, ids)
            elapsed = time.perf_counter() - t0
            status = await client.status()
    lat = [d["timing"]["total_s"] for d in docs]
    assert all(d["status"] == "done" for d in docs), {d["status"] for d in docs}
    return {
        "name": name,
        "jobs_s": len(docs) / elapsed,
        "p50": pct(lat, 0.5),
        "p99": pct(lat, 0.99),
        "idle": sum(status["idle_sandbox_seconds"].values()),
        "idle_by": status["idle_sandbox_seconds"],
        "peak": status["sandbox_budget"]["peak"],
        "pools": {k: v["configured"] for k, v in status["pools"].items()},
    }


async def drain(client: RolloutClient, ids: list[str]) -> list[dict[str, Any]]:
    pending, done = set(ids), []
    while pending:
        out = await client.poll(list(pending), wait=5)
        done += out["done"]
        pending -= {d["job_id"] for d in out["done"]}
    return done


async def grid(
    kind: str, n: int, auto_only: bool = False
) -> tuple[list[dict[str, Any]], tuple[float, str]]:
    budget = default_max_sandboxes(SandboxLimits(memory_bytes=GiB))
    print(f"workload {kind}: {n} jobs, {DESCRIBE[kind]}; sandbox budget {budget} (memory / 1 GiB)")
    jobs = workload(kind, n)
    rows = []
    for init, run, ev in [] if auto_only else STATIC:
        name = f"static {init}/{run}/{ev}"
        pools = {"init_workers": init, "run_workers": run, "eval_workers": ev}
        rows.append(await run_config(name, jobs, budget, jit_init=False, **pools))
        print_row(rows[-1])
    auto = await run_config("autoscale", jobs, budget, autoscale=True)
    print_row(auto)
    rows.append(auto)
    return rows, upper_bound(jobs, budget)


def sandbox_seconds(job: dict[str, Any]) -> float:
    """Sandbox-seconds a job holds at the least: INIT and RUN, and a sandboxed EVAL."""
    inst = job["instance"]
    held: float = inst["init_s"] + inst["run_s"]
    return held + (inst["eval_s"] if inst.get("eval_sandbox") else 0.0)


def upper_bound(jobs: list[dict[str, Any]], budget: int) -> tuple[float, str]:
    """Jobs/s no pool sizing or scheduler can beat on this workload: the batch needs at
    least its sandbox-seconds over the budget, its decoding seconds over the backends'
    slots, and its longest job's own time."""
    sb = sum(sandbox_seconds(j) for j in jobs) / budget
    llm = sum(j["instance"]["run_s"] for j in jobs) / LLM_SLOTS
    longest = max(sandbox_seconds(j) for j in jobs)
    span = max(sb, llm, longest)
    which = "the sandbox budget" if span == sb else "the backends" if span == llm else "one job"
    return len(jobs) / span, which


def print_row(r: dict[str, Any]) -> None:
    pools = "/".join(str(r["pools"][s]) for s in ("init", "run", "eval"))
    by = "/".join(f"{r['idle_by'][s]:.1f}" for s in ("init", "run", "eval"))
    print(
        f"  {r['name']:<20} {r['jobs_s']:6.2f} jobs/s  p50 {r['p50']:6.2f} s  "
        f"p99 {r['p99']:6.2f} s  idle {r['idle']:7.1f} sandbox-s ({by})  peak {r['peak']:3d}  "
        f"pools at end {pools}",
        flush=True,
    )


def verdict(rows: list[dict[str, Any]], bound: tuple[float, str]) -> None:
    static, auto = rows[:-1], rows[-1]
    best = max(static, key=lambda r: r["jobs_s"])
    median = statistics.median(r["jobs_s"] for r in static)
    print(f"autoscale / best static ({best['name']}): {auto['jobs_s'] / best['jobs_s']:.2f}x")
    print(f"autoscale / median static: {auto['jobs_s'] / median:.2f}x")
    print(f"idle sandbox-s: autoscale {auto['idle']:.1f} vs best static {best['idle']:.1f}")
    limit, which = bound
    print(
        f"upper bound for any pools ({which}): {limit:.2f} jobs/s; best static at "
        f"{best['jobs_s'] / limit:.0%} of it, autoscale at {auto['jobs_s'] / limit:.0%}; "
        f"1.3x the median static would be {1.3 * median / limit:.0%} of it"
    )


async def warm_init(jobs: int) -> None:
    from prorl_async.sandbox import bwrap_problem
    from prorl_async.scripted_llm import ScriptedLLM

    problem = bwrap_problem()
    if problem is not None:
        print(f"warm sandboxes: skipped, bwrap unusable here ({problem})")
        return
    for warm in (0, 4):
        inits = await _math_inits(ScriptedLLM, jobs, warm)
        print(
            f"  math INIT with warm_sandboxes={warm}: p50 {statistics.median(inits) * 1000:.1f} ms"
            f"  p99 {pct(inits, 0.99) * 1000:.1f} ms",
            flush=True,
        )


async def _math_inits(llm_cls: Any, jobs: int, warm: int) -> list[float]:
    inits = []
    with tempfile.TemporaryDirectory() as state:
        cfg = load_config(
            overrides={"port": 0, "state_dir": state, "runtime": "bwrap", "warm_sandboxes": warm},
            env={},
        )
        async with llm_cls(policy="finish") as llm, run_server(cfg) as (_, url):
            async with RolloutClient(url) as client:
                await client.add_llm_server(llm.address)
                for i in range(jobs):  # one at a time, paced like a trainer's steady stream
                    job_id = await client.submit("math", {"problem": f"{i}+1?", "answer": "1"})
                    doc = await client.result(job_id, wait=60)
                    assert doc is not None and doc["status"] == "done", doc
                    inits.append(doc["timing"]["init_s"])
    return inits


# JIT against eager INIT: (what, jobs, RUN workers, backend max_inflight, backend TTFT s,
# and the targets the test suite used to assert: JIT's peak at most, idle ratio below).
JIT_CASES = [
    ("RUN 64 workers, backend declares max_inflight=2", 30, 64, 2, 0.5, 8, 0.3),
    ("RUN 2 workers, nothing declared", 8, 2, None, 1.5, 5, 0.5),
]


async def jit_vs_eager() -> None:
    from prorl_async.sandbox import bwrap_problem

    problem = bwrap_problem()
    if problem is not None:
        print(f"JIT vs eager INIT: skipped, bwrap unusable here ({problem})")
        return
    print("JIT vs eager INIT (real bwrap sandboxes, one backend decoding 2 at once, INIT 8):")
    for what, jobs, run_workers, inflight, ttft, bound, below in JIT_CASES:
        got = {}
        for jit in (True, False):
            got[jit] = await _jit_run(jobs, run_workers, inflight, ttft, jit)
        (peak_j, idle_j), (peak_e, idle_e) = got[True], got[False]
        ratio = idle_j / idle_e if idle_e else float("nan")
        print(
            f"  {what}, {jobs} jobs: peak live sandboxes JIT {peak_j} vs eager {peak_e} "
            f"(JIT <= {bound}: {'met' if peak_j <= bound else 'NOT met'}); RUN idle "
            f"sandbox-s JIT {idle_j:.1f} vs eager {idle_e:.1f} = {ratio:.2f}x "
            f"(< {below}x: {'met' if ratio < below else 'NOT met'})",
            flush=True,
        )


async def _jit_run(
    jobs: int, run_workers: int, inflight: int | None, ttft: float, jit: bool
) -> tuple[int, float]:
    from prorl_async.scripted_llm import LatencyModel, ScriptedLLM

    with tempfile.TemporaryDirectory() as state:
        overrides = {
            "port": 0,
            "state_dir": state,
            "runtime": "bwrap",
            "init_workers": 8,
            "run_workers": run_workers,
            "max_sandboxes": 64,
            "jit_init": jit,
        }
        cfg = load_config(overrides=overrides, env={})
        latency = LatencyModel(ttft_s=ttft, capacity=2)
        async with (
            ScriptedLLM(policy="finish", latency=latency) as llm,
            run_server(cfg) as (_, url),
            RolloutClient(url) as client,
        ):
            await client.add_llm_server(llm.address, max_inflight=inflight)
            batch = [{"task": "sandbox", "instance": {"prompt": f"p{i}"}} for i in range(jobs)]
            docs = await drain(client, await client.submit_batch(batch))
            assert all(d["status"] == "done" for d in docs), {d["status"] for d in docs}
            status = await client.status()
    return status["sandbox_budget"]["peak"], status["idle_sandbox_seconds"]["run"]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=128)
    parser.add_argument("--workload", choices=["mixed", "shift", "both"], default="both")
    parser.add_argument("--warm-jobs", type=int, default=20)
    parser.add_argument("--skip-warm", action="store_true")
    parser.add_argument("--skip-jit", action="store_true", help="no JIT vs eager INIT part")
    parser.add_argument("--jit-only", action="store_true", help="only the JIT vs eager part")
    parser.add_argument("--auto-only", action="store_true", help="only the autoscale run")
    parser.add_argument("--debug", action="store_true", help="log the autoscaler's decisions")
    args = parser.parse_args()
    if args.debug:
        logging.basicConfig(format="%(relativeCreated)8.0f ms %(message)s")
        logging.getLogger("prorl_async.capacity.autoscale").setLevel(logging.DEBUG)
    t0 = time.perf_counter()
    kinds = ["mixed", "shift"] if args.workload == "both" else [args.workload]
    for kind in [] if args.jit_only else kinds:
        rows, bound = await grid(kind, args.jobs, args.auto_only)
        if not args.auto_only:
            verdict(rows, bound)
    if not args.skip_warm and not args.jit_only:
        await warm_init(args.warm_jobs)
    if not args.skip_jit:
        await jit_vs_eager()
    print(f"bench wall time {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    uvloop.run(main())
