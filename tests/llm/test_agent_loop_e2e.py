"""The agent loop end to end: engine clients over loopback HTTP to the scripted LLM server.

The scripted LLM (a test double for vLLM/SGLang) decodes each prompt, lets a seeded policy
pick tool calls (some deliberately malformed) and answers with token ids and logprobs; the loop
must keep every id it returned and grow one buffer that is exactly what the server was sent.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from tokenizers import Tokenizer

from prorl_async.llm.agent_loop import FINISH_TOOL_SPEC, Trajectory, run_agent_loop
from prorl_async.llm.engines import EngineApi, complete, fetch_model
from prorl_async.llm.generation import Generation
from prorl_async.llm.tokenizer import ChatTokenizer
from prorl_async.scripted_llm import ScriptedLLM


class EngineGenerator:
    """A Generator over one engine address (what a backend lease provides in the server)."""

    def __init__(self, session: aiohttp.ClientSession, api: EngineApi, address: str, model: str):
        self.session, self.api, self.address, self.model = session, api, address, model

    async def generate(
        self, prompt_ids: list[int], max_tokens: int, sampling: dict[str, Any]
    ) -> Generation:
        return await complete(
            self.session,
            self.api,
            self.address,
            prompt_ids,
            max_tokens,
            sampling,
            model=self.model,
            timeout_s=30,
            weight_version=3,
        )


class CannedTools:
    """Test double for the sandbox tools: canned observations, every call recorded."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    @property
    def specs(self) -> list[dict[str, Any]]:
        names = ["bash", "python", "str_replace_editor"]
        tools = [{"type": "function", "function": {"name": n, "parameters": {}}} for n in names]
        return [*tools, FINISH_TOOL_SPEC]

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        self.calls.append(name)
        return f"{name} ok: {sorted(arguments)}"


def sent_prompt(entry: Any) -> list[int]:
    body = entry.body
    return list(body["prompt"] if "prompt" in body else body["input_ids"])


@pytest.mark.parametrize("api", ["vllm", "sglang"])
async def test_loop_against_scripted_llm_keeps_exact_ids(
    api: EngineApi, tok: ChatTokenizer, engine_vocab: Tokenizer | None
) -> None:
    llm_server = ScriptedLLM(policy="random_tools", seed=5, tokenizer=engine_vocab)
    async with llm_server as llm, aiohttp.ClientSession() as s:
        model = await fetch_model(s, llm.address) if api == "vllm" else "unused"
        gen = EngineGenerator(s, api, llm.address, model)
        errors = tool_turns = 0
        for episode in range(8):
            traj, tools = Trajectory(), CannedTools()
            messages = [{"role": "user", "content": f"Episode {episode}: count the files."}]
            start = len(llm.log)
            await run_agent_loop(
                generator=gen,
                tokenizer=tok,
                messages=messages,
                tools=tools,
                trajectory=traj,
                max_turns=10,
                max_model_len=8192,
                sampling={"temperature": 1.0},
                max_tokens=256,
            )
            log = llm.log[start:]
            assert traj.finish == "finish_tool" and traj.answer == "42"
            assert len(log) == traj.num_turns
            observations = [t["text"] for t in traj.turns if t["role"] == "tool"]
            errors += sum("Error:" in text for text in observations)
            tool_turns += len(observations)
            replies = [t for t in traj.turns if t["role"] == "assistant"]
            assert [sent_prompt(e) for e in log][0] == traj.prompt_ids
            last = sent_prompt(log[-1]) + replies[-1]["token_ids"]
            assert traj.prompt_ids + traj.response_ids == last
            model_ids = [i for i, m in zip(traj.response_ids, traj.response_mask, strict=True) if m]
            assert model_ids == [i for r in replies for i in r["token_ids"]]
            assert all(r["token_ids"][-1] == tok.eos_id for r in replies)
            assert traj.weight_versions == [3] and replies[0]["backend"] == llm.address
        # The seeded policy made real multi-turn episodes, some with malformed calls.
        assert tool_turns >= 8 and errors >= 1
