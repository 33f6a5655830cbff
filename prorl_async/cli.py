"""The prorl-async command line: one subcommand per tool (serve, demo, scripted-llm, ...)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from prorl_async.config import ConfigError, ServerConfig, load_config

__all__ = ["DELEGATED", "RUNTIMES", "build_parser", "main"]

# Fixed sets the server accepts (config.py checks the same, whatever the source).
RUNTIMES = ("auto", "bwrap", "apptainer", "local")
STORES = ("sqlite", "memory")
ON_RESTART = ("requeue", "fail")
SANDBOX_STARTS = ("eager", "on_first_use")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")

# Subcommands with a parser of their own: name -> (module with main(argv), one-line help).
DELEGATED = {
    "scripted-llm": (
        "prorl_async.scripted_llm",
        "run the scripted LLM test double (vLLM/SGLang protocol)",
    ),
    "build-image": (
        "prorl_async.sandbox.images",
        "build an Apptainer .sif from a template in sif_templates/",
    ),
    "demo": (
        "prorl_async.demo",
        "run the demo: server + scripted LLM + a task mix, print a summary",
    ),
    "cluster": (
        "prorl_async.cluster._cli",
        "multi-node: backend assignment, Slurm node launcher and bring-up",
    ),
    "collect": (
        "prorl_async.trainer.collect",
        "fill GRPO batches from rollout servers (trainer-side smoke test)",
    ),
    "train-demo": (
        "prorl_async.train_demo._cli",
        "train a tiny policy by GRPO on CPU through the service (async vs sync)",
    ),
    "vllm-cpu": (
        "prorl_async.vllm_cpu._cli",
        "a real vLLM on CPU in its own venv: setup, model, serve",
    ),
}

_SERVE_DESCRIPTION = (
    "Run the rollout server until SIGTERM or Ctrl-C. Each flag overrides its PRORL_<FIELD> "
    "environment variable, which overrides --config; the defaults shown are the built-in "
    "ones (every field: docs/config.md)."
)


def _serve_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="run the rollout server", description=_SERVE_DESCRIPTION)
    d = ServerConfig()
    _listen_flags(p.add_argument_group("listening and auth"), d)
    _pipeline_flags(p.add_argument_group("pipeline and state"), d)
    _llm_sandbox_flags(p.add_argument_group("LLM and sandboxes"), d)


def _listen_flags(g: argparse._ArgumentGroup, d: ServerConfig) -> None:
    add = g.add_argument
    add("--config", metavar="FILE", help="TOML file of ServerConfig fields (default: none)")
    add("--host", metavar="ADDR", help=f"bind address (default {d.host})")
    add("--port", type=int, help=f"port; 0 picks a free one (default {d.port})")
    add(
        "--port-file",
        metavar="FILE",
        help="write the bound port here once listening (default: none)",
    )
    add(
        "--token-file",
        metavar="FILE",
        help="require 'Authorization: Bearer TOKEN', TOKEN "
        "read from this file (default: $PRORL_TOKEN if set, else no token)",
    )
    add("--token", help="the token itself; shows in ps, prefer --token-file (default: none)")
    add(
        "--tokens-file",
        metavar="FILE",
        help="TOML file (mode 600) of [tenants.NAME] tables: "
        "token, max_inflight, weight, admin (default: none)",
    )
    add(
        "--metrics-token-file",
        metavar="FILE",
        help="the token Prometheus scrapes /metrics with; where tokens are set, /metrics "
        "answers it or an admin's token only (default: none)",
    )
    add(
        "--read-timeout-s",
        type=float,
        metavar="S",
        help="a request's headers and body must "
        f"arrive within this many seconds (default {d.read_timeout_s:g})",
    )
    add(
        "--keepalive-s",
        type=float,
        metavar="S",
        help="close idle keep-alive connections "
        f"after this many seconds (default {d.keepalive_s:g})",
    )
    add(
        "--max-connections",
        type=int,
        metavar="N",
        help=f"open connections at once (default {d.max_connections})",
    )
    add(
        "--log-level",
        type=str.lower,
        choices=LOG_LEVELS,
        help=f"log messages of this level and above: {', '.join(LOG_LEVELS)} "
        f"(default {d.log_level})",
    )


def _pipeline_flags(g: argparse._ArgumentGroup, d: ServerConfig) -> None:
    add = g.add_argument
    for stage, what in (
        ("init", "start sandboxes and tools"),
        ("run", "run agent loops"),
        ("eval", "score"),
    ):
        default = getattr(d, f"{stage}_workers")
        add(
            f"--{stage}-workers",
            type=int,
            metavar="N",
            help=f"{stage.upper()} stage workers: jobs that {what} at once (default {default})",
        )
    add(
        "--autoscale",
        action="store_true",
        default=None,
        help="set stage workers from load; bounds in [autoscaling] of --config (default: off)",
    )
    add("--state-dir", metavar="DIR", help=f"where the server writes (default {d.state_dir})")
    add(
        "--store",
        choices=STORES,
        help="job store: sqlite (durable, in --state-dir) or "
        f"memory (lost on exit) (default {d.store})",
    )
    add(
        "--on-restart",
        choices=ON_RESTART,
        help="jobs a dead server accepted and never "
        f"finished: requeue (run them again) or fail them (default {d.on_restart})",
    )
    add(
        "--retention-s",
        type=float,
        metavar="S",
        help=f"seconds finished results are kept (default {d.retention_s:g})",
    )
    add(
        "--commit-timeout-s",
        type=float,
        metavar="S",
        help="seconds without a commit of the job store's writer after which submits "
        f"answer 503 + Retry-After instead of waiting (default {d.commit_timeout_s:g})",
    )
    add(
        "--reset-state",
        action="store_true",
        default=None,
        help="move an unreadable job "
        "database aside (renamed with a timestamp) and start (default: refuse to start, "
        "naming the file)",
    )


def _llm_sandbox_flags(g: argparse._ArgumentGroup, d: ServerConfig) -> None:
    add = g.add_argument
    add(
        "--tokenizer",
        metavar="DIR",
        help="Hugging Face tokenizer directory of the model (default: the bundled demo vocabulary)",
    )
    add(
        "--max-model-len",
        type=int,
        metavar="N",
        help="context tokens a job may use; an "
        f"engine's own window caps it further (default {d.max_model_len})",
    )
    add(
        "--runtime",
        choices=RUNTIMES,
        help="sandbox runtime: auto (bwrap where it works, "
        "else local), bwrap, apptainer (.sif images) or local (plain processes, no "
        f"isolation) (default {d.runtime})",
    )
    add(
        "--max-sandboxes",
        type=int,
        metavar="N",
        help="live sandboxes at most (default: "
        "physical memory / per-sandbox memory limit, at least 8)",
    )
    add(
        "--warm-sandboxes",
        type=int,
        metavar="N",
        help=f"sandboxes kept started ahead (default {d.warm_sandboxes})",
    )
    add(
        "--sandbox-start",
        choices=SANDBOX_STARTS,
        help="when a task's sandbox is launched: eager (in INIT, as the "
        "task asks for it) or on_first_use (when the task or the model first uses it; "
        f"never, for a rollout that calls no tool) (default {d.sandbox_start})",
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


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser: ``serve`` in full, the other subcommands as names (each
    parses its own arguments, see ``DELEGATED``)."""
    parser = argparse.ArgumentParser(prog="prorl-async", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    for name, (_, text) in DELEGATED.items():
        sub.add_parser(name, help=text, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "serve":
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        return _serve(args)
    return _delegate(args.command, rest)


def _delegate(command: str, rest: list[str]) -> int:
    import importlib

    run = importlib.import_module(DELEGATED[command][0]).main
    return int(run(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
