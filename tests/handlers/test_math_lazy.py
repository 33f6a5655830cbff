"""``sandbox_start = "on_first_use"`` through HTTP: the unchanged ``math`` task on a real
server, real bwrap sandboxes and IPython kernels, the scripted LLM (a TEST DOUBLE).

A rollout that calls no tool must never start a sandbox; one that does starts exactly
one, in RUN, and leaves nothing behind, whether it finishes, fails to start or is
cancelled before or after the start; a budget of one serves jobs that all need it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from prorl_async.sandbox import Sandbox, SandboxSpec
from prorl_async.schemas import Stage
from prorl_async.scripted_llm import LatencyModel, ScriptedLLM
from prorl_async.scripted_llm.policies import Policy
from prorl_async.stages import StageScope
from tests.handlers.policies import (
    BoxedAnswer,
    PythonSleeper,
    PythonSolver,
    assert_nothing_live,
    finished,
    require_bwrap,
    serve,
)
from tests.helpers import Server, ServerFactory, eventually
from tests.proctree import cmdline, descendants

LAZY = {"sandbox_start": "on_first_use"}
PROBLEM = "What is 1234 * 5678 + 9?"
INSTANCE = {"problem": PROBLEM, "answer": "7006661"}
PROGRAMS = {"1234 * 5678": "print(1234 * 5678 + 9)"}


def count_starts(srv: Server, monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """The stage of every sandbox launch of the server's runtime from now on (what a
    bwrap + tool-server start costs), recorded where every start goes through."""
    runtime = srv.runtime
    real = runtime.start_reserved
    stages: list[str | None] = []

    async def counted(spec: SandboxSpec, scope: StageScope | None = None) -> Sandbox:
        stages.append(None if scope is None else scope.name)
        return await real(spec, scope)

    monkeypatch.setattr(runtime, "start_reserved", counted)
    return stages


def sandbox_processes() -> list[str]:
    return [c for pid in descendants() if "bwrap" in (c := cmdline(pid)) or "toolserver" in c]


async def test_a_direct_answer_starts_no_sandbox(
    make_server: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with serve(make_server, BoxedAnswer("7006661"), **LAZY) as srv:
        starts = count_starts(srv, monkeypatch)
        res = await finished(srv, await srv.client.submit("math", INSTANCE))
        assert res["status"] == "done" and res["reward"] == 1.0, res["error"]
        assert res["finish"] == "no_tool_call" and res["eval"]["answer_source"] == "text"
        status = await srv.client.status()
        assert starts == [] and status["sandbox_budget"]["peak"] == 0
        assert status["sandboxes"] == 0
        # A handle never started is no sandbox idling while the job waits.
        assert set(status["idle_sandbox_seconds"].values()) <= {0.0}
        assert_nothing_live(srv)


async def test_a_python_call_starts_one_sandbox_in_run(
    make_server: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with serve(make_server, PythonSolver(PROGRAMS), **LAZY) as srv:
        starts = count_starts(srv, monkeypatch)
        res = await finished(srv, await srv.client.submit("math", INSTANCE))
        assert res["status"] == "done" and res["reward"] == 1.0, res["error"]
        tool_texts = [t["text"] for t in res["turns"] if t["role"] == "tool"]
        assert any("7006661" in text for text in tool_texts)  # the kernel really ran it
        assert starts == ["run"]
        assert srv.runtime.budget.taken_by == {"run": 1}
        assert_nothing_live(srv)
        assert sandbox_processes() == []


async def test_a_start_failure_at_first_use_fails_run(
    make_server: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 16 MiB of address space is too little for the tool server's Python: a real start
    # failure, now at the first tool call instead of in INIT.
    limits = {"memory_bytes": 16 << 20}
    async with serve(make_server, PythonSolver(PROGRAMS), sandbox_limits=limits, **LAZY) as srv:
        starts = count_starts(srv, monkeypatch)
        res = await finished(srv, await srv.client.submit("math", INSTANCE))
        assert res["status"] == "failed" and res["reward"] is None
        assert res["error"]["stage"] == "run" and res["error"]["type"] == "SandboxStartError"
        assert res["num_turns"] == 1  # the turn that asked for the tool is kept
        assert starts == ["run"]
        assert_nothing_live(srv)


@asynccontextmanager
async def serve_slow(
    make_server: ServerFactory, policy: Policy, ttft_s: float
) -> AsyncIterator[Server]:
    require_bwrap()
    latency = LatencyModel(ttft_s=ttft_s)
    async with (
        ScriptedLLM(policy=policy, latency=latency) as llm,
        make_server(runtime="bwrap", **LAZY) as srv,
    ):
        await srv.client.add_llm_server(llm.address)
        yield srv


async def test_cancel_in_run_before_the_first_use(
    make_server: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The model takes 60 s to answer: the job sits in RUN holding a handle never used.
    async with serve_slow(make_server, PythonSolver(PROGRAMS), ttft_s=60) as srv:
        starts = count_starts(srv, monkeypatch)
        job_id = await srv.client.submit("math", INSTANCE)
        await eventually(lambda: srv.service.pipeline.active[Stage.RUN] == 1)
        await srv.client.cancel(job_id)
        res = await finished(srv, job_id)
        assert res["status"] == "cancelled"
        assert starts == [] and srv.runtime.budget.peak == 0
        assert_nothing_live(srv)


async def test_cancel_in_run_after_the_first_use(
    make_server: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with serve(make_server, PythonSleeper(60), **LAZY) as srv:
        starts = count_starts(srv, monkeypatch)
        job_id = await srv.client.submit("math", INSTANCE)
        runtime = srv.runtime
        await eventually(lambda: runtime.live == 1 and sandbox_processes() != [], timeout=30)
        await srv.client.cancel(job_id)
        res = await finished(srv, job_id)
        assert res["status"] == "cancelled" and starts == ["run"]
        assert_nothing_live(srv)
        assert runtime.budget.live == 0
        assert sandbox_processes() == []


async def test_one_slot_serves_four_jobs_that_all_need_it(
    make_server: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with serve(make_server, PythonSolver(PROGRAMS), max_sandboxes=1, **LAZY) as srv:
        starts = count_starts(srv, monkeypatch)
        ids = [await srv.client.submit("math", INSTANCE) for _ in range(4)]
        docs: list[dict[str, Any]] = [await finished(srv, i, wait=120) for i in ids]
        assert [d["status"] for d in docs] == ["done"] * 4, [d["error"] for d in docs]
        assert [d["reward"] for d in docs] == [1.0] * 4
        budget = srv.runtime.budget
        assert starts == ["run"] * 4 and budget.peak == 1 and budget.taken_by == {"run": 4}
        assert budget.waits >= 1
        # The waits for the slot were paused time, in RUN: not counted against timeout_s.
        waited = [d["timing"]["backend_wait_s"] for d in docs]
        assert max(waited) > 0, waited  # a decision (paused), not a duration
        assert "init" not in starts  # INIT starts nothing
        assert_nothing_live(srv)
