"""All 164 HumanEval canonical solutions through the ``code`` handler's EVAL in real bwrap
sandboxes (real public data); a broken variant of each must fail.

The per-problem work is exactly the handler's: ``CodeHandler.validate`` builds the instance
and ``evaluate_in`` (what ``evaluate`` runs in EVAL's fresh sandbox) runs the hidden test.
To stay fast on 2 cores, one sandbox serves a shard of problems in turn instead of one
sandbox per test; a few problems also go through ``evaluate`` itself (a fresh sandbox
each) to show the two paths agree.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from handlers.code import CodeHandler, CodeInstance, evaluate, evaluate_in
from prorl_async.sandbox import BwrapRuntime, RuntimeConfig, SandboxSpec
from tests.data import load_humaneval
from tests.handlers.policies import require_bwrap

ROWS = 164
TIME_LIMIT_S = 20.0

Problem = dict[str, Any]
Outcome = dict[str, Any]


@pytest.fixture(scope="module")
def problems() -> list[Problem]:
    return load_humaneval()


@pytest.fixture
async def runtime(tmp_path: Path) -> AsyncIterator[BwrapRuntime]:
    require_bwrap()
    run_dir = tempfile.mkdtemp(prefix="phe-")  # short: socket paths live under it
    config = RuntimeConfig(
        state_dir=str(tmp_path / "state"),
        run_dir=run_dir,
        loopback_dir=str(tmp_path / "loopback"),
    )
    rt = BwrapRuntime(config)
    try:
        yield rt
    finally:
        await rt.aclose()
        leftovers = os.listdir(run_dir)
        shutil.rmtree(run_dir, ignore_errors=True)
        assert leftovers == [], f"sandbox directories left behind: {leftovers}"


def _instance(p: Problem) -> CodeInstance:
    fields = {k: p[k] for k in ("prompt", "test", "entry_point")}
    inst: CodeInstance = CodeHandler().validate({**fields, "time_limit_s": TIME_LIMIT_S})
    return inst


VARIANTS: dict[str, Callable[[Problem], str]] = {
    "canonical": lambda p: str(p["canonical_solution"]),
    "broken": lambda p: "    return None\n",
}


async def _shard(rt: BwrapRuntime, shard: list[Problem]) -> dict[tuple[str, str], Outcome]:
    out: dict[tuple[str, str], Outcome] = {}
    async with await rt.start(SandboxSpec()) as sandbox:
        for p in shard:
            inst = _instance(p)
            for name, variant in VARIANTS.items():
                out[(p["task_id"], name)] = await evaluate_in(sandbox, inst, variant(p))
    return out


async def test_all_canonical_pass_and_broken_fail(
    problems: list[Problem], runtime: BwrapRuntime
) -> None:
    shards = max(2, os.cpu_count() or 2)
    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(_shard(runtime, problems[i::shards])) for i in range(shards)]
    outcomes: dict[tuple[str, str], Outcome] = {}
    for task in tasks:
        outcomes.update(task.result())
    assert len(outcomes) == 2 * ROWS
    canonical_failed = {
        task: o["failure"]
        for (task, v), o in outcomes.items()
        if v == "canonical" and not o["all_passed"]
    }
    broken_passed = [task for (task, v), o in outcomes.items() if v == "broken" and o["all_passed"]]
    assert canonical_failed == {}
    assert broken_passed == []
    # A broken variant fails for a reason the details name (not a harness error).
    for (_, v), o in outcomes.items():
        if v == "broken":
            assert o["failure"].startswith(("exit status", "timed out")), o
    assert runtime.live == 0


async def test_fresh_sandbox_path_agrees(problems: list[Problem], runtime: BwrapRuntime) -> None:
    for p in problems[:3]:
        inst = _instance(p)
        good = await evaluate(runtime, inst, VARIANTS["canonical"](p))
        bad = await evaluate(runtime, inst, VARIANTS["broken"](p))
        assert good["all_passed"] is True and good["fraction"] == 1.0, (p["task_id"], good)
        assert bad["all_passed"] is False and bad["passed"] == 0, (p["task_id"], bad)
    assert runtime.live == 0
