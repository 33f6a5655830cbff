"""The learner's owner against stand-ins (no torch needed): every wait is bounded, a dead
or wedged learner raises naming the op and its log, and closing ends the process."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from prorl_async.train_demo import Learner, LearnerError, LearnerRefused


def stand_in(tmp_path: Path, code: str, grace_s: float = 1.0) -> Learner:
    return Learner(
        log_path=tmp_path / "learner.log", argv=[sys.executable, "-c", code], grace_s=grace_s
    )


ECHO = """
import json, sys
for line in sys.stdin:
    req = json.loads(line)
    if req["op"] == "bad":
        print(json.dumps({"id": req["id"], "ok": False, "error": "bad: no such op"}), flush=True)
    else:
        print(json.dumps({"id": req["id"], "ok": True, "echo": req}), flush=True)
"""


async def test_answers_and_refusals(tmp_path: Path) -> None:
    async with stand_in(tmp_path, ECHO) as learner:
        reply = await learner.call("logprobs", 10, samples=[], dir=tmp_path)
        assert reply == {"echo": {"id": 1, "op": "logprobs", "samples": [], "dir": str(tmp_path)}}
        with pytest.raises(LearnerRefused, match="learner bad: bad: no such op"):
            await learner.call("bad", 10)
        assert (await learner.call("save", 10))["echo"]["id"] == 3
    assert learner.returncode == 0  # EOF ended it


async def test_a_dead_learner_raises_with_its_log(tmp_path: Path) -> None:
    code = "import sys; sys.stderr.write('torch: out of memory\\n'); sys.exit(3)"
    async with stand_in(tmp_path, code) as learner:
        with pytest.raises(LearnerError, match="learner grpo: .*status 3") as info:
            await learner.call("grpo", 30)
        assert "torch: out of memory" in str(info.value)
        with pytest.raises(LearnerError, match="learner grpo"):
            await learner.call("grpo", 30)


async def test_a_wedged_learner_times_out_and_is_killed(tmp_path: Path) -> None:
    # Reads its request, never answers, and ignores both EOF and SIGTERM.
    code = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "sys.stdin.readline(); sys.stderr.write('stuck in sft\\n'); sys.stderr.flush()\n"
        "time.sleep(600)\n"
    )
    learner = await stand_in(tmp_path, code, grace_s=0.5).start()
    try:
        with pytest.raises(LearnerError, match=r"learner sft: no answer within 1 s") as info:
            await learner.call("sft", 1.0)
        assert "stuck in sft" in str(info.value)
    finally:
        async with asyncio.timeout(15):
            await learner.aclose()
    assert learner.returncode == -9
    await learner.aclose()  # idempotent


async def test_a_late_answer_is_skipped(tmp_path: Path) -> None:
    # Answers the first request after 2 s, the second at once.
    code = """
import json, sys, time
first = json.loads(sys.stdin.readline())
time.sleep(2)
print(json.dumps({"id": first["id"], "ok": True, "which": "first"}), flush=True)
second = json.loads(sys.stdin.readline())
print(json.dumps({"id": second["id"], "ok": True, "which": "second"}), flush=True)
sys.stdin.read()
"""
    async with stand_in(tmp_path, code) as learner:
        with pytest.raises(LearnerError, match="no answer within 0.5 s"):
            await learner.call("sft", 0.5)
        assert await learner.call("grpo", 10) == {"which": "second"}


async def test_a_missing_engine_venv_is_named(tmp_path: Path) -> None:
    learner = Learner(log_path=tmp_path / "l.log", argv=[str(tmp_path / "venv/bin/python")])
    with pytest.raises(LearnerError, match="prorl-async vllm-cpu setup"):
        await learner.start()
    await learner.aclose()
    with pytest.raises(LearnerError, match="not running"):
        await learner.call("init", 1)
