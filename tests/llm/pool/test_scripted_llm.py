"""The scripted LLM test double itself: policies, limits, latency model, faults, CLI."""

from __future__ import annotations

import asyncio
import json
import signal
import sys

import aiohttp
import pytest

from prorl_async.scripted_llm import (
    EchoPolicy,
    LatencyModel,
    RandomToolsPolicy,
    ScriptedLLM,
    make_policy,
    synthetic_logprob,
)
from tests.llm.pool.conftest import StartLLM

USER = "<|im_start|>user\nPlease list the files.<|im_end|>\n"
GEN = "<|im_start|>assistant\n"


def test_random_tools_is_seeded_and_ends_with_finish() -> None:
    policy = RandomToolsPolicy(seed=3, max_turns=4)
    conversation = USER + GEN
    replies = []
    for _ in range(6):
        reply = policy.reply(conversation)
        assert reply == RandomToolsPolicy(seed=3, max_turns=4).reply(conversation)  # seeded
        replies.append(reply)
        if '"finish"' in reply:
            break
        conversation += reply + "<|im_end|>\n<|im_start|>user\n<tool_response>ok</tool_response>"
        conversation += "<|im_end|>\n" + GEN
    assert '"finish"' in replies[-1] and 2 <= len(replies) <= 5
    assert all("<tool_call>" in r for r in replies)


def test_random_tools_uses_all_tools_and_sometimes_malformed() -> None:
    names, broken = set(), 0
    for seed in range(200):
        reply = RandomToolsPolicy(seed=seed, max_turns=8).reply(USER + GEN)
        body = reply.split("<tool_call>\n", 1)[1].split("\n</tool_call>", 1)[0]
        try:
            call = json.loads(body)
            names.add(call["name"])
            call["arguments"]  # noqa: B018
        except (ValueError, KeyError, IndexError):
            broken += 1
    assert {"bash", "python", "str_replace_editor"} <= names
    assert 10 <= broken <= 60


def test_echo_and_unknown_policy() -> None:
    assert EchoPolicy().reply(USER + GEN) == "Please list the files."
    with pytest.raises(ValueError, match="random_tools"):
        make_policy("nope")


async def post(llm: ScriptedLLM, path: str, body: object) -> tuple[int, dict[str, object]]:
    async with aiohttp.ClientSession() as s, s.post(llm.root + path, json=body) as r:
        return r.status, await r.json()


async def test_reply_is_encoded_and_respects_max_tokens(start_llm: StartLLM) -> None:
    llm = await start_llm(policy="echo")
    ids = llm.tokenizer.encode(USER + GEN, add_special_tokens=False).ids
    body = {"model": "scripted-llm", "prompt": ids, "max_tokens": 100, "logprobs": 0}
    status, out = await post(llm, "/v1/completions", {**body, "return_token_ids": True})
    choice = out["choices"][0]  # type: ignore[index]
    expected = llm.tokenizer.encode("Please list the files.", add_special_tokens=False).ids
    assert status == 200 and choice["token_ids"] == expected + [llm.im_end]
    assert choice["finish_reason"] == "stop"
    lps = [synthetic_logprob(len(ids), i, t) for i, t in enumerate(choice["token_ids"])]
    assert choice["logprobs"]["token_logprobs"] == lps
    status, out = await post(
        llm, "/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 2}}
    )
    assert out["output_ids"] == expected[:2]
    assert out["meta_info"]["finish_reason"]["type"] == "length"  # type: ignore[index]


@pytest.mark.parametrize(
    ("path", "body", "named"),
    [
        ("/v1/completions", {"model": "scripted-llm", "prompt": "hello"}, "'prompt'"),
        (
            "/v1/completions",
            {"model": "scripted-llm", "prompt": [1], "max_tokens": 0},
            "'max_tokens'",
        ),
        (
            "/generate",
            {"input_ids": [1], "sampling_params": {"max_new_tokens": "x"}},
            "max_new_tokens",
        ),
        ("/generate", [1, 2], "JSON object"),
    ],
)
async def test_bad_requests_get_400_naming_the_field(
    start_llm: StartLLM, path: str, body: object, named: str
) -> None:
    llm = await start_llm()
    status, out = await post(llm, path, body)
    assert status == 400 and named in out["error"]["message"]  # type: ignore[index]
    assert llm.log[0].outcome == "bad_request"


async def test_capacity_caps_decoding_concurrency(start_llm: StartLLM) -> None:
    llm = await start_llm(latency=LatencyModel(ttft_s=0.01, per_token_s=0.001, capacity=2))
    body = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 8}}
    results = await asyncio.gather(*(post(llm, "/generate", body) for _ in range(6)))
    assert all(status == 200 for status, _ in results)
    assert llm.stats.peak_decoding == 2 and llm.stats.peak_active == 6
    assert llm.stats.served == 6 and llm.stats.active == 0


def test_latency_model_slows_down_with_concurrency() -> None:
    lat = LatencyModel(ttft_s=0.1, per_token_s=0.01, slowdown=0.5)
    assert lat.duration(10, 1) == pytest.approx(0.2)
    assert lat.duration(10, 3) == pytest.approx(0.1 + 10 * 0.01 * 2.0)
    with pytest.raises(ValueError, match="capacity"):
        LatencyModel(capacity=0)


async def test_down_switch_and_health(start_llm: StartLLM) -> None:
    llm = await start_llm()
    async with aiohttp.ClientSession() as s:
        async with s.get(llm.root + "/health") as r:
            assert r.status == 200
        llm.set_faults(down=True)
        async with s.get(llm.root + "/health") as r:
            assert r.status == 503
    status, _ = await post(llm, "/generate", {"input_ids": [1]})
    assert status == 503 and llm.log[-1].outcome == "error"


async def test_cli_serves_until_sigterm() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "prorl_async.scripted_llm",
        "--port",
        "0",
        "--policy",
        "random_tools",
        "--per-token",
        "0.0001",
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        assert line.startswith("scripted-llm listening on http://127.0.0.1:")
        address = line.split()[-1]
        async with aiohttp.ClientSession() as s, s.get(f"{address}/models") as r:
            assert (await r.json())["data"][0]["id"] == "scripted-llm"
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_cli_rejects_bad_flags() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "prorl_async.scripted_llm",
        "--port",
        "0",
        "--error-rate",
        "2",
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2 and b"error_rate" in err
