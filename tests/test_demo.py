"""``prorl-async demo`` as a real subprocess: results, summary, Ctrl-C; plus its pieces."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

import prorl_async
from prorl_async.demo import DemoPolicy, generate_tasks, main
from prorl_async.demo.summary import COLUMNS, summary_rows
from prorl_async.sandbox import get_runtime
from prorl_async.scripted_llm import ScriptedLLM
from tests.conftest import require
from tests.helpers import eventually
from tests.proctree import descendants

KINDS = {"math", "code-stdio", "code-function", "swe"}


def _command() -> list[str]:
    script = shutil.which("prorl-async")
    return [script] if script else [sys.executable, "-m", "prorl_async.cli"]


def _bwrap_ok() -> bool:
    try:
        get_runtime("bwrap")
    except Exception:
        return False
    return True


async def _demo(tmp_path: Path, *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *_command(),
        "demo",
        *args,
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


def _check_result(doc: dict[str, Any]) -> None:
    assert doc["status"] == "done", doc["error"]
    n = len(doc["response_ids"])
    assert n > 0 and len(doc["response_mask"]) == n and len(doc["response_logprobs"]) == n
    assert doc["metadata"]["demo_kind"] in KINDS
    # The scripted model errs exactly where the generator planted an error, and the real
    # graders (python answer, hidden tests, pytest in a fresh sandbox) notice.
    assert doc["reward"] == (0.0 if doc["metadata"]["scripted_error"] else 1.0)
    assert doc["num_turns"] >= 2


async def test_demo_runs_six_jobs_and_reports(tmp_path: Path) -> None:
    require(_bwrap_ok(), "bwrap sandboxes unavailable")
    proc = await _demo(tmp_path, "--jobs", "6", "--error-rate", "0.5", "--seed", "3")
    async with asyncio.timeout(90):
        stdout, stderr = await proc.communicate()
    out, err = stdout.decode(), stderr.decode()
    assert proc.returncode == 0, err
    lines = (tmp_path / "demo-results.jsonl").read_text().splitlines()
    docs = [json.loads(line) for line in lines]
    assert len(docs) == 6 and len({d["job_id"] for d in docs}) == 6
    for doc in docs:
        _check_result(doc)
    assert {d["reward"] for d in docs} == {0.0, 1.0}  # three planted errors of six
    assert {d["metadata"]["demo_kind"] for d in docs} == KINDS
    header = next(line for line in out.splitlines() if line.startswith("task"))
    assert header.split() == " ".join(COLUMNS).split()
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.split()}
    assert rows["all"][1:4] == ["6", "6", "0"] and rows["all"][4] == "0.50"
    assert "6/6 jobs" in err and "6 results in demo-results.jsonl" in out
    # The runtime the server chose, not just what was asked for.
    assert "; runtime bwrap (auto); " in out.splitlines()[0], out.splitlines()[0]


def _not_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
async def test_interrupt_stops_everything(tmp_path: Path, sig: signal.Signals, code: int) -> None:
    require(_bwrap_ok(), "bwrap sandboxes unavailable")
    proc = await _demo(tmp_path, "--jobs", "40", "--concurrency", "4")
    assert proc.stderr is not None
    async with asyncio.timeout(60):
        first = await proc.stderr.readline()  # the 0/40 line: jobs are submitted
        assert b"0/40 jobs" in first
        await eventually(lambda: len(descendants(proc.pid)) >= 2)  # sandboxes are up
        started = descendants(proc.pid)
        proc.send_signal(sig)
        _, stderr = await proc.communicate()
    assert proc.returncode == code
    assert b"interrupted" in stderr and b"everything started was stopped" in stderr
    assert not {pid for pid in started if _not_zombie(pid)}


def test_tasks_are_reproducible_with_an_exact_error_count() -> None:
    a = generate_tasks(20, seed=5, error_rate=0.25)
    b = generate_tasks(20, seed=5, error_rate=0.25)
    assert [t.body() for t in a] == [t.body() for t in b]
    assert sum(t.wrong for t in a) == 5
    assert {t.kind for t in a} == KINDS
    with pytest.raises(ValueError, match="error_rate"):
        generate_tasks(3, error_rate=1.5)


def test_policy_reads_the_tool_output() -> None:
    task = next(t for t in generate_tasks(1, seed=0, error_rate=0.0) if t.kind == "math")
    policy = DemoPolicy({task.key: task.script})
    prompt = f"<|im_start|>user\n{task.instance['problem']}<|im_end|>\n<|im_start|>assistant\n"
    first = policy.reply(prompt)
    assert '"name": "python"' in first
    seen = prompt + first + "<|im_end|>\n<|im_start|>user\n<tool_response>\n41\n</tool_response>"
    final = policy.reply(seen + "<|im_end|>\n<|im_start|>assistant\n")
    assert '"answer": "41"' in final  # what the tool printed, not the reference answer
    assert "do not know" in policy.reply("<|im_start|>user\nno marker<|im_end|>")


def test_summary_rows_follow_the_task_order() -> None:
    docs: list[dict[str, Any]] = [
        {
            "status": "done",
            "reward": 1.0,
            "num_turns": 2,
            "metadata": {"demo_kind": "swe"},
            "timing": {"init_s": 1.0, "run_s": 2.0, "eval_s": 3.0},
        },
        {
            "status": "failed",
            "reward": None,
            "num_turns": 1,
            "metadata": {"demo_kind": "math"},
            "timing": {"init_s": 0.5},
        },
    ]
    rows = summary_rows(docs, 2.0, order=["math", "swe"])
    assert [r[0] for r in rows] == ["math", "swe", "all"]
    assert rows[0][1:5] == ["1", "0", "1", "-"]
    assert rows[2][1:] == ["2", "1", "1", "1.00", "1.50", "0.75", "2.00", "3.00", "1.00"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--jobs", "0"], "--jobs must be >= 1"),
        (["--error-rate", "2"], "--error-rate must be within [0, 1]"),
        (["--llm", "http://h:1/v1"], "--llm needs --tokenizer"),
        (["--runtime", "docker"], "invalid choice: 'docker'"),
    ],
)
def test_bad_flags_are_named(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


async def test_external_backend_flag_uses_the_given_llm(tmp_path: Path) -> None:
    require(_bwrap_ok(), "bwrap sandboxes unavailable")
    tasks = generate_tasks(3, seed=4, error_rate=0.0)
    policy = DemoPolicy({t.key: t.script for t in tasks})
    tokenizer = Path(prorl_async.__file__).parent / "assets" / "tokenizer"
    async with ScriptedLLM(policy=policy, tokenizer=tokenizer) as llm:
        args = ["--jobs", "3", "--seed", "4", "--error-rate", "0", "--api", "sglang"]
        args += ["--llm", llm.address, "--tokenizer", str(tokenizer), "--output", "x.jsonl"]
        proc = await _demo(tmp_path, *args)
        async with asyncio.timeout(90):
            stdout, stderr = await proc.communicate()
        served = [entry for entry in llm.log if entry.outcome == "ok"]
    assert proc.returncode == 0, stderr.decode()
    assert f"LLM {llm.address} (sglang)" in stdout.decode()
    docs = [json.loads(line) for line in (tmp_path / "x.jsonl").read_text().splitlines()]
    assert [d["reward"] for d in docs] == [1.0, 1.0, 1.0]
    # Every model turn of every result was answered by this backend, on its SGLang route.
    assert len(served) == sum(d["num_turns"] for d in docs)
    assert all(not entry.route.endswith("completions") for entry in served)
