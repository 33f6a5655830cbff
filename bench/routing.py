"""Routing bench: least-in-flight vs a cumulative round-robin counter, on the REAL pool.

Four capacity-limited ScriptedLLM servers (latency model on: time to first token,
per-token time, slowdown with concurrency, a decoding-slot cap) are driven by a fixed
number of RUN workers, each job holding one lease for its whole run and making
``units`` LLM calls. Three job-duration profiles:

- uniform:   every job the same length;
- lognormal: median ~11 units, heavy tail (sigma 1);
- aligned:   every 4th job long, the others short (aligned with a 4-backend rotation).

Printed side by side per profile: the mean busiest-minus-idlest concurrency gap (jobs
holding a lease per backend, sampled every few ms), the mean coefficient of variation of
that concurrency, the peak per-backend concurrency, and end-to-end jobs/s.

    python bench/routing.py [--jobs 200] [--workers 16] [--seed 0]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import time
from collections.abc import Sequence

import msgspec
import uvloop

from prorl_async.llm.pool import Backend, BackendPool, Picker, PoolConfig, least_inflight
from prorl_async.scripted_llm import LatencyModel, ScriptedLLM

BACKENDS = 4
TOKENS_PER_UNIT = 8
PROMPT = list(range(1, 33))


class Result(msgspec.Struct, frozen=True):
    gap: float
    cv: float
    peak: int
    jobs_per_s: float


def round_robin() -> Picker:
    """The baseline: a counter that only grows, blind to what is in flight now."""
    counter = 0

    def pick(candidates: Sequence[Backend]) -> Backend:
        nonlocal counter
        chosen = candidates[counter % len(candidates)]
        counter += 1
        return chosen

    return pick


def profile(name: str, jobs: int, rng: random.Random) -> list[int]:
    """Units (LLM calls) per job."""
    if name == "uniform":
        return [11] * jobs
    if name == "lognormal":
        return [max(1, min(200, round(rng.lognormvariate(0.0, 1.0) * 11))) for _ in range(jobs)]
    if name == "aligned":
        return [44 if i % BACKENDS == BACKENDS - 1 else 4 for i in range(jobs)]
    raise ValueError(f"unknown profile {name!r}")


async def run_job(pool: BackendPool, units: int) -> None:
    async with pool.lease() as lease:
        for _ in range(units):
            await lease.generate(PROMPT, TOKENS_PER_UNIT, {"temperature": 1.0})


async def worker(pool: BackendPool, queue: asyncio.Queue[int]) -> None:
    while True:
        try:
            units = queue.get_nowait()
        except asyncio.QueueEmpty:
            return
        await run_job(pool, units)


async def sample(pool: BackendPool, gaps: list[int], cvs: list[float], done: asyncio.Event) -> int:
    """Sample per-backend concurrency until ``done``; returns the peak seen."""
    peak = 0
    while not done.is_set():
        load = [b.inflight for b in pool.backends]
        peak = max(peak, *load)
        gaps.append(max(load) - min(load))
        mean = statistics.fmean(load)
        if mean > 0:
            cvs.append(statistics.pstdev(load) / mean)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), 0.005)
    return peak


async def run(llms: list[ScriptedLLM], picker: Picker, units: list[int], workers: int) -> Result:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for u in units:
        queue.put_nowait(u)
    gaps: list[int] = []
    cvs: list[float] = []
    done = asyncio.Event()
    config = PoolConfig(request_timeout_s=120.0)
    async with BackendPool(config, picker=picker) as pool, asyncio.TaskGroup() as tg:
        for llm in llms:
            pool.add(llm.address, model=llm.model)
        sampler = tg.create_task(sample(pool, gaps, cvs, done))
        start = time.perf_counter()
        async with asyncio.TaskGroup() as jobs:
            for _ in range(workers):
                jobs.create_task(worker(pool, queue))
        wall = time.perf_counter() - start
        done.set()
    peak = sampler.result()
    return Result(statistics.fmean(gaps), statistics.fmean(cvs), peak, len(units) / wall)


def report(name: str, lif: Result, rr: Result) -> None:
    ratio = f"({rr.gap / lif.gap:.1f}x)" if lif.gap >= 0.05 and rr.gap >= 0.05 else ""
    print(f"\n{name}")
    print(f"  {'':28}{'least-in-flight':>17}{'round-robin':>14}")
    print(f"  {'mean busiest-idlest gap':28}{lif.gap:17.2f}{rr.gap:14.2f}   {ratio}")
    print(f"  {'concurrency CV':28}{lif.cv:17.3f}{rr.cv:14.3f}")
    print(f"  {'peak per-backend conc.':28}{lif.peak:17d}{rr.peak:14d}")
    print(f"  {'jobs/s':28}{lif.jobs_per_s:17.1f}{rr.jobs_per_s:14.1f}")


async def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=200)
    p.add_argument("--workers", type=int, default=16, help="RUN workers (jobs at once)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profiles", default="uniform,lognormal,aligned")
    args = p.parse_args(argv)
    latency = LatencyModel(ttft_s=0.01, per_token_s=0.004, slowdown=0.1, capacity=4)
    print(
        f"{BACKENDS} ScriptedLLM backends, capacity {latency.capacity}, ttft {latency.ttft_s}s, "
        f"{latency.per_token_s}s/token x {TOKENS_PER_UNIT} tokens per unit, slowdown "
        f"{latency.slowdown}/concurrent; {args.jobs} jobs, {args.workers} workers"
    )
    async with contextlib.AsyncExitStack() as stack:
        llms = [
            await stack.enter_async_context(ScriptedLLM(latency=latency, seed=i))
            for i in range(BACKENDS)
        ]
        for name in args.profiles.split(","):
            units = profile(name, args.jobs, random.Random(args.seed))
            lif = await run(llms, least_inflight, units, args.workers)
            rr = await run(llms, round_robin(), units, args.workers)
            report(f"{name} (mean {statistics.fmean(units):.1f} units/job)", lif, rr)


if __name__ == "__main__":
    uvloop.run(main())
