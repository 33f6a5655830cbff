"""``prorl-async train-demo``: GRPO on CPU through the service (see ``train_demo.run``)."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Coroutine
from dataclasses import replace
from typing import Any, TypeVar

from prorl_async.train_demo.learner_client import LearnerError
from prorl_async.train_demo.procs import RunError
from prorl_async.train_demo.report import plot, summary_table
from prorl_async.train_demo.run import train_demo
from prorl_async.train_demo.settings import MODES, TRAINERS, Mode, Settings
from prorl_async.trainer import TrainerError
from prorl_async.vllm_cpu import EngineEnv

__all__ = ["build_parser", "main"]

T = TypeVar("T")


# Flags that set a ``Settings`` field: (flag, field, what it is). Type and default come
# from the field, so the parser and ``settings`` cannot drift apart.
_FIELDS = (
    ("--out", "out", "output directory"),
    ("--steps", "steps", "optimiser steps a mode"),
    ("--prompts", "prompts_per_step", "prompts (groups) a step"),
    ("--group-size", "group_size", "samples a prompt"),
    ("--sft-steps", "sft_steps", "most supervised warm-start steps"),
    ("--sft-stop-at", "sft_stop_at", "validation greedy pass rate that ends the warm start"),
    ("--sft-lr", "sft_lr", "their learning rate"),
    ("--lr", "lr", "GRPO learning rate"),
    ("--minibatches", "minibatches", "optimiser steps a batch is split into"),
    ("--eval-every", "eval_every", "steps between held-out evaluations"),
    ("--eval-problems", "eval_problems", "held-out problems evaluated, greedy"),
    ("--max-tokens", "max_tokens", "tokens a rollout may generate"),
    ("--seed", "seed", "seed of everything"),
)


def build_parser() -> argparse.ArgumentParser:
    d = Settings()
    p = argparse.ArgumentParser(
        prog="prorl-async train-demo",
        description="Train a tiny Qwen3 by GRPO on CPU: rollouts of the math handler through "
        "a real server and a real vLLM, weights loaded in place after every step.",
    )
    p.add_argument(
        "--mode",
        choices=("async", "sync", "both"),
        default=None,
        help="async: the engine generates while the learner trains (lag 1); sync: batch by "
        "batch (lag 0); both: async then sync from the same warm start (default both; "
        "sync with --trainer trl)",
    )
    p.add_argument(
        "--trainer",
        choices=TRAINERS,
        default="builtin",
        help="builtin: this package's GRPO loop; trl: TRL's GRPOTrainer with the service as "
        "its rollout_func (installs TRL into the engine venv once; default builtin)",
    )
    for flag, name, what in _FIELDS:
        default = getattr(d, name)
        p.add_argument(
            flag, dest=name, type=type(default), default=default, help=f"{what} (default {default})"
        )
    p.add_argument(
        "--trl-generation",
        choices=("service", "trl"),
        default="service",
        help="with --trainer trl: rollouts through the server and vLLM (service), or TRL's "
        "own HF generation on CPU, for comparison (default service)",
    )
    p.add_argument("--no-plot", action="store_true", help="skip curve.png (default: draw it)")
    return p


def settings(args: argparse.Namespace) -> Settings:
    mode: str = args.mode or ("sync" if args.trainer == "trl" else "both")
    modes: tuple[Mode, ...] = MODES if mode == "both" else tuple(m for m in MODES if m == mode)
    fields = {name: getattr(args, name) for _, name, _ in _FIELDS}
    return replace(
        Settings(),
        modes=modes,
        trainer=args.trainer,
        trl_generation=args.trl_generation,
        **fields,
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
