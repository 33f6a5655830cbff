"""Run the demo: a server and a scripted LLM in this process, a task mix, results, a summary.

Everything started here is owned by one ``AsyncExitStack`` and torn down in reverse order
(client, server — which cancels unfinished jobs and closes their sandboxes —, scripted LLM),
whether the run ends, fails or is cancelled (Ctrl-C).
"""

from __future__ import annotations

import tempfile
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TextIO

import msgspec

from prorl_async.api.app import run_server
from prorl_async.api.routes import SERVICE
from prorl_async.client import RolloutClient
from prorl_async.config import load_config
from prorl_async.demo.policy import DemoPolicy
from prorl_async.demo.progress import Progress
from prorl_async.demo.tasks import DemoTask, generate_tasks
from prorl_async.scripted_llm import ScriptedLLM

__all__ = ["DemoOptions", "DemoRun", "run_demo"]

_encoder = msgspec.json.Encoder()
_POLL_WAIT_S = 1.0  # short, so the progress clock ticks on a terminal


@dataclass(frozen=True)
class DemoOptions:
    """What ``prorl-async demo`` was asked to do (see ``--help``)."""

    jobs: int = 40
    concurrency: int = 8
    runtime: str = "auto"
    seed: int = 0
    error_rate: float = 0.25
    output: Path = Path("demo-results.jsonl")
    llm: str | None = None
    api: str = "vllm"
    tokenizer: str | None = None
    timeout_s: float = 120.0


@dataclass
class DemoRun:
    """Results as they arrive; ``wall_s`` runs from submission to the last result;
    ``runtime``: the sandbox runtime the server chose (``auto`` resolved)."""

    tasks: list[DemoTask]
    results: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0
    skipped: list[str] = field(default_factory=list)
    runtime: str = ""

    @property
    def failed(self) -> int:
        return sum(1 for doc in self.results if doc.get("status") != "done")


def _config(opts: DemoOptions, state_dir: str) -> Any:
    workers = opts.concurrency
    return load_config(
        overrides={
            "port": 0,
            "state_dir": state_dir,
            "runtime": opts.runtime,
            "init_workers": workers,
            "run_workers": workers,
            "eval_workers": workers,
            "tokenizer": opts.tokenizer,
        },
        env={},
    )


async def _backend(stack: AsyncExitStack, opts: DemoOptions, tasks: list[DemoTask]) -> str:
    if opts.llm is not None:
        return opts.llm
    scripts = {task.key: task.script for task in tasks}
    llm = await stack.enter_async_context(ScriptedLLM(policy=DemoPolicy(scripts)))
    return llm.address


async def run_demo(
    opts: DemoOptions, run: DemoRun | None = None, *, progress_stream: TextIO | None = None
) -> DemoRun:
    """Start everything, submit the task mix, long-poll until all results are in.

    Results are appended to ``opts.output`` (JSONL) as they arrive, so an interrupted run
    keeps what it got; pass ``run`` to see partial results after a cancel.
    """
    if run is None:
        run = DemoRun(generate_tasks(opts.jobs, seed=opts.seed, error_rate=opts.error_rate))
    with tempfile.TemporaryDirectory(prefix="prorl-demo-") as state_dir:
        async with AsyncExitStack() as stack:
            address = await _backend(stack, opts, run.tasks)
            app, url = await stack.enter_async_context(run_server(_config(opts, state_dir)))
            client = await stack.enter_async_context(RolloutClient(url))
            await client.add_llm_server(address, api=opts.api if opts.llm else "vllm")
            service = app[SERVICE]
            if service.shared.runtime is not None:
                run.runtime = service.shared.runtime.name
            known = set(service.registry.names())
            run.skipped = sorted({t.task for t in run.tasks if t.task not in known})
            todo = [t for t in run.tasks if t.task in known]
            with opts.output.open("w", encoding="utf-8") as out:
                bar = Progress(len(todo), progress_stream)
                await _collect(client, todo, run, out, bar, opts.timeout_s)
    return run


async def _collect(
    client: RolloutClient,
    todo: list[DemoTask],
    run: DemoRun,
    out: IO[str],
    bar: Progress,
    timeout_s: float,
) -> None:
    started = time.monotonic()
    bodies = [task.body(timeout_s) for task in todo]
    pending = await client.submit_batch(bodies) if bodies else []
    bar.update(0)
    try:
        while pending:
            answer = await client.poll(pending, wait=_POLL_WAIT_S)
            if answer["unknown"]:
                raise RuntimeError(f"the server forgot jobs {answer['unknown']}")
            for doc in answer["done"]:
                run.results.append(doc)
                out.write(_encoder.encode(doc).decode() + "\n")
            out.flush()
            pending = answer["pending"]
            bar.update(len(run.results), run.failed)
    finally:
        bar.close()
        run.wall_s = time.monotonic() - started
