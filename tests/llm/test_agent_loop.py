"""The token-in/token-out agent loop, driven by an in-process generator test double."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgspec
import pytest

from prorl_async.llm.agent_loop import FINISH_TOOL_SPEC, TokenDriftError, Trajectory, run_agent_loop
from prorl_async.llm.generation import Generation
from prorl_async.llm.tokenizer import ChatTokenizer
from prorl_async.llm.toolcalls import ToolCallError
from tests.qwen import byte_chars

MESSAGES = [{"role": "user", "content": "How many files are in the folder?"}]


class Reply(msgspec.Struct):
    ids: list[int]
    finish_reason: str = "stop"
    weight_version: int | str | None = 1
    clamped: int = 0


class ScriptedGenerator:
    """Test double for a backend lease: records every request and returns scripted ids.

    A reply longer than the request's ``max_tokens`` is cut and reported as ``length``, as an
    engine would. ``hold`` (when set) makes the call with that index wait for it.
    """

    def __init__(self, replies: list[Reply]) -> None:
        self.replies = list(replies)
        self.requests: list[tuple[list[int], int, dict[str, Any]]] = []
        self.completions: list[Generation] = []
        self.entered = asyncio.Event()
        self.hold: tuple[int, asyncio.Event] | None = None

    async def generate(
        self, prompt_ids: list[int], max_tokens: int, sampling: dict[str, Any]
    ) -> Generation:
        self.requests.append((list(prompt_ids), max_tokens, dict(sampling)))
        if self.hold is not None and self.hold[0] == len(self.requests) - 1:
            self.entered.set()
            await self.hold[1].wait()
        reply = self.replies.pop(0)
        ids = reply.ids[:max_tokens]
        finish = "length" if len(ids) < len(reply.ids) else reply.finish_reason
        base = len(self.completions) + 1
        gen = Generation(
            token_ids=ids,
            logprobs=[-base - i / 1000 for i in range(len(ids))],
            finish_reason=finish,
            backend=f"http://double-{base % 2}/v1",
            weight_version=reply.weight_version,
            clamped=reply.clamped,
        )
        self.completions.append(gen)
        return gen


class FakeToolBox:
    """Test double for a task's tools: records calls; ``fail`` reports a bad call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    @property
    def specs(self) -> list[dict[str, Any]]:
        names = ["bash", "fail"]
        specs = [{"type": "function", "function": {"name": n, "parameters": {}}} for n in names]
        return [*specs, FINISH_TOOL_SPEC]

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        self.calls.append((name, arguments))
        if name == "fail":
            raise ToolCallError("no such path")
        return f"ran {arguments.get('command')}"


def odd_ids(tok: ChatTokenizer, text: str, *, end: bool = True) -> list[int]:
    """Ids for ``text`` one character at a time: valid output a text round trip would change."""
    ids = [i for ch in text for i in tok.encode(ch)]
    assert tok.encode(tok.decode(ids)) != ids or len(text) < 2
    return ids + ([tok.eos_id] if end else [])


def call(name: str, **arguments: Any) -> str:
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


async def run(
    gen: ScriptedGenerator,
    tok: ChatTokenizer,
    *,
    max_turns: int = 8,
    max_model_len: int = 4096,
    max_tokens: int = 512,
    traj: Trajectory | None = None,
) -> tuple[Trajectory, FakeToolBox]:
    traj = Trajectory() if traj is None else traj
    tools = FakeToolBox()
    await run_agent_loop(
        generator=gen,
        tokenizer=tok,
        messages=MESSAGES,
        tools=tools,
        trajectory=traj,
        max_turns=max_turns,
        max_model_len=max_model_len,
        sampling={"temperature": 1.0, "max_tokens": 99},
        max_tokens=max_tokens,
    )
    return traj, tools


def check_invariants(traj: Trajectory, gen: ScriptedGenerator) -> None:
    n = len(traj.response_ids)
    assert len(traj.response_mask) == n and len(traj.response_logprobs) == n
    model = [t for t, m in zip(traj.response_ids, traj.response_mask, strict=True) if m == 1]
    assert model == [t for g in gen.completions for t in g.token_ids]
    lps = [lp for lp, m in zip(traj.response_logprobs, traj.response_mask, strict=True) if m]
    assert lps == [lp for g in gen.completions for lp in g.logprobs]
    assert all(
        lp == 0.0 for lp, m in zip(traj.response_logprobs, traj.response_mask, strict=True) if not m
    )
    last_prompt, _, _ = gen.requests[-1]
    assert traj.prompt_ids + traj.response_ids == last_prompt + gen.completions[-1].token_ids
    assert gen.requests[0][0] == traj.prompt_ids
    for (before, _, _), (after, _, _) in zip(gen.requests, gen.requests[1:], strict=False):
        assert after[: len(before)] == before
    assert [t for turn in traj.turns for t in turn["token_ids"]] == traj.response_ids


async def test_multi_turn_keeps_exact_ids_and_ends_on_finish(tok: ChatTokenizer) -> None:
    gen = ScriptedGenerator(
        [
            Reply(odd_ids(tok, "Let me look. " + call("bash", command="ls")), weight_version=7),
            Reply(odd_ids(tok, call("bash", command="wc -l")), weight_version=7, clamped=2),
            Reply(tok.encode(call("finish", answer="2")) + [tok.eos_id], weight_version=8),
        ]
    )
    traj, tools = await run(gen, tok)
    check_invariants(traj, gen)
    assert traj.finish == "finish_tool" and traj.answer == "2"
    assert tools.calls == [("bash", {"command": "ls"}), ("bash", {"command": "wc -l"})]
    assert [t["role"] for t in traj.turns] == ["assistant", "tool"] * 2 + ["assistant"]
    assert traj.num_turns == 3 and traj.weight_versions == [7, 8] and traj.clamped_logprobs == 2
    first = traj.turns[0]
    assert first["backend"] == "http://double-1/v1" and first["weight_version"] == 7
    assert first["text"] == "Let me look. " + call("bash", command="ls") + "<|im_end|>"
    assert "<tool_response>\nran ls\n</tool_response>" in traj.turns[1]["text"]
    assert tok.decode(traj.turns[1]["token_ids"]) == traj.turns[1]["text"]
    assert all(sampling == {"temperature": 1.0} for _, _, sampling in gen.requests)
    result = traj.to_result()
    assert result["num_turns"] == 3 and result["finish"] == "finish_tool"
    assert result["response_ids"] == traj.response_ids and result["turns"] == traj.turns
    msgspec.json.encode(result)


async def test_reply_without_tool_call_ends_the_loop(tok: ChatTokenizer) -> None:
    gen = ScriptedGenerator([Reply(odd_ids(tok, "There are 2 files."))])
    traj, tools = await run(gen, tok)
    check_invariants(traj, gen)
    assert traj.finish == "no_tool_call" and traj.answer is None and tools.calls == []
    assert traj.response_mask == [1] * len(traj.response_ids)


async def test_malformed_unknown_and_failing_calls_become_observations(tok: ChatTokenizer) -> None:
    bad = "<tool_call>{oops}</tool_call>" + call("rm_rf") + call("fail", path="/x")
    gen = ScriptedGenerator([Reply(odd_ids(tok, bad)), Reply(odd_ids(tok, call("finish")))])
    traj, tools = await run(gen, tok)
    check_invariants(traj, gen)
    assert traj.finish == "finish_tool" and traj.answer is None
    obs = traj.turns[1]["text"]
    assert "Error: malformed tool call: tool call is not valid JSON" in obs
    assert "Error: unknown tool 'rm_rf' (available: bash, fail, finish)" in obs
    assert "Error: no such path" in obs
    assert tools.calls == [("fail", {"path": "/x"})]


async def test_calls_before_finish_run_and_non_string_answer_is_json(tok: ChatTokenizer) -> None:
    reply = call("bash", command="touch done") + call("finish", answer=42) + call("bash")
    gen = ScriptedGenerator([Reply(odd_ids(tok, reply))])
    traj, tools = await run(gen, tok)
    check_invariants(traj, gen)
    assert traj.finish == "finish_tool" and traj.answer == "42"
    assert tools.calls == [("bash", {"command": "touch done"})]


async def test_max_turns_stops_before_running_the_last_calls(tok: ChatTokenizer) -> None:
    gen = ScriptedGenerator([Reply(odd_ids(tok, call("bash", command=str(i)))) for i in range(3)])
    traj, tools = await run(gen, tok, max_turns=2)
    check_invariants(traj, gen)
    assert traj.finish == "max_turns" and traj.num_turns == 2
    assert tools.calls == [("bash", {"command": "0"})]
    assert [t["role"] for t in traj.turns] == ["assistant", "tool", "assistant"]


async def test_length_finish_gets_end_of_turn_appended_as_mask_zero(tok: ChatTokenizer) -> None:
    cut = odd_ids(tok, call("bash", command="ls") + " and then", end=False)
    gen = ScriptedGenerator([Reply(cut, finish_reason="length"), Reply(odd_ids(tok, "Done."))])
    traj, _ = await run(gen, tok)
    check_invariants(traj, gen)
    start = len(cut)
    assert traj.response_ids[start] == tok.eos_id and traj.response_mask[start] == 0
    assert traj.turns[1]["text"].startswith("<|im_end|>\n<|im_start|>user\n<tool_response>")
    assert traj.finish == "no_tool_call"


async def test_length_without_tool_call_ends_with_length(tok: ChatTokenizer) -> None:
    gen = ScriptedGenerator([Reply(odd_ids(tok, "a long ramble", end=False) * 3)])
    traj, _ = await run(gen, tok, max_tokens=5)
    check_invariants(traj, gen)
    assert traj.finish == "length" and len(traj.response_ids) == 5


async def test_context_exhaustion_cuts_max_tokens_then_ends(tok: ChatTokenizer) -> None:
    prompt_len = len(tok.prompt_ids(MESSAGES, FakeToolBox().specs))
    first = odd_ids(tok, call("bash", command="ls"))
    obs_len = len(tok.observation_ids([{"role": "tool", "content": "ran ls"}], prev_ended=True))
    limit = prompt_len + len(first) + obs_len + 10
    gen = ScriptedGenerator([Reply(first), Reply(odd_ids(tok, "the answer " * 10))])
    traj, _ = await run(gen, tok, max_model_len=limit, max_tokens=512)
    check_invariants(traj, gen)
    assert [m for _, m, _ in gen.requests] == [len(first) + obs_len + 10, 10]
    assert traj.finish == "context_exhausted" and len(traj.prompt_ids + traj.response_ids) == limit


async def test_observation_that_would_overflow_is_not_appended(tok: ChatTokenizer) -> None:
    prompt_len = len(tok.prompt_ids(MESSAGES, FakeToolBox().specs))
    first = odd_ids(tok, call("bash", command="ls"))
    gen = ScriptedGenerator([Reply(first)])
    traj, tools = await run(gen, tok, max_model_len=prompt_len + len(first) + 3)
    check_invariants(traj, gen)
    assert traj.finish == "context_exhausted" and tools.calls == [("bash", {"command": "ls"})]
    assert [t["role"] for t in traj.turns] == ["assistant"]


async def test_prompt_already_too_long(tok: ChatTokenizer) -> None:
    gen = ScriptedGenerator([])
    traj, _ = await run(gen, tok, max_model_len=10)
    assert traj.finish == "context_exhausted" and gen.requests == [] and traj.turns == []
    assert len(traj.prompt_ids) > 10


async def test_cancel_mid_loop_keeps_the_turns_so_far(tok: ChatTokenizer) -> None:
    gen = ScriptedGenerator(
        [Reply(odd_ids(tok, call("bash", command="ls"))), Reply(odd_ids(tok, "x"))]
    )
    gen.hold = (1, asyncio.Event())
    traj = Trajectory()
    task = asyncio.ensure_future(run(gen, tok, traj=traj))
    await gen.entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [t["role"] for t in traj.turns] == ["assistant", "tool"] and traj.finish is None
    assert traj.prompt_ids + traj.response_ids == gen.requests[-1][0]


async def test_bad_backend_output_and_bad_limits_are_named(tok: ChatTokenizer) -> None:
    class Liar(ScriptedGenerator):
        async def generate(
            self, prompt_ids: list[int], max_tokens: int, sampling: dict[str, Any]
        ) -> Generation:
            return Generation(token_ids=[1, 2], logprobs=[0.0], finish_reason="stop", backend="b")

    with pytest.raises(ValueError, match="returned 2 token ids but 1 logprobs"):
        await run(Liar([]), tok)
    with pytest.raises(ValueError, match="max_turns must be a positive integer, got 0"):
        await run(ScriptedGenerator([]), tok, max_turns=0)


def byte_ids(tok: ChatTokenizer, text: str) -> list[int]:
    """One id per UTF-8 byte of ``text``: what an engine may sample for a multi-byte character."""
    chars = byte_chars()
    found = [tok.hf_tokenizer.token_to_id(chars[b]) for b in text.encode()]
    ids = [i for i in found if i is not None]
    assert len(ids) == len(found), "the vocabulary lacks a byte token"
    return ids


# NFC-stable (both vocabularies normalize to NFC): q + U+0307 has no precomposed form.
CJK_OBS = "目录：a.txt 文件 ñ q\u0307 👩‍💻 🇫🇷 مرحبا नमस्ते"


async def test_multibyte_text_split_across_turns_and_mid_character_cut(
    tok: ChatTokenizer,
) -> None:
    first = byte_ids(tok, "让我看看 🙂 ") + tok.encode(call("bash", command=CJK_OBS)) + [tok.eos_id]
    # A reply cut by max_tokens after the first byte of '好': the engine's ids end mid-character.
    cut = odd_ids(tok, "结果 " + call("bash", command="再来") + " 好", end=False)[:-1]
    cut += byte_ids(tok, "好")[:1]
    gen = ScriptedGenerator(
        [Reply(first), Reply(cut, finish_reason="length"), Reply(byte_ids(tok, "完成。"))]
    )
    traj, tools = await run(gen, tok)
    check_invariants(traj, gen)
    assert tools.calls == [("bash", {"command": CJK_OBS}), ("bash", {"command": "再来"})]
    assert traj.turns[0]["text"].startswith("让我看看 🙂 <tool_call>")
    obs = traj.turns[1]
    assert f"ran {CJK_OBS}" in obs["text"] and tok.decode(obs["token_ids"]) == obs["text"]
    cut_turn = traj.turns[2]
    assert cut_turn["token_ids"] == cut and cut_turn["text"].endswith("\ufffd")
    # The missing end of turn is appended (mask 0) right after the dangling byte.
    after = traj.turns[3]["token_ids"]
    assert after[0] == tok.eos_id and traj.turns[3]["text"].startswith(tok.eos_token)
    assert traj.turns[4]["text"] == "完成。" and traj.finish == "no_tool_call"
    # A text round trip could not have kept these ids: the dangling byte decodes to U+FFFD.
    buffer = traj.prompt_ids + traj.response_ids
    assert tok.encode(tok.decode(buffer)) != buffer


async def test_observation_ids_do_not_depend_on_the_bytes_before_them(tok: ChatTokenizer) -> None:
    # Two histories ending in different partial characters get the very same observation ids.
    segments = []
    for tail in ("é", "好", "🙂"):
        reply = byte_ids(tok, call("bash", command="ls") + " " + tail)[:-1]
        gen = ScriptedGenerator([Reply(reply, finish_reason="length"), Reply(odd_ids(tok, "ok"))])
        traj, _ = await run(gen, tok)
        check_invariants(traj, gen)
        segments.append(traj.turns[1]["token_ids"])
    assert segments[0] == segments[1] == segments[2]


async def test_a_generator_that_changes_the_lent_buffer_is_caught(tok: ChatTokenizer) -> None:
    class Meddler(ScriptedGenerator):
        async def generate(
            self, prompt_ids: list[int], max_tokens: int, sampling: dict[str, Any]
        ) -> Generation:
            prompt_ids.append(tok.eos_id)  # the buffer is lent, not copied: this is a bug
            return await super().generate(prompt_ids, max_tokens, sampling)

    gen = Meddler([Reply(odd_ids(tok, call("bash", command="ls")))])
    with pytest.raises(TokenDriftError, match="no longer prompt_ids \\+ response_ids"):
        await run(gen, tok)
