"""Fair share between tenants on one server: a flood does not starve a small run, and
weights set the shares.

1. B alone: B submits ``--small`` sleep jobs at once; its median time to result
   (submit to its cursor reader holding the result).
2. B under a flood: A submits ``--flood`` sleep jobs at once; once A's jobs fill every
   RUN worker, B submits its ``--small``; B's median again, and the ratio to (1).
   Equal weights.
3. Weights 3:1: C (weight 3) and D (weight 1) each submit ``--each`` jobs at once; of
   the first ``--window`` completions (global seq order: both still backlogged) the
   share of each, against 3:1.

Each on a fresh server process (sqlite store) per ``--run-workers`` value.

    python bench/tenants.py [--run-workers 64,256] [--run-s 0.2]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._server import server  # noqa: E402
from prorl_async.client import RolloutClient  # noqa: E402

TOKENS = """
[tenants.a]
token = "token-a"
[tenants.b]
token = "token-b"
[tenants.c]
token = "token-c"
weight = 3
[tenants.d]
token = "token-d"
weight = 1
"""


def _jobs(n: int, run_s: float) -> list[dict[str, Any]]:
    return [{"task": "sleep", "instance": {"run_s": run_s}}] * n


async def _read(c: RolloutClient, after: int, count: int) -> list[dict[str, Any]]:
    """``count`` results after ``after``; each with the wall time it arrived."""
    out: list[dict[str, Any]] = []
    async with asyncio.timeout(600):
        while len(out) < count:
            page = await c.results(after, limit=10_000, wait=5)
            now = time.time()
            out += [{**d, "_arrived": now} for d in page["results"]]
            after = page["next"]
    return out


async def _small_run(url: str, n: int, run_s: float) -> float:
    """B submits ``n`` jobs at once: the median seconds to each result."""
    async with RolloutClient(url, token="token-b") as b:
        start = (await b.status())["last_seq"]
        reading = asyncio.ensure_future(_read(b, start, n))
        t0 = time.time()
        await b.submit_batch(_jobs(n, run_s))
        docs = await reading
    return float(statistics.median(d["_arrived"] - t0 for d in docs))


async def _saturated(c: RolloutClient, workers: int) -> None:
    async with asyncio.timeout(60):
        busy = (await c.status())["active"]["run"]
        while busy < workers:  # server-side state with no event to await
            await asyncio.sleep(0.05)
            busy = (await c.status())["active"]["run"]


async def fairness(workers: int, args: argparse.Namespace, tokens: str) -> dict[str, Any]:
    common = ("--run-workers", str(workers), "--tokens-file", tokens)
    async with server(*common) as (_, url):
        alone = await _small_run(url, args.small, args.run_s)
    async with server(*common) as (_, url):
        async with RolloutClient(url, token="token-a") as a:
            await a.submit_batch(_jobs(args.flood, args.run_s))
            await _saturated(a, workers)  # B comes into a server A keeps full
            flooded = await _small_run(url, args.small, args.run_s)
            left = (await a.status())["tenants"]["a"]["inflight"]
    return {"workers": workers, "alone": alone, "flooded": flooded, "a_left": left}


async def weights(workers: int, args: argparse.Namespace, tokens: str) -> dict[str, Any]:
    async with server("--run-workers", str(workers), "--tokens-file", tokens) as (_, url):
        async with (
            RolloutClient(url, token="token-c") as c,
            RolloutClient(url, token="token-d") as d,
        ):
            await asyncio.gather(
                c.submit_batch(_jobs(args.each, args.run_s)),
                d.submit_batch(_jobs(args.each, args.run_s)),
            )
            docs_c, docs_d = await asyncio.gather(_read(c, 0, args.each), _read(d, 0, args.each))
    order = sorted([(x["seq"], "c") for x in docs_c] + [(x["seq"], "d") for x in docs_d])
    first = Counter(t for _, t in order[: args.window])
    return {"workers": workers, "c": first["c"], "d": first["d"]}


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tokens = Path(tmp) / "tokens.toml"
        tokens.write_text(TOKENS)
        tokens.chmod(0o600)
        counts = [int(w) for w in args.run_workers.split(",")]
        fair = [await fairness(w, args, str(tokens)) for w in counts]
        shares = [await weights(w, args, str(tokens)) for w in counts]
    print(f"\nsleep jobs of {args.run_s:g} s; A floods {args.flood}, B submits {args.small}")
    print(f"{'run workers':>11} {'B alone p50 s':>14} {'B flooded p50 s':>16} {'ratio':>6}")
    for f in fair:
        ratio = f["flooded"] / f["alone"]
        print(f"{f['workers']:11d} {f['alone']:14.3f} {f['flooded']:16.3f} {ratio:6.2f}")
    print(f"\nweights 3:1, {args.each} jobs each; first {args.window} completions")
    print(f"{'run workers':>11} {'C (w3)':>7} {'D (w1)':>7} {'C:D':>6} {'off 3:1':>8}")
    for s in shares:
        ratio = s["c"] / max(s["d"], 1)
        print(f"{s['workers']:11d} {s['c']:7d} {s['d']:7d} {ratio:6.2f} {ratio / 3 - 1:+8.1%}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--run-workers", default="64,256", help="comma-separated RUN worker counts")
    p.add_argument("--run-s", type=float, default=0.2, help="each sleep job's RUN time")
    p.add_argument("--flood", type=int, default=5000)
    p.add_argument("--small", type=int, default=100)
    p.add_argument("--each", type=int, default=3000)
    p.add_argument("--window", type=int, default=2000)
    uvloop.run(main(p.parse_args()))
