"""prorl-async demo: the whole system on one machine, about 40 s on 2 cores.

Starts the rollout server in this process (state in a temporary directory), a scripted LLM
(a TEST DOUBLE that solves tasks by really using the tools, erring at --error-rate) or an
external vLLM/SGLang backend (--llm), submits a mix of math, code and swe tasks through
RolloutClient, long-polls the results, and prints a summary table; all results go to a
JSONL file.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

import uvloop

from prorl_async.demo.policy import DemoPolicy
from prorl_async.demo.runner import DemoOptions, DemoRun, run_demo
from prorl_async.demo.summary import summarize
from prorl_async.demo.tasks import DemoTask, generate_tasks

__all__ = [
    "DemoOptions",
    "DemoPolicy",
    "DemoRun",
    "DemoTask",
    "build_parser",
    "generate_tasks",
    "main",
    "run_demo",
]


def build_parser() -> argparse.ArgumentParser:
    """The ``prorl-async demo`` command line."""
    p = argparse.ArgumentParser(
        prog="prorl-async demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--jobs", type=int, default=40, help="number of rollouts (default 40)")
    p.add_argument("--concurrency", type=int, default=8, help="workers per stage (default 8)")
    p.add_argument(
        "--runtime",
        choices=("auto", "bwrap", "local"),
        default="auto",
        help="sandbox runtime: auto (bwrap where it works, else local), bwrap, or local "
        "(plain processes, no isolation) (default auto; the summary names the one used)",
    )
    p.add_argument("--seed", type=int, default=0, help="task mix and scripted errors (default 0)")
    p.add_argument(
        "--error-rate",
        type=float,
        default=0.25,
        help="share of tasks the script gets wrong (default 0.25)",
    )
    p.add_argument(
        "--timeout", type=float, default=120.0, help="active-time budget per job, s (default 120)"
    )
    p.add_argument(
        "--output",
        type=Path,
        default=Path("demo-results.jsonl"),
        help="JSONL file of every result document (default demo-results.jsonl)",
    )
    p.add_argument(
        "--llm",
        help="external backend URL (http://host:port/v1) instead of the script (default: none, "
        "the scripted LLM)",
    )
    p.add_argument(
        "--api",
        choices=("vllm", "sglang"),
        default="vllm",
        help="protocol of --llm: vllm (/v1/completions) or sglang (/generate) (default vllm)",
    )
    p.add_argument(
        "--tokenizer",
        help="Hugging Face tokenizer directory of the --llm model (default: none; required "
        "with --llm)",
    )
    return p


def _options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> DemoOptions:
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    if args.concurrency < 1:
        parser.error(f"--concurrency must be >= 1, got {args.concurrency}")
    if not 0.0 <= args.error_rate <= 1.0:
        parser.error(f"--error-rate must be within [0, 1], got {args.error_rate}")
    if args.timeout <= 0:
        parser.error(f"--timeout must be > 0, got {args.timeout}")
    if args.llm is not None and args.tokenizer is None:
        parser.error("--llm needs --tokenizer (the model's tokenizer directory)")
    if args.llm is not None and not args.llm.startswith(("http://", "https://")):
        parser.error(f"--llm must be an http(s) URL, got {args.llm!r}")
    return DemoOptions(
        jobs=args.jobs,
        concurrency=args.concurrency,
        runtime=args.runtime,
        seed=args.seed,
        error_rate=args.error_rate,
        output=args.output,
        llm=args.llm,
        api=args.api,
        tokenizer=args.tokenizer,
        timeout_s=args.timeout,
    )


async def _main(opts: DemoOptions, run: DemoRun, terminated: list[bool]) -> None:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None

    def on_sigterm() -> None:
        terminated.append(True)
        task.cancel()

    # SIGINT is the runner's: it cancels this task (everything unwinds), then raises
    # KeyboardInterrupt. SIGTERM gets the same treatment here.
    loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    try:
        await run_demo(opts, run)
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def _header(opts: DemoOptions, run: DemoRun) -> str:
    counts: dict[str, int] = {}
    for task in run.tasks:
        counts[task.kind] = counts.get(task.kind, 0) + 1
    mix = ", ".join(f"{kind} {n}" for kind, n in counts.items())
    llm = f"LLM {opts.llm} ({opts.api})" if opts.llm else "scripted LLM (test double)"
    runtime = run.runtime or opts.runtime
    if opts.runtime == "auto" and run.runtime:
        runtime = f"{run.runtime} (auto)"
    return (
        f"prorl-async demo: {len(run.tasks)} jobs ({mix}); {llm}; runtime {runtime}; "
        f"concurrency {opts.concurrency}; {os.cpu_count()} CPUs"
    )


def _report(opts: DemoOptions, run: DemoRun) -> int:
    out = sys.stdout
    out.write(
        _header(opts, run)
        + "\n\n"
        + summarize(run.results, run.wall_s, [t.kind for t in run.tasks])
        + "\n\n"
    )
    out.write(f"wall time {run.wall_s:.1f} s; {len(run.results)} results in {opts.output}\n")
    if run.skipped:
        out.write(f"skipped: this server has no handler for task(s) {run.skipped}\n")
    failed = [doc for doc in run.results if doc.get("status") == "failed"]
    if failed:
        first = failed[0]
        out.write(f"{len(failed)} job(s) failed; first: {first['job_id']}: {first['error']}\n")
    out.flush()
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``prorl-async demo``; 0 when every job ran (rewards may be 0)."""
    parser = build_parser()
    opts = _options(parser, parser.parse_args(argv))
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        tasks = generate_tasks(opts.jobs, seed=opts.seed, error_rate=opts.error_rate)
    except ValueError as exc:
        parser.error(str(exc))
    run, terminated = DemoRun(tasks), list[bool]()
    try:
        uvloop.run(_main(opts, run, terminated))
    except (KeyboardInterrupt, asyncio.CancelledError):
        sys.stderr.write(
            f"\ninterrupted: {len(run.results)} of {len(tasks)} results written to "
            f"{opts.output}; everything started was stopped\n"
        )
        return 143 if terminated else 130
    return _report(opts, run)
