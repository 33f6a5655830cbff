"""The learning itself, measured: ``train-demo --mode both`` on the defaults, ``--runs``
times, and what each run gives side by side.

Per run: held-out greedy pass@1 before and after each mode, its gain, both modes' steps
per minute (wall time less evaluations), the async/sync ratio, and the bound overlap can
give at most, ``(G + T) / max(G, T)``, from the sync run's own split of rollout time G
and learner time T; async's share of that bound. The targets (issue 40): a gain >= 0.25
ending >= 0.6; async >= 1.3x sync's steps per minute, or >= 90% of the bound where the
bound is below 1.4x; final pass@1 of the two modes within 0.1.

    python -m bench.train_demo [--runs 3] [--out bench-train-demo] [--steps N]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from prorl_async.train_demo.report import summary_table
from prorl_async.train_demo.run import train_demo
from prorl_async.train_demo.settings import Settings


def figures(summary: dict[str, Any]) -> dict[str, float]:
    a, s = summary["modes"]["async"], summary["modes"]["sync"]
    g, t = s["rollout_s"], s["train_s"]
    bound = (g + t) / max(g, t)
    ratio = a["steps_per_min"] / s["steps_per_min"]
    return {
        "async_gain": a["final_pass_at_1"] - a["initial_pass_at_1"],
        "sync_gain": s["final_pass_at_1"] - s["initial_pass_at_1"],
        "async_final": a["final_pass_at_1"],
        "sync_final": s["final_pass_at_1"],
        "speedup": ratio,
        "bound": bound,
        "share_of_bound": ratio / bound,
    }


def verdict(f: dict[str, float]) -> list[str]:
    def met(ok: bool) -> str:
        return "met" if ok else "MISSED"

    speed_ok = f["speedup"] >= 1.3 or (f["bound"] < 1.4 and f["share_of_bound"] >= 0.9)
    return [
        f"async gain {f['async_gain']:+.3f} to {f['async_final']:.3f} "
        f"(>= +0.25 ending >= 0.6): {met(f['async_gain'] >= 0.25 and f['async_final'] >= 0.6)}",
        f"async {f['speedup']:.2f}x sync's steps/min; bound {f['bound']:.2f}x, "
        f"{100 * f['share_of_bound']:.0f}% of it: {met(speed_ok)}",
        f"final pass@1 async {f['async_final']:.3f} vs sync {f['sync_final']:.3f} "
        f"(within 0.1): {met(abs(f['async_final'] - f['sync_final']) <= 0.1)}",
    ]


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("bench-train-demo"))
    ap.add_argument("--steps", type=int, default=Settings().steps)
    args = ap.parse_args()
    for run in range(1, args.runs + 1):
        s = replace(Settings(), out=args.out / f"run-{run}", steps=args.steps)
        t0 = time.monotonic()
        summary = await train_demo(s, _say)
        print(f"\nrun {run}: {time.monotonic() - t0:.0f} s in all ({s.out})")
        print(summary_table(summary))
        for line in verdict(figures(summary)):
            print("  " + line)


if __name__ == "__main__":
    asyncio.run(main())
