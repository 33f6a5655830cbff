"""The built-in ``sandbox`` task end to end: real server, real bwrap, a scripted LLM."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from prorl_async.client import UnprocessableError
from prorl_async.scripted_llm.policies import tool_call
from tests.handlers.policies import assert_nothing_live, finished, serve, tool_responses
from tests.helpers import ServerFactory, eventually
from tests.proctree import cmdline, descendants


@dataclass
class Script:
    """TEST DOUBLE policy: replays fixed tool calls in order, one per turn, then finishes."""

    calls: list[tuple[str, dict[str, Any]]]
    answer: str = "done"
    seen: list[str] = field(default_factory=list)

    def reply(self, conversation: str) -> str:
        responses = tool_responses(conversation)
        self.seen = responses
        step = len(responses)
        if step < len(self.calls):
            name, args = self.calls[step]
            return tool_call(name, args)
        return tool_call("finish", {"answer": self.answer})


def _sandbox_job(**instance: Any) -> dict[str, Any]:
    base = {"prompt": "Write hello into greeting.txt", "tools": ["bash", "str_replace_editor"]}
    return {"task": "sandbox", "instance": {**base, **instance}}


@pytest.mark.parametrize("start", ["eager", "on_first_use"])
async def test_sandbox_task_rewards_a_correct_episode(
    make_server: ServerFactory, start: str
) -> None:
    policy = Script(
        [
            ("bash", {"command": "cat seed.txt; export X=42"}),
            (
                "str_replace_editor",
                {"command": "create", "path": "greeting.txt", "file_text": "hello\n"},
            ),
            ("bash", {"command": "echo $X; cat greeting.txt"}),
        ]
    )
    async with serve(make_server, policy, sandbox_start=start) as srv:
        job = _sandbox_job(
            files={"seed.txt": "seed-content"}, reward_command="grep -qx hello greeting.txt"
        )
        doc = await finished(srv, (await srv.client.submit_batch([job]))[0])
        assert doc["status"] == "done", doc["error"]
        assert doc["reward"] == 1.0 and doc["eval"]["exit_code"] == 0
        tool_texts = [t["text"] for t in doc["turns"] if t["role"] == "tool"]
        assert len(tool_texts) == 3
        assert "seed-content" in tool_texts[0]
        assert "42" in tool_texts[2] and "hello" in tool_texts[2]  # bash state persisted
        assert doc["eval"]["finish"] == "finish_tool" and doc["eval"]["answer"] == "done"
        assert_nothing_live(srv)


async def test_sandbox_task_scores_zero_when_command_fails(make_server: ServerFactory) -> None:
    policy = Script([("bash", {"command": "echo wrong > greeting.txt"})])
    async with serve(make_server, policy) as srv:
        job = _sandbox_job(reward_command="grep -qx hello greeting.txt")
        doc = await finished(srv, (await srv.client.submit_batch([job]))[0])
        assert doc["status"] == "done" and doc["reward"] == 0.0
        assert doc["eval"]["exit_code"] == 1
        assert_nothing_live(srv)


async def test_sandbox_task_network_off_by_default(make_server: ServerFactory) -> None:
    probe = (
        'python3 -c "import socket; s=socket.socket(); s.settimeout(2); '
        "s.connect(('1.1.1.1', 53))\""
    )
    policy = Script([("bash", {"command": "ip -o link 2>/dev/null | wc -l"})])
    async with serve(make_server, policy) as srv:
        doc = await finished(
            srv, await srv.client.submit("sandbox", _sandbox_job(reward_command=probe)["instance"])
        )
        assert doc["status"] == "done" and doc["reward"] == 0.0  # connect failed
        assert "unreachable" in doc["eval"]["output"].lower() or doc["eval"]["exit_code"] != 0


async def test_sandbox_task_without_reward_command(make_server: ServerFactory) -> None:
    async with serve(make_server, Script([])) as srv:
        doc = await finished(srv, await srv.client.submit("sandbox", {"prompt": "hi"}))
        assert doc["status"] == "done" and doc["reward"] is None


@pytest.mark.parametrize(
    ("instance", "needle"),
    [
        ({"prompt": "x", "tools": ["bash", "rm_rf"]}, "instance.tools"),
        ({"prompt": "x", "files": {"../escape": "x"}}, "files"),
        ({"prompt": ""}, "instance.prompt"),
        ({"tools": ["bash"]}, "prompt"),
        ({"prompt": "x", "max_turns": 0}, "instance.max_turns"),
    ],
)
async def test_sandbox_task_rejects_bad_instances(
    make_server: ServerFactory, instance: dict[str, Any], needle: str
) -> None:
    async with make_server() as srv:
        with pytest.raises(UnprocessableError, match=needle.replace(".", r"\.")):
            await srv.client.submit("sandbox", instance)


async def test_sandbox_task_cancel_mid_command_leaves_nothing(make_server: ServerFactory) -> None:
    policy = Script([("bash", {"command": "sleep 300", "timeout": 600})])
    async with serve(make_server, policy) as srv:
        job_id = await srv.client.submit("sandbox", _sandbox_job()["instance"])

        async def sleeping() -> bool:
            job = srv.service.store.get(job_id)
            sb = job.state.get("sandbox") if job is not None else None
            return sb is not None and any("sleep 300" in cmdline(p) for p in descendants(sb.pid))

        await eventually(sleeping, timeout=30)
        out = await srv.client.cancel(job_id)
        assert out["cancelled"] == [job_id]
        assert_nothing_live(srv)
        doc = await finished(srv, job_id)
        assert doc["status"] == "cancelled"
