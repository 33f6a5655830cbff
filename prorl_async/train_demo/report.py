"""What a run tells a person: the summary table, and ``curve.png`` (drawn by matplotlib
in the engine's venv: the project's own install has no plotting library)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from prorl_async.vllm_cpu import EngineEnv

__all__ = ["plot", "summary_table"]

_COLUMNS = (
    ("mode", "{}"),
    ("steps", "{}"),
    ("wall_s", "{:.0f}"),
    ("steps_per_min", "{:.2f}"),
    ("rollout_s", "{:.0f}"),
    ("train_s", "{:.0f}"),
    ("initial_pass_at_1", "{:.3f}"),
    ("final_pass_at_1", "{:.3f}"),
)


def summary_table(summary: dict[str, Any]) -> str:
    """The modes side by side, one row each (a markdown table)."""
    names = [name for name, _ in _COLUMNS]
    rows = [
        [fmt.format(mode if name == "mode" else figures[name]) for name, fmt in _COLUMNS]
        for mode, figures in summary["modes"].items()
    ]
    lines = ["| " + " | ".join(names) + " |", "|" + "---|" * len(names)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def plot(env: EngineEnv, metrics: Path, summary: Path, out: Path, log: Path) -> None:
    """Draw ``out`` from ``metrics`` and ``summary`` (installs matplotlib into the engine
    venv the first time). Raises ``RuntimeError`` naming the log if it cannot."""
    python = str(env.python)
    with open(log, "ab") as f:
        has = subprocess.run([python, "-c", "import matplotlib"], stdout=f, stderr=f, check=False)
        if has.returncode != 0:
            pip = [python, "-m", "pip", "install", "-q", "matplotlib"]
            subprocess.run(pip, stdout=f, stderr=f, check=False, timeout=600)
        argv = [python, "-m", "prorl_async.train_demo.plot", str(metrics), str(summary), str(out)]
        done = subprocess.run(argv, stdout=f, stderr=f, env=env.process_env(), check=False)
    if done.returncode != 0:
        raise RuntimeError(f"curve.png was not drawn; see {log}")
