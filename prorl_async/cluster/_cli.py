"""``prorl-async cluster``: the assignment rule, and the pieces the Slurm launcher runs.

- ``assign [--file F]``: a cluster document (JSON: ``servers`` with ``url``/``node``,
  ``llms`` with ``address``/``node``; stdin by default) in, the same document with
  ``assignment`` filled in out (stdout).
- ``node --role server|llm``: run this node's rollout servers or LLM servers.
- ``bringup``: wait until all are healthy, assign, register, write ``cluster.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from prorl_async.cluster import _slurm
from prorl_async.cluster.assign import assign
from prorl_async.cluster.bringup import BringUp, StartupError, bring_up, token_from_env
from prorl_async.cluster.node import NodeChildren, llm_children, node_gpus, server_children
from prorl_async.cluster.spec import dump_spec, load_spec

__all__ = ["build_parser", "main"]


_DESCRIPTION = """\
The assignment rule, and the pieces the Slurm launcher (deploy/slurm) runs:

  assign     a cluster document (JSON: servers with url/node, llms with address/node) in,
             the same document with the assignment filled in out (stdout)
  node       run this node's rollout servers or LLM servers (a Slurm step)
  bringup    wait until all are healthy, assign, register, write cluster.json
"""


def build_parser() -> argparse.ArgumentParser:
    """The ``cluster`` subcommands and their flags."""
    p = argparse.ArgumentParser(
        prog="prorl-async cluster",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser("assign", help="assign LLM backends to rollout servers (JSON in/out)")
    a.add_argument("--file", help="cluster document (default: stdin)")
    _node_parser(sub.add_parser("node", help="run this node's servers or LLMs (Slurm step)"))
    _bringup_parser(sub.add_parser("bringup", help="wait healthy, assign, register, write"))
    return p


def _node_parser(n: argparse.ArgumentParser) -> None:
    env = os.environ.get
    n.add_argument(
        "--role",
        choices=("server", "llm"),
        required=True,
        help="server: rollout servers (prorl-async serve); llm: LLM servers started from --llm-cmd",
    )
    n.add_argument(
        "--run-dir",
        type=Path,
        required=True,
        help="shared directory for addresses, logs and cluster.json",
    )
    n.add_argument("--count", type=int, required=True, help="processes on this node")
    n.add_argument(
        "--node",
        default=env("SLURMD_NODENAME"),
        help="this node's Slurm name (default $SLURMD_NODENAME)",
    )
    n.add_argument("--addr", help="bind address (default: the node's Slurm NodeAddr)")
    n.add_argument(
        "--state-root",
        type=Path,
        help="node-local dir for server state dirs (required with --role server; default: none)",
    )
    n.add_argument(
        "--server-args",
        default=env("PRORL_SERVER_ARGS", ""),
        help="extra prorl-async serve flags (default $PRORL_SERVER_ARGS)",
    )
    n.add_argument(
        "--llm-cmd",
        default=env("PRORL_LLM_CMD", ""),
        help="LLM server command line with {host} {port} {gpu} placeholders "
        "(required with --role llm; default $PRORL_LLM_CMD)",
    )
    n.add_argument(
        "--grace-s",
        type=float,
        default=30.0,
        help="seconds from SIGTERM to SIGKILL at stop (default 30)",
    )


def _bringup_parser(b: argparse.ArgumentParser) -> None:
    b.add_argument(
        "--run-dir",
        type=Path,
        required=True,
        help="shared directory the node steps write their addresses to",
    )
    b.add_argument("--servers", type=int, required=True, help="rollout servers expected")
    b.add_argument("--llms", type=int, required=True, help="LLM servers expected")
    b.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="seconds until all must be healthy (default 600)",
    )
    b.add_argument(
        "--weight-version",
        default="0",
        help="weight version the LLMs are registered with (default 0)",
    )
    b.add_argument(
        "--api",
        choices=("vllm", "sglang"),
        default="vllm",
        help="LLM servers speak vllm (/v1) or sglang (default vllm)",
    )
    b.add_argument(
        "--job-id",
        default=os.environ.get("SLURM_JOB_ID", ""),
        help="Slurm job id written to cluster.json (default $SLURM_JOB_ID)",
    )
    b.add_argument(
        "--watch-pid",
        type=int,
        action="append",
        default=[],
        help="fail if this process (a launcher step) ends first; repeatable (default: none)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``cluster`` subcommand; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "assign":
            return _assign(args)
        if args.command == "node":
            return _node(args)
        return _bringup(args)
    except (ValueError, _slurm.SlurmError, StartupError, OSError) as exc:
        sys.stderr.write(f"prorl-async cluster {args.command}: {exc}\n")
        return 1


def _assign(args: argparse.Namespace) -> int:
    raw = Path(args.file).read_bytes() if args.file else sys.stdin.buffer.read()
    spec = load_spec(raw, source=args.file or "stdin")
    spec.assignment = assign(spec.servers, spec.llms)
    sys.stdout.buffer.write(dump_spec(spec))
    return 0


def _node(args: argparse.Namespace) -> int:
    if not args.node:
        raise ValueError("--node not given and $SLURMD_NODENAME not set")
    if args.count < 0:
        raise ValueError(f"--count must be >= 0, got {args.count}")
    addr = args.addr or _slurm.node_addr(args.node)
    if args.role == "server":
        if args.state_root is None:
            raise ValueError("--state-root is required for --role server")
        children = server_children(
            node=args.node,
            addr=addr,
            count=args.count,
            run_dir=args.run_dir,
            state_root=args.state_root,
            extra_args=args.server_args,
        )
    else:
        if not args.llm_cmd:
            raise ValueError("--llm-cmd (or PRORL_LLM_CMD) is empty")
        children = llm_children(
            node=args.node,
            addr=addr,
            count=args.count,
            run_dir=args.run_dir,
            template=args.llm_cmd,
            gpus=node_gpus(os.environ),
        )
    return asyncio.run(_run_node(NodeChildren(children, args.run_dir, args.grace_s)))


def _say(message: str) -> None:
    now = time.time()  # one reading: seconds and milliseconds of the same instant
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
    sys.stdout.write(f"{stamp}.{int(now * 1000) % 1000:03d} {message}\n")
    sys.stdout.flush()


async def _run_node(children: NodeChildren) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with children:
        await children.start()
        _say(f"started {len(children.names)}: {' '.join(children.names)}")
        watch = asyncio.ensure_future(children.run())
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({watch, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            await asyncio.wait({stopped})  # reaped; wait() does not raise its cancellation
        if watch.done():
            _say("every process exited on its own")
            return watch.result()
        _say("signal received: SIGTERM to every process")
        await children.aclose()
        _say("all stopped")
        return await watch


def _bringup(args: argparse.Namespace) -> int:
    raw = args.weight_version
    version: int | str = int(raw) if raw.isdigit() else raw
    cfg = BringUp(
        run_dir=args.run_dir,
        servers=args.servers,
        llms=args.llms,
        timeout_s=args.timeout,
        weight_version=version,
        api=args.api,
        slurm_job_id=args.job_id,
        watch_pids=tuple(args.watch_pid),
        token=token_from_env(),
    )
    spec = asyncio.run(bring_up(cfg))
    sys.stdout.write(
        f"cluster up: {len(spec.servers)} servers, {len(spec.llms)} LLMs, "
        f"{cfg.run_dir / 'cluster.json'}\n"
    )
    return 0
