"""Pipeline overhead: >= 20,000 zero-duration `sleep` jobs through all three stages.

Two parts, one invocation.

**Ratios, paired.** A bare aiohttp + uvloop server (``bench/_bare.py``: reads each body
and answers the same 202, and /poll answers every id done at once: the physical limit
of the stack), the in-memory job store and the durable SQLite store (the default) run
at the same time; each phase alternates short bursts across the three (``--pairs``
rounds, the order rotated every round) and each ratio is the median over the rounds of
the ratio within one round. On a shared machine the same server's CPU per job moves by
half within a minute; bursts seconds apart see the same machine, whole runs minutes
apart do not. Phases: single ``POST /process`` (64 concurrent), batch submit + /poll
end to end, zero-length jobs kept 256 in flight (and the server's CPU per job there:
its process tree's CPU seconds over the jobs it completed), and last the submit path
alone (single submits of jobs held in the INIT queue: accepted, validated, committed
and queued but not run), which tells the request path's cost from the pipeline's.

**Details, one pass per server.** Submit throughput (single and batch), end-to-end
completed jobs/s, submit latency p50/p99, orchestration overhead per job (completion
time minus the sum of stage durations) with 256 jobs in flight, CPU per job, and the
server's RSS before, after the run, and after result retention has dropped the
results. A last section retains 2,000 results of 32k tokens each and compares write
time, read time and server RSS.

    python bench/pipeline_overhead.py [--jobs 20000] [--inflight 256] [--pairs 25] [--large 2000]

``--baseline DIR`` adds the memory and durable servers of another checkout (e.g. ``git
worktree add DIR COMMIT``) to the paired rounds and prints each figure as this code's
over the baseline's, paired: a change's cost measured side by side in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._server import bare, cpu_seconds, rss_mib, server  # noqa: E402
from prorl_async.client import RolloutClient  # noqa: E402

SLEEP0 = {"task": "sleep", "instance": {}}
Rows = list[tuple[str, str]]


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def single_submits(
    client: RolloutClient, n: int, conc: int, instance: dict[str, Any] | None = None
) -> tuple[float, list[float]]:
    lat: list[float] = []
    sem = asyncio.Semaphore(conc)
    body = instance or {}

    async def one() -> None:
        async with sem:
            t0 = time.perf_counter()
            await client.submit("sleep", body)
            lat.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    return n / (time.perf_counter() - t0), lat


# How long ``drain`` waits for a burst's results at most: a server that stops finishing
# jobs fails the bench with a message instead of leaving it polling forever.
DRAIN_S = 300.0


async def drain(client: RolloutClient, ids: list[str]) -> list[dict[str, Any]]:
    pending, done = list(ids), []
    deadline = time.monotonic() + DRAIN_S
    while pending:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(pending)} of {len(ids)} jobs not done after {DRAIN_S:.0f} s")
        out = await client.poll(pending[:5000], wait=5)
        if out["unknown"]:  # expired before it was read: raise --retention
            raise RuntimeError(f"{len(out['unknown'])} results expired before being polled")
        done += out["done"]
        finished = {d["job_id"] for d in out["done"]}
        pending = [i for i in pending if i not in finished]
    return done


async def batch_end_to_end(client: RolloutClient, n: int, batch: int) -> tuple[float, float]:
    t0 = time.perf_counter()
    ids: list[str] = []
    for i in range(0, n, batch):
        ids += await client.submit_batch([SLEEP0] * min(batch, n - i))
    submit_rate = n / (time.perf_counter() - t0)
    docs = await drain(client, ids)
    assert len(docs) == n and all(d["status"] == "done" for d in docs)
    return submit_rate, n / (time.perf_counter() - t0)


async def closed_loop(
    client: RolloutClient, n: int, inflight: int, instance: dict[str, float], spread: float = 0.0
) -> tuple[float, list[float]]:
    """Keep ``inflight`` jobs in flight; replace each finished one at once.

    Overhead per job = server-side completion time (submit -> terminal) minus the
    time it actually spent inside its stages (timer slop of the sleeps is not ours).
    """
    rng = random.Random(0)

    def jobs(k: int) -> list[dict[str, Any]]:
        # Durations vary by +-spread, as rollouts do (identical ones run in lockstep bursts).
        return [
            {
                "task": "sleep",
                "instance": {
                    k: v * rng.uniform(1 - spread, 1 + spread) for k, v in instance.items()
                },
            }
            for _ in range(k)
        ]

    overheads: list[float] = []
    pending = set(await client.submit_batch(jobs(inflight)))
    submitted = inflight
    t0 = time.perf_counter()
    while pending:
        out = await client.poll(list(pending), wait=5)
        for doc in out["done"]:
            pending.discard(doc["job_id"])
            overheads.append(doc["timing"]["total_s"] - doc["timing"]["active_s"])
        refill = min(len(out["done"]), n - submitted)
        if refill:
            pending.update(await client.submit_batch(jobs(refill)))
            submitted += refill
    return n / (time.perf_counter() - t0), overheads


async def wait_expired(client: RolloutClient, retention: float) -> int:
    """Wait until retention has dropped the finished results; returns records left."""
    async with asyncio.timeout(retention * 4 + 30):
        records = (await client.status())["records"]
        while records > 0:  # server-side state with no event to await: re-read it
            await asyncio.sleep(retention / 4)
            records = (await client.status())["records"]
    return int(records)


def ms(values: list[float]) -> str:
    return f"{pct(values, 0.5) * 1e3:.2f} / {pct(values, 0.99) * 1e3:.2f} ms"


TIMED = {"init_s": 0.01, "run_s": 0.2, "eval_s": 0.01}


def labels(args: argparse.Namespace) -> dict[str, str]:
    """Row key -> row label, in the order printed."""
    stages = "/".join(f"{v * 1e3:g}" for v in TIMED.values())
    return {
        "total": "jobs pushed through all three stages",
        "single": "submit throughput, single POST /process (64 conc.)",
        "lat": "submit latency p50 / p99 (single)",
        "batch": f"submit throughput, POST /process/batch ({args.batch}/req)",
        "e2e": f"end-to-end completed, batch submit + /poll ({args.jobs:,})",
        "loop": f"end-to-end completed, {args.inflight} in flight, zero durations",
        "over0": "  completion time p50 / p99 there (queueing: in-flight/throughput)",
        "cpu_job": "  server CPU per job there (process CPU time / jobs completed)",
        "over": f"orchestration overhead p50 / p99, {args.inflight} in flight, "
        f"stages {stages} ms +-50%",
        "lockstep": "  same, identical durations (all move in lockstep bursts)",
        "records": "job records held: after the run / after retention",
        "rss": "server RSS: start / after run / after 2nd run + retention",
    }


async def phases(
    client: RolloutClient, pid: int, args: argparse.Namespace
) -> tuple[dict[str, str], dict[str, float]]:
    """What every server (bare included) is put through: single and batch submits, end
    to end by batch + /poll and with ``inflight`` zero-length jobs kept in flight."""
    single_rate, lat = await single_submits(client, args.single, 64)
    batch_rate, e2e_rate = await batch_end_to_end(client, args.jobs, args.batch)
    cpu0 = cpu_seconds(pid)
    loop_rate, over0 = await closed_loop(client, args.jobs, args.inflight, {})
    cpu_job = (cpu_seconds(pid) - cpu0) / args.jobs  # server CPU time / jobs it completed
    shown = {
        "single": f"{single_rate:,.0f} jobs/s",
        "lat": ms(lat),
        "batch": f"{batch_rate:,.0f} jobs/s",
        "e2e": f"{e2e_rate:,.0f} jobs/s",
        "loop": f"{loop_rate:,.0f} jobs/s",
        "over0": ms(over0),
        "cpu_job": f"{cpu_job * 1e3:.3f} ms",
    }
    figs = {
        "single": single_rate,
        "batch": batch_rate,
        "e2e": e2e_rate,
        "loop": loop_rate,
        "cpu_job": cpu_job,
        "submit_p99": pct(lat, 0.99),
    }
    return shown, figs


async def run(args: argparse.Namespace, store: str) -> tuple[dict[str, str], dict[str, float]]:
    env = {"PRORL_RETENTION_S": str(args.retention)}
    # Enough workers that 256 timed jobs never queue for a worker: what is left is overhead.
    workers = ["--init-workers", "256", "--run-workers", "256", "--eval-workers", "256"]
    workers += ["--store", store]
    async with server(*workers, env=env) as (pid, url), RolloutClient(url) as client:
        rss0 = rss_mib(pid)
        shown, figs = await phases(client, pid, args)
        _, over = await closed_loop(client, args.timed_jobs, args.inflight, TIMED, spread=0.5)
        _, lockstep = await closed_loop(client, args.timed_jobs, args.inflight, TIMED)
        rss1, records1 = rss_mib(pid), (await client.status())["records"]
        await wait_expired(client, args.retention)
        await batch_end_to_end(client, args.jobs, args.batch)
        await wait_expired(client, args.retention)
        rss2 = rss_mib(pid)
    shown |= {
        "total": f"{args.single + 2 * args.jobs + 2 * args.timed_jobs + args.jobs:,}",
        "over": ms(over),
        "lockstep": ms(lockstep),
        "records": f"{records1:,} / 0",
        "rss": f"{rss0:.0f} / {rss1:.0f} / {rss2:.0f} MiB",
    }
    return shown, figs | {"overhead_p99": pct(over, 0.99)}


# A job that holds an INIT worker for an hour: with one INIT worker, every later job is
# accepted, validated, committed and queued, and never runs (the submit path alone).
HELD = {"init_s": 3600.0}
PAIRED = ("single", "e2e", "loop", "held")


async def paired(args: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    """All three servers up at once; each phase alternates bursts across them, the order
    rotated every round. Returns server -> figure -> one value per round (the same
    round's values of two servers are a pair)."""
    workers = ["--init-workers", "256", "--run-workers", "256", "--eval-workers", "256"]
    env = {"PRORL_RETENTION_S": str(args.retention)}
    names = _names(args)
    figs: dict[str, dict[str, list[float]]] = {name: {} for name in names}
    async with AsyncExitStack() as stack:
        pids: dict[str, int] = {}
        clients: dict[str, RolloutClient] = {}
        for name in names:
            store, _, base = name.partition("@")
            source = args.baseline if base else None
            started = (
                bare()
                if name == "bare"
                else server(*workers, "--store", store, env=env, source=source)
            )
            pids[name], url = await stack.enter_async_context(started)
            clients[name] = await stack.enter_async_context(RolloutClient(url))
        for client in clients.values():
            await single_submits(client, 500, 64)  # warm-up: connections, caches

        async def burst(name: str, phase: str) -> dict[str, float]:
            client = clients[name]
            if phase == "single":
                return {"single": (await single_submits(client, args.pair_single, 64))[0]}
            if phase == "held":
                held = await single_submits(client, args.pair_single, 64, HELD)
                return {"held": held[0]}
            if phase == "e2e":
                batch_rate, e2e_rate = await batch_end_to_end(client, args.pair_jobs, args.batch)
                return {"batch": batch_rate, "e2e": e2e_rate}
            cpu0 = cpu_seconds(pids[name])
            rate, _ = await closed_loop(client, args.pair_jobs, args.inflight, {})
            return {"loop": rate, "cpu_job": (cpu_seconds(pids[name]) - cpu0) / args.pair_jobs}

        for phase in PAIRED:
            if phase == "held":
                for name in [n for n in names if n != "bare"]:
                    await clients[name].set_workers(init=1)
                    await clients[name].submit("sleep", HELD)  # takes the one INIT worker
            for r in range(args.pairs):
                k = r % len(names)
                for name in names[k:] + names[:k]:
                    for key, value in (await burst(name, phase)).items():
                        figs[name].setdefault(key, []).append(value)
        for name in [n for n in names if n != "bare"]:  # held jobs queued, not run
            queued = (await clients[name].status())["queues"]["init"]
            assert queued >= args.pairs * args.pair_single, (name, queued)
    return figs


def _names(args: argparse.Namespace) -> tuple[str, ...]:
    """The servers of the paired rounds: bare, memory, sqlite (and ``STORE@base``: the
    baseline checkout's)."""
    if args.baseline is None:
        return SERVERS
    return (*SERVERS, *(f"{store}@base" for store in STORES))


def baseline_report(figs: dict[str, dict[str, list[float]]]) -> None:
    """This code over the baseline's, per store and figure (paired medians; >1 is faster,
    except CPU per job, where >1 costs more)."""
    print("\nthis checkout / baseline (paired median, 90% bootstrap interval):")
    for store in STORES:
        for key in sorted(figs[store]):
            ratios = paired_ratios(figs, store, f"{store}@base", key)
            print(f"  {store:<7} {key:<8} {statistics.median(ratios):.3f} {interval(ratios)}")


def paired_ratios(
    figs: dict[str, dict[str, list[float]]], num: str, den: str, key: str
) -> list[float]:
    return [a / b for a, b in zip(figs[num][key], figs[den][key], strict=True)]


def interval(ratios: list[float], draws: int = 2_000) -> str:
    """The 5th-95th percentile of the median of ``ratios`` resampled with replacement
    (seeded: the same rounds print the same interval)."""
    rng = random.Random(0)
    meds = [statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(draws)]
    return f"[{pct(meds, 0.05):.2f}-{pct(meds, 0.95):.2f}]"


def paired_report(args: argparse.Namespace, figs: dict[str, dict[str, list[float]]]) -> None:
    """Median rates, median paired ratios (min-max over the rounds), and the targets."""
    kinds = {
        "single": "single submit, POST /process (64 conc.)",
        "batch": f"batch submit, POST /process/batch ({args.batch}/req)",
        "e2e": f"end to end, batch submit + /poll ({args.pair_jobs:,})",
        "loop": f"end to end, {args.inflight} in flight, zero durations ({args.pair_jobs:,})",
        "held": "submit path alone (single submits, jobs held in INIT)",
    }
    print(f"paired: {args.pairs} rounds per phase, the three servers alternated in each")
    width = max(len(v) for v in kinds.values())
    print(f"{'median jobs/s':<{width}}  " + "  ".join(f"{n:>9}" for n in SERVERS))
    for key, what in kinds.items():
        rates = "  ".join(f"{statistics.median(figs[n][key]):>9,.0f}" for n in SERVERS)
        print(f"{what:<{width}}  {rates}")
    cpu = {n: statistics.median(figs[n]["cpu_job"]) * 1e3 for n in SERVERS}
    what = "server CPU per job, 256 in flight (ms)"
    print(f"{what:<{width}}  " + "  ".join(f"{cpu[n]:>9.3f}" for n in SERVERS))

    def spread(values: list[float]) -> str:
        return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"

    print(f"\nratios, median of the {args.pairs} paired rounds [min-max]:")
    for key, what in kinds.items():
        line = "  ".join(
            f"{s} / bare {spread(paired_ratios(figs, s, 'bare', key))}" for s in STORES
        )
        durable = spread(paired_ratios(figs, "sqlite", "memory", key))
        print(f"  {what:<{width}}  {line}  sqlite / memory {durable}")
    print(
        "(each target's figure is the median of the paired rounds' ratios; in brackets the 90% "
        "bootstrap interval of that median: how far it could move with other rounds)"
    )
    for store, share in TARGETS.items():
        ratios = paired_ratios(figs, store, "bare", "single")
        ratio = statistics.median(ratios)
        ok = met(ratio >= share)
        print(
            f"target: single submit, {store}: {ratio:.2f} of bare {interval(ratios)}, "
            f">= {share}: {ok}"
        )
    worse = min(
        (paired_ratios(figs, "sqlite", "memory", k) for k in ("e2e", "loop")),
        key=statistics.median,
    )
    e2e = statistics.median(worse)
    print(
        f"target: end-to-end zero-length jobs/s, sqlite {e2e:.3f} of memory {interval(worse)} "
        f"(worse of the two end-to-end phases), >= 0.85: {met(e2e >= 0.85)}"
    )
    print(
        f"target: server CPU per zero-length job, sqlite {cpu['sqlite']:.3f} ms, <= 0.2 ms: "
        f"{met(cpu['sqlite'] <= 0.2)}"
    )


async def run_bare(args: argparse.Namespace) -> tuple[dict[str, str], dict[str, float]]:
    """The same client phases against the bare aiohttp server (no store, no pipeline)."""
    async with bare() as (pid, url), RolloutClient(url) as client:
        shown, figs = await phases(client, pid, args)
    return shown | {"total": f"{args.single + 2 * args.jobs:,} (answered)"}, figs


async def large(args: argparse.Namespace, store: str) -> tuple[list[tuple[str, str]], float]:
    """Retain ``args.large`` results of 32k tokens: write time, read time, server RSS."""
    job = {"task": "sleep", "instance": {"result_tokens": 32_768}}
    async with server("--store", store) as (pid, url), RolloutClient(url) as client:
        rss0 = rss_mib(pid)
        t0 = time.perf_counter()
        ids: list[str] = []
        for _ in range(0, args.large, 100):
            ids += await client.submit_batch([job] * 100)
        await wait_finished(client)
        write_s = (time.perf_counter() - t0) / args.large
        st = await client.status()
        reads = await read_times(url, random.Random(1).sample(ids, 200))
        rss1 = rss_mib(pid)
    size = st["store"]["bytes"] / 2**20
    return [
        (f"{args.large:,} results of 32k tokens: time per result, submit to stored", ms1(write_s)),
        ("  GET /jobs/{id} of a retained one (200 random) p50 / p99", ms(reads)),
        (
            "  store: bytes on disk (sqlite) or held (memory) / in-memory cache",
            f"{size:,.0f} / {st['store']['cache_bytes'] / 2**20:,.0f} MiB",
        ),
        ("  server RSS: start / with them retained", f"{rss0:.0f} / {rss1:.0f} MiB"),
    ], rss1


async def wait_finished(client: RolloutClient) -> None:
    async with asyncio.timeout(600):
        st = await client.status()
        while sum(st["queues"].values()) + sum(st["active"].values()) > 0:
            await asyncio.sleep(0.05)  # server-side state with no event to await: re-read it
            st = await client.status()


async def read_times(url: str, ids: list[str]) -> list[float]:
    out = []
    async with aiohttp.ClientSession() as s:
        for job_id in ids:
            t0 = time.perf_counter()
            async with s.get(f"{url}/jobs/{job_id}") as r:
                await r.read()
            out.append(time.perf_counter() - t0)
    return out


def ms1(value: float) -> str:
    return f"{value * 1e3:.2f} ms"


def table(columns: dict[str, list[tuple[str, str]]]) -> None:
    names = list(columns)
    rows = columns[names[0]]
    width = max(len(k) for k, _ in rows)
    cols = [max(len(n), *(len(v) for _, v in columns[n])) for n in names]
    head = "  ".join(f"{n:>{w}}" for n, w in zip(names, cols, strict=True))
    print(f"{'metric':<{width}}  {head}")
    for i, (k, _) in enumerate(rows):
        vals = [columns[n][i][1] for n in names]
        print(f"{k:<{width}}  " + "  ".join(f"{v:>{w}}" for v, w in zip(vals, cols, strict=True)))


SERVERS = ("bare", "memory", "sqlite")
STORES = ("memory", "sqlite")
TARGETS = {"memory": 0.8, "sqlite": 0.6}  # single submit, as a share of bare aiohttp


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--timed-jobs", type=int, default=5_000)
    ap.add_argument("--single", type=int, default=4_000, help="single POST /process submits")
    ap.add_argument("--inflight", type=int, default=256)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--retention", type=float, default=10.0)
    ap.add_argument("--large", type=int, default=2_000)
    ap.add_argument("--rounds", type=int, default=1, help="detail passes per server (best kept)")
    ap.add_argument("--pairs", type=int, default=25, help="paired rounds per phase (0: none)")
    ap.add_argument("--baseline", help="a checkout to compare against, paired (see above)")
    ap.add_argument("--pair-single", type=int, default=2_000, help="single submits per burst")
    ap.add_argument("--pair-jobs", type=int, default=5_000, help="jobs per end-to-end burst")
    ap.add_argument(
        "--retained",
        type=int,
        default=500_000,
        help="results a kept server holds against a fresh one, paired (0: skip)",
    )
    ap.add_argument("--retained-pairs", type=int, default=8, help="paired bursts, kept vs fresh")
    ap.add_argument("--retained-only", action="store_true", help="run only the retained case")
    args = ap.parse_args()
    if args.retained_only:
        await retained(args)
        return
    if args.pairs:
        paired_figs = await paired(args)
        paired_report(args, paired_figs)
        if args.baseline is not None:
            baseline_report(paired_figs)
            return  # a comparison: the detail passes below describe one checkout
        print()
    shown: dict[str, dict[str, str]] = {}
    best: dict[str, dict[str, float]] = {}
    # Details, a pass per server (alternating if --rounds > 1): each column is the pass
    # with the best end-to-end rate; the figures below it are each the best of the passes.
    for _ in range(args.rounds):
        for name in SERVERS:
            rows, figs = await (run_bare(args) if name == "bare" else run(args, name))
            if name not in best or figs["loop"] > best[name]["loop"]:
                shown[name] = rows
            best[name] = keep_best(best.get(name), figs)
    names = labels(args)
    table({n: [(label, shown[n].get(k, "-")) for k, label in names.items()] for n in SERVERS})
    report(args, best)
    if args.large:
        big: dict[str, Rows] = {}
        rss: dict[str, float] = {}
        for store in ("memory", "sqlite"):
            big[store], rss[store] = await large(args, store)
        print()
        table(big)
        print(
            f"RSS with the results retained, sqlite / memory: {rss['sqlite'] / rss['memory']:.2f}"
        )
    if args.retained:
        await retained(args)


async def retained(args: argparse.Namespace) -> None:
    """End to end with ``--inflight`` zero-length jobs on the durable store: a server that
    keeps ``--retained`` finished results (retention longer than the run) against a fresh
    one, in alternating bursts of ``--jobs`` (a new fresh server for each: it keeps only its
    own burst). The ratio is kept / fresh per pair; its median, and the CPU per job."""
    env = {"PRORL_RETENTION_S": "86400"}
    workers = ("--init-workers", "256", "--run-workers", "256", "--eval-workers", "256")
    rates: dict[str, list[float]] = {"kept": [], "fresh": []}
    cpus: dict[str, list[float]] = {"kept": [], "fresh": []}
    async with server(*workers, env=env) as (kept_pid, kept_url), RolloutClient(kept_url) as kept:
        t0 = time.perf_counter()
        for _ in range(0, args.retained, args.jobs):  # fill it
            await closed_loop(kept, args.jobs, args.inflight, {})
        held = (await kept.status())["records"]
        print(f"\nretained results: {held:,} kept ({time.perf_counter() - t0:.0f} s to fill)")
        for i in range(args.retained_pairs):
            async with server(*workers, env=env) as (fresh_pid, fresh_url):
                async with RolloutClient(fresh_url) as fresh:
                    order = [("kept", kept, kept_pid), ("fresh", fresh, fresh_pid)]
                    for name, client, pid in order if i % 2 else order[::-1]:
                        cpu0 = cpu_seconds(pid)
                        rate, _ = await closed_loop(client, args.jobs, args.inflight, {})
                        rates[name].append(rate)
                        cpus[name].append((cpu_seconds(pid) - cpu0) / args.jobs)
        held = (await kept.status())["records"]
    ratios = [k / f for k, f in zip(rates["kept"], rates["fresh"], strict=True)]
    cpu = [k / f for k, f in zip(cpus["kept"], cpus["fresh"], strict=True)]
    med = statistics.median
    print(
        f"end to end, {args.inflight} in flight, sqlite, {args.retained_pairs} pairs of "
        f"{args.jobs:,} jobs: kept {med(rates['kept']):,.0f} jobs/s (holding {args.retained:,}"
        f" to {held:,}), fresh {med(rates['fresh']):,.0f} jobs/s"
    )
    print(
        f"  kept / fresh: throughput {med(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}], "
        f"CPU per job {med(cpu):.2f} ({med(cpus['kept']) * 1e6:.0f} vs "
        f"{med(cpus['fresh']) * 1e6:.0f} us); within 10%: {met(med(ratios) >= 0.9)}"
    )


def keep_best(old: dict[str, float] | None, new: dict[str, float]) -> dict[str, float]:
    """Per figure, the better of two rounds (rates: higher; times: lower)."""
    if old is None:
        return dict(new)
    lower = ("cpu_job", "submit_p99", "overhead_p99")
    return {k: (min if k in lower else max)(old[k], new[k]) for k in new}


def met(ok: bool) -> str:
    return "met" if ok else "MISSED"


def report(args: argparse.Namespace, best: dict[str, dict[str, float]]) -> None:
    bare_, mem, dur = best["bare"], best["memory"], best["sqlite"]
    print(f"\ndetails, ratios to bare (best of {args.rounds} pass(es) each; runs minutes apart):")
    kinds = {
        "single": "single submit",
        "batch": "batch submit",
        "e2e": "end to end, batch + /poll",
        "loop": f"end to end, {args.inflight} in flight",
    }
    for key, what in kinds.items():
        line = "  ".join(f"{s} {best[s][key] / bare_[key]:.2f}" for s in STORES)
        print(f"  {what:<28} {line}")
    p99 = dur["overhead_p99"] * 1e3
    print(
        f"p99 orchestration overhead, {args.inflight} in flight, sqlite: {p99:.2f} ms "
        f"(memory {mem['overhead_p99'] * 1e3:.2f} ms; docs/performance.md's 4.69 ms: "
        f"{p99 / 4.69:.2f}x); < 5 ms: {met(p99 < 5)}"
    )
    sub = dur["submit_p99"] / mem["submit_p99"]
    print(
        f"end to end, sqlite: {dur['loop']:,.0f} jobs/s, >= 2,000: {met(dur['loop'] >= 2000)}; "
        f"submit p99 sqlite / memory {sub:.2f}x, <= 2x: {met(sub <= 2)}"
    )


if __name__ == "__main__":
    uvloop.run(main())
