"""Test doubles for the rollout tests: in-process tools and a handler that uses them."""

from __future__ import annotations

import json
from typing import Any

from prorl_async.core.agent import TOOL_SPECS, run_agent
from prorl_async.core.handler import AgentHandler
from prorl_async.core.job import Job
from prorl_async.llm.agent_loop import FINISH_TOOL_SPEC
from prorl_async.llm.toolcalls import ToolCallError
from prorl_async.scripted_llm.policies import tool_call


class FakeTools:
    """A ToolBox test double: deterministic observations, no sandbox (the LLM side is tested)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    @property
    def specs(self) -> list[dict[str, Any]]:
        return [*TOOL_SPECS.values(), FINISH_TOOL_SPEC]

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        self.calls.append((name, arguments))
        if name not in TOOL_SPECS:
            raise ToolCallError(f"unknown tool {name!r}")
        key = "command" if name != "python" else "code"
        if key not in arguments:
            raise ToolCallError(f"{name}: missing argument {key!r}")
        # Multi-byte text (CJK, emoji, a combining mark) in every observation.
        shown = json.dumps(arguments, sort_keys=True, ensure_ascii=False)[:200]
        return f"[{name}] ran {shown}\n输出：完成 ✓ 🙂 q\u0307\nexit 0"


class ToolUseHandler(AgentHandler):
    """Task ``tooluse``: the agent loop with FakeTools; reward = number of assistant turns."""

    name = "tooluse"

    async def run(self, job: Job) -> None:
        prompt = job.instance.get("prompt", "do the thing")
        messages = [
            {"role": "system", "content": "You are a test agent."},
            {"role": "user", "content": prompt},
        ]
        await run_agent(
            job, messages=messages, tools=FakeTools(), max_turns=job.instance.get("max_turns")
        )

    async def eval(self, job: Job) -> None:
        assert job.trajectory is not None
        job.reward = float(job.trajectory.to_result()["num_turns"])


CUT_REPLY = tool_call("bash", {"command": "ls"}) + " 龘𠜎龘𠜎龘𠜎"
FINISH_REPLY = '<tool_call>{"name": "finish"}</tool_call>'


class MultibytePolicy:
    """Scripted LLM policy: a tool call trailed by rare CJK characters, then ``finish``.

    The rare characters tokenize as byte pieces, so a ``max_tokens`` cut can end the engine's
    output in the middle of a character.
    """

    def reply(self, conversation: str) -> str:
        return FINISH_REPLY if "<tool_response>" in conversation else CUT_REPLY
