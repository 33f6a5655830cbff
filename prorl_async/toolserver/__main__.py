"""``python -m prorl_async.toolserver --socket PATH [--workspace DIR] [--output-cap N]``."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import uvloop

from prorl_async.toolserver.server import ToolServer


def _host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"--tcp expects HOST:PORT, got {value!r}")
    return host, int(port)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m prorl_async.toolserver", description=__doc__)
    parser.add_argument("--socket", required=True, help="Unix socket path to listen on")
    parser.add_argument("--workspace", default=".", help="working directory of the tools")
    parser.add_argument("--output-cap", type=int, default=16_000, help="max observation chars")
    parser.add_argument("--tcp", type=_host_port, help="also listen on HOST:PORT (benchmarks)")
    return parser


async def _serve(args: argparse.Namespace) -> None:
    workspace = Path(args.workspace)
    async with ToolServer(workspace=workspace, output_cap=args.output_cap) as server:
        await server.serve(args.socket, tcp=args.tcp)


def main(argv: list[str] | None = None) -> int:
    """Run the tool server until SIGTERM/SIGINT or a ``shutdown`` request."""
    args = _parser().parse_args(argv)
    if not Path(args.workspace).is_dir():
        sys.stderr.write(f"--workspace {args.workspace!r} is not a directory\n")
        return 2
    if args.output_cap < 100:
        sys.stderr.write(f"--output-cap must be at least 100, got {args.output_cap}\n")
        return 2
    logging.basicConfig(level=logging.INFO, format="toolserver %(levelname)s %(message)s")
    uvloop.run(_serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
