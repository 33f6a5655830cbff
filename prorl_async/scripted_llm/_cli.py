"""Command line of the scripted LLM test double (``prorl-async scripted-llm``).

Serves until SIGINT or SIGTERM, then exits 0. Prints one line
``scripted-llm listening on http://HOST:PORT/v1`` once it accepts connections.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Sequence

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The command-line flags (the lead's CLI can mount this as a subcommand)."""
    p = argparse.ArgumentParser(
        prog="prorl-async scripted-llm",
        description="Scripted LLM server: a TEST DOUBLE for vLLM/SGLang (token ids in and out).",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True, help="0 picks a free port")
    p.add_argument("--tokenizer", default=None, help="HF tokenizer dir (default: bundled)")
    p.add_argument("--policy", default="finish", help="finish | echo | random_tools")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default="scripted-llm", help="model id served at /v1/models")
    p.add_argument("--legacy-vllm", action="store_true", help="ignore return_token_ids")
    lat = p.add_argument_group("latency model")
    lat.add_argument("--ttft", type=float, default=0.0, help="seconds to first token")
    lat.add_argument("--per-token", type=float, default=0.0, help="seconds per token")
    lat.add_argument("--slowdown", type=float, default=0.0, help="per extra concurrent request")
    lat.add_argument("--capacity", type=int, default=None, help="requests decoded at once")
    flt = p.add_argument_group("fault injection (rates in 0..1)")
    for name in ("error-rate", "hang-rate", "drop-rate", "nan-rate", "missing-rate"):
        flt.add_argument(f"--{name}", type=float, default=0.0)
    return p


async def _serve(args: argparse.Namespace) -> None:
    from prorl_async.scripted_llm.faults import Faults
    from prorl_async.scripted_llm.latency import LatencyModel
    from prorl_async.scripted_llm.server import ScriptedLLM

    latency = LatencyModel(
        ttft_s=args.ttft, per_token_s=args.per_token, slowdown=args.slowdown,
        capacity=args.capacity,
    )  # fmt: skip
    faults = Faults(
        error_rate=args.error_rate, hang_rate=args.hang_rate, drop_rate=args.drop_rate,
        nan_rate=args.nan_rate, missing_rate=args.missing_rate,
    )  # fmt: skip
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with ScriptedLLM(
        policy=args.policy, seed=args.seed, tokenizer=args.tokenizer, latency=latency,
        faults=faults, model=args.model, host=args.host, port=args.port,
        legacy_vllm=args.legacy_vllm,
    ) as llm:  # fmt: skip
        sys.stdout.write(f"scripted-llm listening on {llm.address}\n")
        sys.stdout.flush()
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the scripted LLM until SIGINT/SIGTERM; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        asyncio.run(_serve(args))
    except ValueError as exc:
        sys.stderr.write(f"scripted-llm: {exc}\n")
        return 2
    return 0
