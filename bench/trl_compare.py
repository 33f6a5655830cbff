"""TRL through prorl-async, side by side with TRL alone and with this package's own loop.

Three runs of ``train-demo`` on the same task, policy, warm start (the same seeded warm
start: deterministic on one machine), batch and step count, one after the other on an
idle machine:

- **TRL alone**: TRL's ``GRPOTrainer`` generating with HF ``generate`` on the CPU
  (``use_vllm=False``) and grading locally with the ``math`` handler's grader; the engine
  serves only the held-out evaluations (outside the timed steps);
- **TRL + prorl-async**: the same trainer with ``ServiceRollouts`` as its
  ``rollout_func``, rollouts by a real vLLM through the server, weights loaded in place
  after every step;
- **ours async**: ``train-demo --mode async`` (this package's learner, lag 1).

Per run: steps per minute (wall time less held-out evaluations), held-out greedy pass@1
before and after, generated tokens per second, and the time split.

    python -m bench.trl_compare [--out bench-trl] [--steps N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from prorl_async.train_demo.run import train_demo
from prorl_async.train_demo.settings import Settings

RUNS: dict[str, dict[str, Any]] = {
    "TRL alone (HF generate)": {"trainer": "trl", "modes": ("sync",), "trl_generation": "trl"},
    "TRL + prorl-async": {"trainer": "trl", "modes": ("sync",), "trl_generation": "service"},
    "ours async": {"trainer": "builtin", "modes": ("async",)},
}


def row(name: str, summary: dict[str, Any], metrics: Path) -> dict[str, Any]:
    [figures] = summary["modes"].values()
    lines = [json.loads(x) for x in metrics.read_text().splitlines()]
    tokens = sum(x["tokens"] or 0 for x in lines)
    training_s = 60.0 * figures["steps"] / figures["steps_per_min"]  # wall less evaluations
    return {
        "run": name,
        "steps_per_min": figures["steps_per_min"],
        "initial": figures["initial_pass_at_1"],
        "final": figures["final_pass_at_1"],
        "tokens_per_s": tokens / max(training_s, 1e-9),
        "rollout_s": figures["rollout_s"],
        "train_s": figures["train_s"],
    }


def table(rows: list[dict[str, Any]]) -> str:
    head = "| run | steps/min | held-out pass@1 | tokens/s | rollout s | train s |"
    out = [head, "|---|---|---|---|---|---|"]
    for r in rows:
        out.append(
            f"| {r['run']} | {r['steps_per_min']:.2f} | {r['initial']:.3f} → {r['final']:.3f} "
            f"| {r['tokens_per_s']:.0f} | {r['rollout_s']:.0f} | {r['train_s']:.0f} |"
        )
    return "\n".join(out)


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("bench-trl"))
    ap.add_argument("--steps", type=int, default=Settings().steps)
    ap.add_argument("--only", choices=sorted(RUNS), action="append", help="run only these")
    args = ap.parse_args()
    rows = []
    for i, (name, fields) in enumerate(RUNS.items()):
        if args.only and name not in args.only:
            continue
        s = replace(Settings(), out=args.out / f"run-{i}", steps=args.steps, **fields)
        summary = await train_demo(s, _say)
        rows.append(row(name, summary, s.out / "metrics.jsonl"))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    first = next(r for r in rows if r["run"].startswith("TRL alone"))
    print(
        f"\n{args.steps} steps of {Settings().prompts_per_step} prompts x "
        f"{Settings().group_size} samples each, the same warm start\n"
    )
    print(table(rows))
    for r in rows:
        ratio = r["steps_per_min"] / first["steps_per_min"]
        print(f"  {r['run']}: {ratio:.2f}x TRL alone's steps/min")


if __name__ == "__main__":
    asyncio.run(main())
