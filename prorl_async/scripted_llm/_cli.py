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

from prorl_async.scripted_llm.policies import POLICIES

__all__ = ["build_parser", "main"]


_POLICY_HELP = (
    "what the model says: finish (calls the finish tool at once with the answer 42), echo "
    "(repeats the last user message back), random_tools (seeded random bash, python and "
    "editor calls, about 15%% of them malformed, then finish) (default finish)"
)
_FAULT_HELP = {
    "error-rate": "share of generation requests answered HTTP 503",
    "hang-rate": "share of requests never answered (until the server stops)",
    "drop-rate": "share of requests whose connection is closed without an answer",
    "nan-rate": "share of token logprobs replaced by NaN",
    "missing-rate": "share of token logprobs replaced by null",
}


def build_parser() -> argparse.ArgumentParser:
    """The command-line flags (the lead's CLI can mount this as a subcommand)."""
    p = argparse.ArgumentParser(
        prog="prorl-async scripted-llm",
        description="Scripted LLM server: a TEST DOUBLE for vLLM/SGLang (token ids in and out).",
    )
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, required=True, help="port; 0 picks a free one")
    p.add_argument(
        "--tokenizer",
        default=None,
        help="Hugging Face tokenizer directory (default: the bundled demo vocabulary)",
    )
    p.add_argument("--policy", default="finish", choices=sorted(POLICIES), help=_POLICY_HELP)
    p.add_argument("--seed", type=int, default=0, help="seed of random_tools (default 0)")
    p.add_argument(
        "--model",
        default="scripted-llm",
        help="model id served at /v1/models (default scripted-llm)",
    )
    p.add_argument(
        "--legacy-vllm",
        action="store_true",
        help="behave like vLLM before 0.10.2: ignore return_token_ids (default: off)",
    )
    lat = p.add_argument_group("latency model")
    lat.add_argument("--ttft", type=float, default=0.0, help="seconds to first token (default 0)")
    lat.add_argument("--per-token", type=float, default=0.0, help="seconds per token (default 0)")
    lat.add_argument(
        "--slowdown",
        type=float,
        default=0.0,
        help="with n requests decoding at once each token takes 1 + SLOWDOWN * (n - 1) "
        "times as long (default 0)",
    )
    lat.add_argument(
        "--capacity",
        type=int,
        default=None,
        help="requests decoded at once; more wait (default: unlimited)",
    )
    lat.add_argument(
        "--load-s",
        type=float,
        default=0.0,
        help="seconds a weight load (reload_weights, update_weights_from_disk) takes (default 0)",
    )
    flt = p.add_argument_group("fault injection (rates in 0..1)")
    for name, text in _FAULT_HELP.items():
        flt.add_argument(f"--{name}", type=float, default=0.0, help=f"{text} (default 0)")
    return p


async def _serve(args: argparse.Namespace) -> None:
    from prorl_async.scripted_llm.faults import Faults
    from prorl_async.scripted_llm.latency import LatencyModel
    from prorl_async.scripted_llm.server import ScriptedLLM

    latency = LatencyModel(
        ttft_s=args.ttft,
        per_token_s=args.per_token,
        slowdown=args.slowdown,
        capacity=args.capacity,
    )
    faults = Faults(
        error_rate=args.error_rate,
        hang_rate=args.hang_rate,
        drop_rate=args.drop_rate,
        nan_rate=args.nan_rate,
        missing_rate=args.missing_rate,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with ScriptedLLM(
        policy=args.policy,
        seed=args.seed,
        tokenizer=args.tokenizer,
        latency=latency,
        faults=faults,
        model=args.model,
        host=args.host,
        port=args.port,
        legacy_vllm=args.legacy_vllm,
        load_s=args.load_s,
    ) as llm:
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
