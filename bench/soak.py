"""Soak: a mixed load on one real server for a long time; its resources over time.

A real ``prorl-async serve`` (the durable store, retention shorter than the run, so
results expire throughout) with the scripted engine (a TEST DOUBLE of vLLM, in this
process) registered, under:

- submitters keeping ``--inflight`` jobs in flight: ``math`` jobs through the engine
  (the scripted policy answers with ``finish``: no sandbox is started) and ``sleep``
  jobs of random length, in batches;
- a canceller (a few random jobs in flight every half second), long-polls of the
  jobs in flight, a cursor reader of ``/results``, an SSE client on ``/events``;
- a weight load (``POST /weights/load``, two checkpoint directories in turn) every
  ``--load-every`` seconds.

Every ``--sample-s`` seconds it prints the server's RSS (its own, and with its writer
and other children), open descriptors, threads, the SQLite files' size and the jobs
done. Descriptors are split into the established TCP connections at the sample (the
load's clients connect and close all the time, so these move with the moment) and the
rest (files, pipes, listeners, sockets being closed): a leak shows in the rest. At the
end: the growth of RSS and of the descriptors other than connections over the run's
last half (the median of the last three samples over that of the three around half
time), and the range of connections; flat means under 5%.

    python bench/soak.py [--minutes 20] [--inflight 128] [--retention 120]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._server import connection_fds, open_fds, rss_mib, server  # noqa: E402
from prorl_async.client import GoneError, RolloutClient, RolloutError  # noqa: E402
from prorl_async.scripted_llm import LatencyModel, ScriptedLLM  # noqa: E402


class Load:
    """What the load generators share: the jobs in flight and counts of what they did."""

    def __init__(self, inflight: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self.inflight = inflight
        self.outstanding: set[str] = set()
        self.room = asyncio.Condition()
        self.counts = dict.fromkeys(
            ("submitted", "done", "cancelled", "polls", "cursor", "events", "loads", "errors"),
            0,
        )

    def job(self) -> dict[str, Any]:
        if self.rng.random() < 0.4:
            a, b = self.rng.randrange(100), self.rng.randrange(100)
            return {
                "task": "math",
                "instance": {"problem": f"What is {a} + {b}?", "answer": str(a + b)},
                "sampling_params": {"max_tokens": 32},
            }
        return {"task": "sleep", "instance": {"run_s": self.rng.uniform(0.0, 2.0)}}

    async def ended(self, ids: list[str]) -> int:
        """Take ``ids`` out of the jobs in flight; returns how many were still in it."""
        async with self.room:
            before = len(self.outstanding)
            self.outstanding.difference_update(ids)
            self.room.notify_all()
            return before - len(self.outstanding)


async def submitter(client: RolloutClient, load: Load) -> None:
    while True:
        async with load.room:
            await load.room.wait_for(lambda: len(load.outstanding) + 8 <= load.inflight)
        try:
            ids = await client.submit_batch([load.job() for _ in range(8)])
        except RolloutError:
            load.counts["errors"] += 1
            continue
        load.outstanding.update(ids)
        load.counts["submitted"] += len(ids)


async def canceller(client: RolloutClient, load: Load) -> None:
    while True:
        await asyncio.sleep(0.5)  # the load's pace, not synchronisation
        if not load.outstanding:
            continue
        some = load.rng.sample(sorted(load.outstanding), min(2, len(load.outstanding)))
        out = await client.cancel(some)
        load.counts["cancelled"] += len(out["cancelled"])
        await load.ended(out["cancelled"] + out["already_finished"] + out["not_found"])


async def poller(client: RolloutClient, load: Load, part: int, parts: int) -> None:
    while True:
        ids = sorted(load.outstanding)[part::parts][:200]
        if not ids:
            await asyncio.sleep(0.1)  # nothing in flight yet: the load's pace
            continue
        out = await client.poll(ids, wait=5)
        load.counts["polls"] += 1
        done = [d["job_id"] for d in out["done"]]
        load.counts["done"] += await load.ended(done)
        await load.ended(out["unknown"])


async def cursor_reader(client: RolloutClient, load: Load) -> None:
    after: int | None = None
    while True:
        try:
            out = await client.results(after, limit=500, wait=5)
        except GoneError:  # fell behind retention: read on from the oldest held
            after = None
            continue
        load.counts["cursor"] += len(out["results"])
        after = out["next"]


async def sse_client(url: str, load: Load) -> None:
    timeout = aiohttp.ClientTimeout(total=None, sock_read=60)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        while True:
            async with http.get(f"{url}/events") as resp:
                async for line in resp.content:
                    if line.startswith(b"data:"):
                        load.counts["events"] += 1


async def weight_loads(client: RolloutClient, load: Load, dirs: list[Path], every: float) -> None:
    version = 0
    while True:
        await asyncio.sleep(every)  # the schedule of the loads, not synchronisation
        version += 1
        await client.load_weights(version, str(dirs[version % 2]))
        load.counts["loads"] += 1


def threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return 0


def own_rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def checkpoint(path: Path) -> Path:
    """A directory the server takes as a checkpoint (the double only needs it to exist)."""
    path.mkdir()
    (path / "config.json").write_text('{"model_type": "scripted"}')
    (path / "model.safetensors").write_bytes(b"")
    return path


def growth(series: list[float]) -> float:
    """The median of the last three samples over that of the three around half time."""
    mid = len(series) // 2
    base = statistics.median(series[max(mid - 1, 0) : mid + 2])
    return statistics.median(series[-3:]) / base - 1


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--inflight", type=int, default=128)
    ap.add_argument("--retention", type=float, default=120.0, help="results kept (s)")
    ap.add_argument("--load-every", type=float, default=30.0, help="seconds between loads")
    ap.add_argument("--sample-s", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    load = Load(args.inflight, args.seed)
    with tempfile.TemporaryDirectory(prefix="prorl-soak-") as tmp:
        state = Path(tmp) / "state"
        dirs = [checkpoint(Path(tmp) / "ckpt-a"), checkpoint(Path(tmp) / "ckpt-b")]
        flags = ["--state-dir", str(state), "--retention-s", str(args.retention)]
        flags += ["--sandbox-start", "on_first_use", "--run-workers", str(args.inflight)]
        latency = LatencyModel(ttft_s=0.01, per_token_s=0.002)
        async with ScriptedLLM(policy="finish", latency=latency) as llm:
            async with server(*flags) as (pid, url), RolloutClient(url) as client:
                await client.add_llm_server(llm.address)
                await run(args, load, client, url, pid, state, dirs)


async def run(
    args: argparse.Namespace,
    load: Load,
    client: RolloutClient,
    url: str,
    pid: int,
    state: Path,
    dirs: list[Path],
) -> None:
    workers = [
        *(submitter(client, load) for _ in range(2)),
        canceller(client, load),
        *(poller(client, load, i, 2) for i in range(2)),
        cursor_reader(client, load),
        sse_client(url, load),
        weight_loads(client, load, dirs, args.load_every),
    ]
    tasks = [asyncio.create_task(w) for w in workers]
    samples: list[dict[str, float]] = []
    t0 = time.monotonic()
    print(
        f"{'min':>5} {'rss MiB':>8} {'+kids':>7} {'fds':>5} {'conns':>5} {'thr':>4} "
        f"{'sqlite MB':>9} "
        f"{'done':>8} {'cancel':>7} {'events':>8} {'loads':>5} {'errors':>6}",
        flush=True,
    )
    try:
        while time.monotonic() - t0 < args.minutes * 60:
            await asyncio.sleep(args.sample_s)  # the sampling period
            for task in tasks:
                if task.done():  # a generator that failed: the soak is void
                    raise RuntimeError("a load generator stopped") from task.exception()
            files = [state / f"jobs.sqlite3{s}" for s in ("", "-wal")]
            sample = {
                "min": (time.monotonic() - t0) / 60,
                "rss": own_rss_mib(pid),
                "rss_all": rss_mib(pid),
                "fds": float(open_fds(pid)),
                "conns": float(connection_fds(pid)),
                "threads": float(threads(pid)),
                "sqlite": sum(f.stat().st_size for f in files if f.exists()) / 1e6,
            }
            samples.append(sample)
            c = load.counts
            print(
                f"{sample['min']:5.1f} {sample['rss']:8.1f} {sample['rss_all']:7.1f} "
                f"{sample['fds']:5.0f} {sample['conns']:5.0f} {sample['threads']:4.0f} "
                f"{sample['sqlite']:9.1f} "
                f"{c['done']:8,} {c['cancelled']:7,} {c['events']:8,} {c['loads']:5} "
                f"{c['errors']:6}",
                flush=True,
            )
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
    if len(samples) < 6:
        print("too short a run for the growth figures (6 samples at least)")
        return
    rss, rss_all = growth([s["rss"] for s in samples]), growth([s["rss_all"] for s in samples])
    held = growth([s["fds"] - s["conns"] for s in samples])
    conns = [int(s["conns"]) for s in samples[len(samples) // 2 :]]
    flat = max(rss, held) < 0.05
    print(
        f"\nover the last half: RSS {rss:+.1%} (with children {rss_all:+.1%}), open fds "
        f"other than connections {held:+.1%} (connections {min(conns)}-{max(conns)}); "
        f"flat (< 5%): {'met' if flat else 'MISSED'}; jobs done "
        f"{load.counts['done']:,} in {samples[-1]['min']:.1f} min, "
        f"{load.counts['loads']} weight loads"
    )


if __name__ == "__main__":
    uvloop.run(main())
