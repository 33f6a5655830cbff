"""The ``code`` task through HTTP: real server, real bwrap sandboxes (one for RUN, a fresh
one for the hidden tests), and a scripted LLM (test double) that writes the program with the
editor, runs it with bash, reacts to what it printed, and finishes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import pytest

from prorl_async.client import UnprocessableError
from prorl_async.sandbox import Runtime, SandboxSpec
from prorl_async.scripted_llm.policies import FinishPolicy
from tests.handlers.policies import (
    CodeWriter,
    KillToolServer,
    assert_nothing_live,
    finished,
    serve,
)
from tests.helpers import Server, ServerFactory, eventually

SUM_PROBLEM = {
    "problem": "Read two integers a and b on one line and print a + b.",
    "tests": [
        {"input": "3 4\n", "output": "7\n"},
        {"input": "-1 1\n", "output": "0"},
        {"input": "5 0", "output": "5\n"},
    ],
    "time_limit_s": 5,
}
DRAFT = "a, b = map(int, input().split())\nprint(a + c)\n"  # NameError until fixed
RUN = "echo '3 4' | python3 solution.py"

ADD_FUNCTION = {
    "prompt": 'def add(a: int, b: int) -> int:\n    """Return the sum of a and b."""\n',
    "test": (
        "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n"
    ),
    "entry_point": "add",
}
ADD_SOLUTION = "def add(a: int, b: int) -> int:\n    return a + b\n"
ADD_RUN = "python3 -c 'from solution import add; print(add(2, 3))'"


def _tool_texts(result: dict[str, Any]) -> list[str]:
    return [t["text"] for t in result["turns"] if t["role"] == "tool"]


async def _run(srv: Server, instance: dict[str, Any]) -> dict[str, Any]:
    return await finished(srv, await srv.client.submit("code", instance))


async def test_stdio_solution_fixed_after_traceback_scores_1(make_server: ServerFactory) -> None:
    policy = CodeWriter(DRAFT, RUN, fix=("a + c", "a + b"))
    async with serve(make_server, policy) as srv:
        res = await _run(srv, SUM_PROBLEM)
        assert res["status"] == "done" and res["error"] is None, res["error"]
        tools = _tool_texts(res)
        # write, run (crash), fix, run (prints 7), finish: the policy reacted to real output
        assert res["num_turns"] == 5
        assert "NameError" in tools[1] and "7" in tools[3]
        assert res["reward"] == 1.0
        ev = res["eval"]
        assert ev["style"] == "stdio" and ev["passed"] == 3 and ev["total"] == 3
        assert ev["fraction"] == 1.0 and ev["failure"] is None
        assert ev["solution_source"] == "finish"
        assert_nothing_live(srv)


async def test_stdio_wrong_solution_scores_0_with_fraction(make_server: ServerFactory) -> None:
    wrong = "a, b = map(int, input().split())\nprint(a - b)\n"  # right only when b == 0
    async with serve(make_server, CodeWriter(wrong, RUN)) as srv:
        res = await _run(srv, SUM_PROBLEM)
        assert res["status"] == "done" and res["reward"] == 0.0
        ev = res["eval"]
        assert ev["passed"] == 1 and ev["total"] == 3
        assert ev["fraction"] == pytest.approx(1 / 3)
        assert ev["failure"] == "case 0: wrong output"
        assert_nothing_live(srv)


async def test_function_style_solution_from_fenced_text(make_server: ServerFactory) -> None:
    async with serve(make_server, CodeWriter(ADD_SOLUTION, ADD_RUN, finish="text")) as srv:
        res = await _run(srv, ADD_FUNCTION)
        assert res["status"] == "done" and res["reward"] == 1.0, res["eval"]
        assert "5" in _tool_texts(res)[1]
        ev = res["eval"]
        assert ev["style"] == "function" and ev["passed"] == 1 and ev["total"] == 1
        assert ev["solution_source"] == "text"
        assert_nothing_live(srv)


async def test_function_style_wrong_solution_reports_the_assertion(
    make_server: ServerFactory,
) -> None:
    wrong = "def add(a: int, b: int) -> int:\n    return a * b\n"
    async with serve(make_server, CodeWriter(wrong, ADD_RUN, finish="file")) as srv:
        res = await _run(srv, ADD_FUNCTION)
        assert res["status"] == "done" and res["reward"] == 0.0
        ev = res["eval"]
        assert ev["passed"] == 0 and ev["solution_source"] == "file"
        assert ev["failure"].startswith("exit status 1") and "AssertionError" in ev["failure"]
        assert_nothing_live(srv)


async def test_solution_read_from_workspace_file(make_server: ServerFactory) -> None:
    async with serve(make_server, CodeWriter(ADD_SOLUTION, ADD_RUN, finish="file")) as srv:
        res = await _run(srv, ADD_FUNCTION)
        assert res["reward"] == 1.0 and res["eval"]["solution_source"] == "file"


async def test_no_solution_scores_0(make_server: ServerFactory) -> None:
    async with serve(make_server, FinishPolicy(answer="I give up")) as srv:
        res = await _run(srv, SUM_PROBLEM)
        assert res["status"] == "done" and res["reward"] == 0.0
        ev = res["eval"]
        assert ev["failure"] == "no solution found" and ev["solution_source"] == "none"
        assert ev["passed"] == 0 and ev["total"] == 3


async def test_each_test_has_a_time_limit(make_server: ServerFactory) -> None:
    slow = "import time\ntime.sleep(60)\n"
    instance = {**SUM_PROBLEM, "time_limit_s": 0.5}
    async with serve(make_server, CodeWriter(slow, "true")) as srv:
        res = await _run(srv, instance)
        assert res["status"] == "done" and res["reward"] == 0.0
        assert res["eval"]["failure"].startswith("case 0: timed out after")
        assert res["timing"]["eval_s"] < 10
        assert_nothing_live(srv)


async def test_cancel_during_hidden_tests_closes_the_eval_sandbox(
    make_server: ServerFactory,
) -> None:
    slow = "import time\ntime.sleep(120)\n"
    instance = {**SUM_PROBLEM, "time_limit_s": 100}
    async with serve(make_server, CodeWriter(slow, "true")) as srv:
        job_id = await srv.client.submit("code", instance)

        async def hidden_tests_running() -> bool:
            status = await srv.client.status()
            return bool(status["active"]["eval"] == 1 and status["sandboxes"] == 1)

        await eventually(hidden_tests_running, timeout=30)
        out = await srv.client.cancel(job_id)
        assert out["cancelled"] == [job_id]
        assert_nothing_live(srv)  # gone by the time the cancel call returned
        res = await finished(srv, job_id)
        assert res["status"] == "cancelled" and res["reward"] is None


@pytest.mark.parametrize(
    ("instance", "field"),
    [
        ({**SUM_PROBLEM, "entry_point": "f"}, "not both"),
        ({"time_limit_s": 1}, "no task given"),
        ({"problem": "x"}, "instance.tests"),
        ({"prompt": "def f():\n", "test": "def check(c): pass"}, "instance.entry_point"),
        ({**ADD_FUNCTION, "entry_point": "not valid"}, "instance.entry_point"),
        ({**ADD_FUNCTION, "prompt": "  "}, "instance.prompt"),
        ({"problem": "x", "tests": []}, "instance.tests"),
        ({"problem": "x", "tests": [{"input": "1"}]}, "instance.tests[0]"),
        ({**SUM_PROBLEM, "time_limit_s": 0}, "instance.time_limit_s"),
        ({**SUM_PROBLEM, "extra": 1}, "extra"),
    ],
)
async def test_bad_instance_is_422_naming_the_field(
    make_server: ServerFactory, instance: dict[str, Any], field: str
) -> None:
    async with make_server() as srv:
        with pytest.raises(UnprocessableError) as err:
            await srv.client.submit("code", instance)
        assert field in str(err.value)


async def test_init_crash_sandbox_cannot_start(make_server: ServerFactory) -> None:
    limits = {"memory_bytes": 16 << 20}  # too small for the tool server's Python
    async with serve(make_server, CodeWriter(ADD_SOLUTION, ADD_RUN), sandbox_limits=limits) as srv:
        res = await _run(srv, ADD_FUNCTION)
        assert res["status"] == "failed" and res["reward"] is None
        assert res["error"]["stage"] == "init" and res["error"]["type"] == "SandboxStartError"
        assert_nothing_live(srv)


async def test_run_crash_tool_server_killed(make_server: ServerFactory) -> None:
    async with serve(make_server, KillToolServer()) as srv:
        res = await _run(srv, SUM_PROBLEM)
        assert res["status"] == "failed" and res["reward"] is None
        assert res["error"]["stage"] == "run" and "tool server" in res["error"]["message"]
        assert_nothing_live(srv)


class EvalStartFails:
    """TEST DOUBLE around the real runtime: the first sandbox (INIT's) starts for real, any
    later one (EVAL's fresh sandbox) fails to start."""

    def __init__(self, real: Runtime) -> None:
        self.real = real
        self.starts = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    async def start(self, spec: SandboxSpec | None = None, scope: Any = None) -> Any:
        self.starts += 1
        if self.starts > 1:
            raise RuntimeError("no sandbox for the hidden tests")
        return await self.real.start(spec, scope)


@contextmanager
def eval_start_fails(srv: Server) -> Iterator[EvalStartFails]:
    shared = srv.service.shared
    double = EvalStartFails(srv.runtime)
    shared.runtime = cast(Runtime, double)  # a duck: the rest is the real runtime's
    try:
        yield double
    finally:
        shared.runtime = double.real


async def test_eval_crash_fresh_sandbox_fails(make_server: ServerFactory) -> None:
    async with serve(make_server, CodeWriter(ADD_SOLUTION, ADD_RUN)) as srv:
        with eval_start_fails(srv) as double:
            res = await _run(srv, ADD_FUNCTION)
        assert double.starts == 2
        assert res["status"] == "failed" and res["reward"] is None
        assert res["error"] == {
            "stage": "eval",
            "type": "RuntimeError",
            "message": "no sandbox for the hidden tests",
        }
        assert res["num_turns"] == 3  # RUN's turns are kept
        assert_nothing_live(srv)
