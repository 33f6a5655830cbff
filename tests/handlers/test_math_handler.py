"""The ``math`` task through HTTP: real server, real bwrap sandbox and IPython kernel,
a scripted LLM (test double) that computes with the python tool and reads the result back."""

from __future__ import annotations

from typing import Any

import pytest

import handlers.math
from prorl_async.client import UnprocessableError
from tests.data import load_gsm8k
from tests.handlers.policies import (
    KillToolServer,
    PythonSolver,
    assert_nothing_live,
    finished,
    serve,
)
from tests.helpers import ServerFactory

PROBLEM = "What is 1234 * 5678 + 9?"
PROGRAMS = {"1234 * 5678": "print(1234 * 5678 + 9)"}


def _tool_texts(result: dict[str, Any]) -> list[str]:
    return [t["text"] for t in result["turns"] if t["role"] == "tool"]


async def test_correct_answer_computed_with_python_scores_1(make_server: ServerFactory) -> None:
    async with serve(make_server, PythonSolver(PROGRAMS)) as srv:
        job_id = await srv.client.submit("math", {"problem": PROBLEM, "answer": "7006661"})
        res = await finished(srv, job_id)
        assert res["status"] == "done" and res["error"] is None, res["error"]
        assert res["reward"] == 1.0
        # The kernel really ran the code: its output came back as the tool observation.
        assert any("7006661" in text for text in _tool_texts(res))
        assert res["num_turns"] == 2 and res["finish"] == "finish_tool"
        ev = res["eval"]
        assert ev["correct"] is True and ev["method"] == "numeric"
        assert ev["predicted"] == "7006661" and ev["reference"] == "7006661"
        assert ev["answer_source"] == "finish"
        assert len(res["response_ids"]) == len(res["response_mask"])
        assert_nothing_live(srv)


async def test_wrong_answer_scores_0(make_server: ServerFactory) -> None:
    async with serve(make_server, PythonSolver(PROGRAMS, offset=1)) as srv:
        job_id = await srv.client.submit("math", {"problem": PROBLEM, "answer": "7006661"})
        res = await finished(srv, job_id)
        assert res["status"] == "done" and res["reward"] == 0.0
        ev = res["eval"]
        assert ev["correct"] is False
        assert ev["predicted_normalized"] == "7006662" and ev["reference_normalized"] == "7006661"
        assert_nothing_live(srv)


async def test_gsm8k_reference_and_boxed_answer_in_text(make_server: ServerFactory) -> None:
    row = load_gsm8k()[0]  # Janet's ducks: reference is a worked solution ending "#### 18"
    assert row["answer"].rstrip().endswith("#### 18")
    policy = PythonSolver({"Janet": "print((16 - 3 - 4) * 2)"}, via="text")
    async with serve(make_server, policy) as srv:
        instance = {"problem": row["question"], "answer": row["answer"]}
        res = await finished(srv, await srv.client.submit("math", instance))
        assert res["status"] == "done" and res["reward"] == 1.0, res["eval"]
        ev = res["eval"]
        assert ev["answer_source"] == "text" and ev["predicted"] == "18"
        assert ev["reference"] == "18" and res["finish"] == "no_tool_call"
        assert_nothing_live(srv)


@pytest.mark.parametrize(
    ("instance", "field"),
    [
        ({"problem": "2+2?"}, "answer"),
        ({"problem": "", "answer": "4"}, "instance.problem"),
        ({"problem": "   ", "answer": "4"}, "instance.problem"),
        ({"problem": "2+2?", "answer": "$$"}, "instance.answer"),
        ({"problem": "2+2?", "answer": "4", "hint": "x"}, "hint"),
        ({"problem": "2+2?", "answer": "4", "max_turns": 0}, "instance.max_turns"),
    ],
)
async def test_bad_instance_is_422_naming_the_field(
    make_server: ServerFactory, instance: dict[str, Any], field: str
) -> None:
    async with make_server() as srv:
        with pytest.raises(UnprocessableError) as err:
            await srv.client.submit("math", instance)
        assert field in str(err.value)


async def test_init_crash_sandbox_cannot_start(make_server: ServerFactory) -> None:
    # 16 MiB of address space is too little for the tool server's Python: a real start failure.
    limits = {"memory_bytes": 16 << 20}
    async with serve(make_server, PythonSolver(PROGRAMS), sandbox_limits=limits) as srv:
        job_id = await srv.client.submit("math", {"problem": PROBLEM, "answer": "7006661"})
        res = await finished(srv, job_id)
        assert res["status"] == "failed" and res["reward"] is None
        assert res["error"]["stage"] == "init" and res["error"]["type"] == "SandboxStartError"
        assert res["num_turns"] == 0
        assert_nothing_live(srv)


async def test_run_crash_tool_server_killed(make_server: ServerFactory) -> None:
    async with serve(make_server, KillToolServer()) as srv:
        job_id = await srv.client.submit("math", {"problem": PROBLEM, "answer": "7006661"})
        res = await finished(srv, job_id)
        assert res["status"] == "failed" and res["reward"] is None
        assert res["error"]["stage"] == "run", res["error"]
        assert "tool server" in res["error"]["message"]
        assert res["num_turns"] == 1  # the turn that killed it is kept
        assert_nothing_live(srv)


async def test_eval_crash(make_server: ServerFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_grade(predicted: str | None, reference: str | None) -> Any:
        raise ZeroDivisionError("grader bug")

    monkeypatch.setattr(handlers.math, "grade", broken_grade)
    async with serve(make_server, PythonSolver(PROGRAMS)) as srv:
        job_id = await srv.client.submit("math", {"problem": PROBLEM, "answer": "7006661"})
        res = await finished(srv, job_id)
        assert res["status"] == "failed" and res["reward"] is None
        assert res["error"] == {
            "stage": "eval",
            "type": "ZeroDivisionError",
            "message": "grader bug",
        }
        assert res["num_turns"] == 2  # RUN's turns survive an EVAL failure
        assert_nothing_live(srv)
