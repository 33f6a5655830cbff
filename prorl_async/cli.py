"""The ``prorl-async`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from prorl_async.config import ConfigError, load_config

__all__ = ["main"]


def _serve_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="run the rollout server")
    p.add_argument("--host", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 8400; 0 picks a free one)")
    p.add_argument("--port-file", help="write the bound port here once listening")
    p.add_argument("--config", help="TOML file with ServerConfig fields")
    p.add_argument(
        "--token-file",
        help="require 'Authorization: Bearer TOKEN', TOKEN read from this file "
        "(or set PRORL_TOKEN)",
    )
    p.add_argument("--token", help="the token itself (shows in ps: prefer the above)")
    p.add_argument("--init-workers", type=int)
    p.add_argument("--run-workers", type=int)
    p.add_argument("--eval-workers", type=int)
    p.add_argument("--state-dir", help="where the server writes (default: per-user cache dir)")
    p.add_argument("--store", help="job store: sqlite (durable, default) or memory")
    p.add_argument(
        "--on-restart", help="unfinished jobs of a dead server: requeue (default) or fail"
    )
    p.add_argument("--retention-s", type=float, help="seconds results are kept (default 3600)")
    p.add_argument(
        "--reset-state",
        action="store_true",
        default=None,
        help="move an unreadable job database aside (renamed with a timestamp) and start",
    )
    p.add_argument("--tokenizer", help="Hugging Face tokenizer directory (default: bundled demo)")
    p.add_argument("--runtime", help="sandbox runtime: auto|bwrap|apptainer|local")
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--read-timeout-s", type=float, help="headers and body must arrive within (30)")
    p.add_argument("--keepalive-s", type=float, help="close idle keep-alive connections after (75)")
    p.add_argument("--max-connections", type=int, help="open connections at once (10000)")
    p.add_argument("--log-level")
    p.add_argument(
        "--max-sandboxes", type=int, help="live sandboxes at most (default: memory / limit)"
    )
    p.add_argument("--warm-sandboxes", type=int, help="sandboxes kept started ahead (default 0)")
    p.add_argument(
        "--autoscale",
        action="store_true",
        default=None,
        help="set stage workers from load (bounds: [autoscaling] in the config)",
    )


def _serve(args: argparse.Namespace) -> int:
    from prorl_async.api.serve import serve

    try:
        # Every serve flag is a ServerConfig field of the same name (None: not given).
        flags = {k: v for k, v in vars(args).items() if k not in ("command", "config")}
        config = load_config(path=args.config, overrides=flags)
    except ConfigError as exc:
        print(f"prorl-async: {exc}", file=sys.stderr)
        return 2
    return serve(config)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="prorl-async", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    for name, text in (
        ("scripted-llm", "run the scripted LLM test double (vLLM/SGLang protocol)"),
        ("build-image", "build an Apptainer .sif from a template in sif_templates/"),
        ("demo", "run the demo: server + scripted LLM + a task mix, print a summary"),
        ("cluster", "multi-node: backend assignment, Slurm node launcher and bring-up"),
        ("collect", "fill GRPO batches from rollout servers (trainer-side smoke test)"),
        ("vllm-cpu", "a real vLLM on CPU in its own venv: setup, model, serve"),
    ):
        sub.add_parser(name, help=text, add_help=False)
    args, rest = parser.parse_known_args(argv)
    if args.command == "serve":
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        return _serve(args)
    return _delegate(args.command, rest)


def _delegate(command: str, rest: list[str]) -> int:
    import importlib

    module = {
        "scripted-llm": "prorl_async.scripted_llm",
        "build-image": "prorl_async.sandbox.images",
        "demo": "prorl_async.demo",
        "cluster": "prorl_async.cluster._cli",
        "collect": "prorl_async.trainer.collect",
        "vllm-cpu": "prorl_async.vllm_cpu._cli",
    }[command]
    run = importlib.import_module(module).main
    return int(run(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
