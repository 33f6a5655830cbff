"""``prorl-async collect``: the RolloutManager from the shell, to smoke-test a deployment.

Reads jobs from a JSONL file, fills ``--batches`` batches of ``--batch-groups`` groups of
``--group-size`` samples, writes one JSON line per returned group, prints the fill time
and pass rate of each batch, and exits non-zero with a one-line reason on failure.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import msgspec
import uvloop

from prorl_async.trainer.errors import TrainerError
from prorl_async.trainer.filters import FILTERS
from prorl_async.trainer.group import Group
from prorl_async.trainer.manager import RolloutManager

__all__ = ["build_parser", "main", "read_tasks"]

_encoder = msgspec.json.Encoder()


def build_parser() -> argparse.ArgumentParser:
    """The ``prorl-async collect`` command line."""
    p = argparse.ArgumentParser(
        prog="prorl-async collect",
        description="Fill GRPO batches from rollout servers and write the groups as JSONL.",
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--servers", help="comma-separated rollout server URLs")
    where.add_argument("--cluster", help="cluster.json written by the Slurm launcher")
    p.add_argument("--tasks", required=True, help="JSONL file, one /process job per line")
    p.add_argument("--group-size", type=int, required=True, help="samples per prompt (GRPO n)")
    p.add_argument("--batch-groups", type=int, required=True, help="groups per batch")
    p.add_argument("--batches", type=int, default=1, help="batches to fill (default 1)")
    p.add_argument("--output", required=True, help="JSONL file, one returned group per line")
    p.add_argument(
        "--token-file", help="file holding the bearer token (default: $PRORL_TOKEN, else none)"
    )
    p.add_argument(
        "--filter",
        default="nonzero_std",
        choices=sorted(FILTERS),
        help="groups a batch keeps: nonzero_std (drop a group whose rewards are all equal, "
        "DAPO dynamic sampling) or none (keep every group) (default nonzero_std)",
    )
    p.add_argument(
        "--on-batch-full",
        default="carry",
        choices=["carry", "cancel"],
        help="unfinished groups when a batch is full: carry (keep running, count toward the "
        "next batch) or cancel (cancel them on the servers) (default carry)",
    )
    p.add_argument(
        "--max-inflight-groups",
        type=int,
        help="groups submitted and unfinished at once (default: 2 x --batch-groups)",
    )
    p.add_argument(
        "--backends",
        help="comma-separated LLM backend URLs to register first (default: none, the servers "
        "have theirs)",
    )
    p.add_argument(
        "--weight-version", type=int, default=0, help="version of --backends (default 0)"
    )
    p.add_argument(
        "--stall-timeout",
        type=float,
        default=600.0,
        help="seconds without a result before stopping with an error that says what it "
        "waited for (default 600)",
    )
    p.add_argument(
        "--sample-deadline",
        type=float,
        default=3600.0,
        help="seconds a sample may stay unanswered after submission; then its group is "
        "dropped and its jobs cancelled (default 3600)",
    )
    return p


def read_tasks(path: Path) -> list[dict[str, Any]]:
    """Jobs from a JSONL file; a bad line raises ``ValueError`` naming its number."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ValueError(f"--tasks {path}: {exc.strerror or exc}") from None
    jobs = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            job = msgspec.json.decode(line)
        except msgspec.DecodeError as exc:
            raise ValueError(f"--tasks {path}:{number}: {exc}") from None
        if not isinstance(job, dict):
            raise ValueError(f"--tasks {path}:{number}: a job must be a JSON object")
        jobs.append(job)
    if not jobs:
        raise ValueError(f"--tasks {path}: no jobs in the file")
    return jobs


def _token(args: argparse.Namespace) -> str | None:
    if args.token_file:
        try:
            return Path(args.token_file).read_text().strip() or None
        except OSError as exc:
            raise ValueError(f"--token-file {args.token_file}: {exc.strerror or exc}") from None
    return os.environ.get("PRORL_TOKEN") or None


def _manager(args: argparse.Namespace, jobs: list[dict[str, Any]]) -> RolloutManager:
    servers = [s for s in args.servers.split(",") if s] if args.servers else None
    return RolloutManager(
        servers=servers,
        cluster=args.cluster,
        prompts=jobs,
        group_size=args.group_size,
        batch_groups=args.batch_groups,
        max_inflight_groups=args.max_inflight_groups,
        group_filter=args.filter,
        on_batch_full=args.on_batch_full,
        max_version_lag=None,
        token=_token(args),
        stall_timeout_s=args.stall_timeout,
        sample_deadline_s=args.sample_deadline,
    )


def _line(batch: int, group: Group) -> bytes:
    record = {
        "batch": batch,
        "prompt_uid": group.prompt_uid,
        "rewards": group.rewards,
        "min_weight_version": group.min_weight_version,
        "max_weight_version": group.max_weight_version,
        "attempts": group.attempts,
        "job": group.job,
        "results": group.results,
    }
    return _encoder.encode(record) + b"\n"


async def _collect(args: argparse.Namespace, manager: RolloutManager, out: IO[bytes]) -> None:
    async with manager as m:
        if args.backends:
            backends = [b for b in args.backends.split(",") if b]
            await m.set_weights(version=args.weight_version, backends=backends)
        for i in range(1, args.batches + 1):
            start = time.monotonic()
            batch = await m.next_batch()
            for group in batch:
                out.write(_line(i, group))
            out.flush()
            rate = m.metrics()["pass_rate"]
            shown = "-" if rate is None else f"{rate:.0%}"
            _say(
                f"batch {i}/{args.batches}: {len(batch)} groups in "
                f"{time.monotonic() - start:.2f} s, pass rate {shown}"
            )
        metrics = m.metrics()
    groups = metrics["groups"]
    _say(
        f"done: {groups['returned']} groups returned, {groups['filtered']} filtered, "
        f"{groups['failed']} failed, retries {metrics['retries'] or 0}"
    )


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``prorl-async collect``; 0 when every batch was filled."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        if min(args.group_size, args.batch_groups, args.batches) < 1:
            raise ValueError("--group-size, --batch-groups and --batches must be >= 1")
        manager = _manager(args, read_tasks(Path(args.tasks)))
    except ValueError as exc:
        parser.error(str(exc))
    try:
        with open(args.output, "wb") as out:
            uvloop.run(_collect(args, manager, out))
    except (TrainerError, OSError, ValueError) as exc:
        sys.stderr.write(f"prorl-async collect: {exc}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("prorl-async collect: interrupted; jobs in flight were cancelled\n")
        return 130
    return 0
