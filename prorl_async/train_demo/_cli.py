"""``prorl-async train-demo``: GRPO on CPU through the service (see ``train_demo.run``)."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Coroutine
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from prorl_async.train_demo.learner_client import LearnerError
from prorl_async.train_demo.procs import RunError
from prorl_async.train_demo.report import plot, summary_table
from prorl_async.train_demo.run import train_demo
from prorl_async.train_demo.settings import MODES, Mode, Settings
from prorl_async.trainer import TrainerError
from prorl_async.vllm_cpu import EngineEnv

__all__ = ["build_parser", "main"]

T = TypeVar("T")


def build_parser() -> argparse.ArgumentParser:
    d = Settings()
    p = argparse.ArgumentParser(
        prog="prorl-async train-demo",
        description="Train a tiny Qwen3 by GRPO on CPU: rollouts of the math handler through "
        "a real server and a real vLLM, weights loaded in place after every step.",
    )
    add = p.add_argument
    add(
        "--mode",
        choices=("async", "sync", "both"),
        default="both",
        help="async: the engine generates while the learner trains (lag 1); sync: batch by "
        "batch (lag 0); both: async then sync from the same warm start (default both)",
    )
    add("--out", type=Path, default=d.out, help=f"output directory (default {d.out})")
    add("--steps", type=int, default=d.steps, help=f"optimiser steps a mode (default {d.steps})")
    add(
        "--prompts",
        type=int,
        default=d.prompts_per_step,
        help=f"prompts (groups) a step (default {d.prompts_per_step})",
    )
    add(
        "--group-size",
        type=int,
        default=d.group_size,
        help=f"samples a prompt (default {d.group_size})",
    )
    add(
        "--sft-steps",
        type=int,
        default=d.sft_steps,
        help=f"supervised warm-start steps (default {d.sft_steps})",
    )
    add(
        "--sft-lr", type=float, default=d.sft_lr, help=f"their learning rate (default {d.sft_lr:g})"
    )
    add("--lr", type=float, default=d.lr, help=f"GRPO learning rate (default {d.lr:g})")
    add(
        "--minibatches",
        type=int,
        default=d.minibatches,
        help=f"optimiser steps a batch is split into (default {d.minibatches})",
    )
    add(
        "--eval-every",
        type=int,
        default=d.eval_every,
        help=f"steps between held-out evaluations (default {d.eval_every})",
    )
    add(
        "--eval-problems",
        type=int,
        default=d.eval_problems,
        help=f"held-out problems evaluated, greedy (default {d.eval_problems})",
    )
    add(
        "--max-tokens",
        type=int,
        default=d.max_tokens,
        help=f"tokens a rollout may generate (default {d.max_tokens})",
    )
    add("--seed", type=int, default=d.seed, help=f"seed of everything (default {d.seed})")
    add("--no-plot", action="store_true", help="skip curve.png (default: draw it)")
    return p


def settings(args: argparse.Namespace) -> Settings:
    modes: tuple[Mode, ...] = MODES if args.mode == "both" else (args.mode,)
    return replace(
        Settings(),
        out=args.out,
        modes=modes,
        steps=args.steps,
        prompts_per_step=args.prompts,
        group_size=args.group_size,
        sft_steps=args.sft_steps,
        eval_every=args.eval_every,
        eval_problems=args.eval_problems,
        max_tokens=args.max_tokens,
        lr=args.lr,
        minibatches=args.minibatches,
        sft_lr=args.sft_lr,
        seed=args.seed,
    )


async def _until_signalled(run: Coroutine[Any, Any, T]) -> T:
    """``run``, cancelled on SIGTERM or SIGINT: it unwinds, ending the learner, the engine
    and the server it started (a plain SIGTERM would leave them running)."""
    task = asyncio.ensure_future(run)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    try:
        return await task
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        s = settings(args)
        s.check()
    except ValueError as exc:
        _say(f"train-demo: {exc}")
        return 2
    try:
        summary = asyncio.run(_until_signalled(train_demo(s, _say)))
    except (RunError, TimeoutError, LearnerError, TrainerError) as exc:
        _say(f"train-demo: {exc or 'a step did not finish within its bound'}")
        return 1
    except asyncio.CancelledError:
        _say("train-demo: stopped by a signal; every process it started has ended")
        return 130
    print(summary_table(summary))  # noqa: T201 - the command's output
    if not args.no_plot:
        out = s.out
        plot(
            EngineEnv(),
            out / "metrics.jsonl",
            out / "summary.json",
            out / "curve.png",
            out / "logs" / "plot.log",
        )
    return 0
