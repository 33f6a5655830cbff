"""Draw ``curve.png`` from ``metrics.jsonl`` (run with the engine venv's Python, which has
matplotlib: ``python -m prorl_async.train_demo.plot METRICS SUMMARY OUT``).

Two panels: the sampled reward and the held-out greedy pass@1 against the step, and the
same against wall-clock seconds, each mode in its own colour.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["main"]


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        sys.stderr.write("usage: python -m prorl_async.train_demo.plot METRICS SUMMARY OUT\n")
        return 2
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = _lines(Path(args[0]))
    modes = json.loads(Path(args[1]).read_text())["modes"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for colour, mode in zip(("tab:blue", "tab:orange"), ("async", "sync"), strict=True):
        mine = [x for x in lines if x["mode"] == mode]
        if not mine:
            continue
        who = f"TRL {mode}" if mine[0].get("trainer") == "trl" else mode
        start = {"step": 0, "wall_s": 0.0, "eval_pass_at_1": modes[mode]["initial_pass_at_1"]}
        evals = [start, *(x for x in mine if "eval_pass_at_1" in x)]
        for ax, key in zip(axes, ("step", "wall_s"), strict=True):
            ax.plot(
                [x[key] for x in mine],
                [x["reward_mean"] for x in mine],
                color=colour,
                alpha=0.45,
                label=f"{who}: sampled reward",
            )
            ax.plot(
                [x[key] for x in evals],
                [x["eval_pass_at_1"] for x in evals],
                "o-",
                color=colour,
                label=f"{who}: held-out pass@1 (greedy)",
            )
    axes[0].set_xlabel("optimiser step")
    axes[1].set_xlabel("wall-clock seconds (since the mode started)")
    axes[0].set_ylabel("reward / pass@1")
    axes[0].legend(loc="lower right", fontsize=8)
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.set_ylim(0, 1)
    fig.suptitle("GRPO through prorl-async: tiny Qwen3 on vLLM CPU, math handler, A + B")
    fig.tight_layout()
    fig.savefig(args[2], dpi=110)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
