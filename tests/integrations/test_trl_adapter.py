"""The TRL adapter's contract on real servers (scripted LLM backends, the ``math`` task):
what ``rollout_func`` returns for each prompt, how groups spread over servers, and the
errors that stop a training run instead of letting it go on with stale weights. The TRL
run itself (torch, a real vLLM) is ``tests/train_demo/test_trl.py``."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from prorl_async.client import NotFoundError
from prorl_async.integrations.trl import (
    KEYS,
    RolloutsError,
    ServiceRollouts,
    WeightSyncError,
    completion_fields,
    dataset_row,
    parse_prompt,
    service_reward,
)
from prorl_async.scripted_llm import ScriptedLLM
from tests.handlers.policies import BoxedAnswer, PythonSolver, require_bwrap
from tests.helpers import Server, ServerFactory

LAZY = {"sandbox_start": "on_first_use"}


def row(a: int, b: int) -> str:
    instance = {"problem": f"What is {a} + {b}?", "answer": str(a + b)}
    return str(dataset_row("math", instance)["prompt"])


@asynccontextmanager
async def servers(
    make_server: ServerFactory, tmp_path: Path, n: int, policy: Any, **overrides: Any
) -> AsyncIterator[list[Server]]:
    """``n`` real servers, each with a scripted LLM of its own."""
    async with AsyncExitStack() as stack:
        out = []
        for i in range(n):
            llm = await stack.enter_async_context(ScriptedLLM(policy=policy))
            srv = await stack.enter_async_context(
                make_server(state_dir=str(tmp_path / f"state-{i}"), **LAZY, **overrides)
            )
            await srv.client.add_llm_server(llm.address)
            out.append(srv)
        yield out


def test_a_prompt_that_is_not_a_job_is_named() -> None:
    job = parse_prompt(row(3, 4))
    assert job == {"task": "math", "instance": {"problem": "What is 3 + 4?", "answer": "7"}}
    bad: list[tuple[Any, str]] = [
        ([{"role": "user", "content": "hi"}], "got a list"),
        ("What is 3 + 4?", "not JSON"),
        ('{"instance": {}}', "'task' string"),
        ('{"task": "math", "instance": "x"}', "'instance' must be an object"),
    ]
    for prompt, words in bad:
        with pytest.raises(ValueError, match=words):
            parse_prompt(prompt)


def test_a_job_that_did_not_finish_is_one_masked_pad_token() -> None:
    failed = {"status": "failed", "prompt_ids": [5, 6], "response_ids": [], "reward": None}
    fields = completion_fields(failed, pad_id=0)
    assert fields["completion_ids"] == [0] and fields["env_mask"] == [0]
    assert fields["reward"] is None and fields["prompt_ids"] == [5, 6]
    done = {
        "status": "done",
        "prompt_ids": [5, 6],
        "response_ids": [7, 8, 9],
        "response_mask": [1, 0, 1],
        "response_logprobs": [-0.5, None, -0.25],
        "response_versions": [2, None],  # shorter than the tokens: padded with None
        "reward": 1,
    }
    fields = completion_fields(done, pad_id=0)
    assert fields["env_mask"] == [1, 0, 1] and fields["logprobs"] == [-0.5, None, -0.25]
    assert fields["response_versions"] == [2, None, None] and fields["reward"] == 1.0
    assert service_reward([], [], reward=[1.0, None]) == [1.0, None]


async def test_groups_go_to_one_server_each_and_come_back_in_order(
    make_server: ServerFactory, tmp_path: Path
) -> None:
    group = 3
    prompts = [row(a, a) for a in (1, 2, 3, 4) for _ in range(group)]
    async with servers(make_server, tmp_path, 2, BoxedAnswer("4")) as (one, two):
        with ServiceRollouts([one.url, two.url], sampling_params={"max_tokens": 32}) as rollouts:
            out = await asyncio.to_thread(rollouts, prompts)
        assert set(out) == {*KEYS, "job_id"}
        assert all(len(out[k]) == len(prompts) for k in out)
        where = []
        for job_id in out["job_id"]:
            on = [i for i, s in enumerate((one, two)) if await _has(s, job_id)]
            assert len(on) == 1, job_id
            where.append(on[0])
        # Group g (prompts g*3 .. g*3+2) went whole to server g % 2.
        assert where == [g % 2 for g in range(4) for _ in range(group)]
        pairs = zip(where, out["job_id"], strict=True)
        docs = [await (one, two)[w].client.result(j) for w, j in pairs]
        for i, doc in enumerate(docs):
            assert doc is not None and doc["status"] == "done"
            assert out["completion_ids"][i] == doc["response_ids"]
            assert out["prompt_ids"][i] == doc["prompt_ids"]
            assert out["env_mask"][i] == doc["response_mask"]
            assert out["reward"][i] == doc["reward"]
        # Only "What is 2 + 2?" is answered right by a policy that always says 4.
        assert out["reward"] == [0.0] * 3 + [1.0] * 3 + [0.0] * 6


async def _has(srv: Server, job_id: str) -> bool:
    try:
        return await srv.client.result(job_id) is not None
    except NotFoundError:
        return False


async def test_tool_observations_are_outside_the_loss(
    make_server: ServerFactory, tmp_path: Path
) -> None:
    require_bwrap()
    solver = PythonSolver({"17 + 25": "print(17 + 25)"})
    async with servers(make_server, tmp_path, 1, solver, runtime="bwrap") as [srv]:
        with ServiceRollouts([srv.url]) as rollouts:
            out = await asyncio.to_thread(rollouts, [row(17, 25)] * 2)
        for i, job_id in enumerate(out["job_id"]):
            doc = await srv.client.result(job_id)
            assert doc is not None and doc["reward"] == 1.0, doc
            mask = out["env_mask"][i]
            assert mask == doc["response_mask"] and 0 in mask and 1 in mask
            assert len(out["completion_ids"][i]) == len(mask) == len(out["logprobs"][i])
            observation = [t for t, m in zip(out["completion_ids"][i], mask, strict=True) if not m]
            tool_turns = [t for t in doc["turns"] if t["role"] == "tool"]
            assert tool_turns and observation  # the kernel's output is in the ids, masked


async def test_a_load_that_fails_names_the_server_and_stale_tokens_stop_the_run(
    make_server: ServerFactory, tmp_path: Path
) -> None:
    ckpt = tmp_path / "ckpt"  # what the server's checks take for a checkpoint
    ckpt.mkdir()
    (ckpt / "config.json").write_text('{"model_type": "scripted"}')
    (ckpt / "model.safetensors").write_bytes(b"")
    async with servers(make_server, tmp_path, 2, BoxedAnswer("4")) as (one, two):
        with ServiceRollouts([one.url, two.url]) as rollouts:
            missing = tmp_path / "no-such-checkpoint"
            with pytest.raises(WeightSyncError, match="no-such-checkpoint") as err:
                await asyncio.to_thread(rollouts.load_weights, 1, missing)
            assert one.url in str(err.value) or two.url in str(err.value)
            assert rollouts.loaded_version is None
            # A checkpoint the scripted engines take: both serve version 1.
            await asyncio.to_thread(rollouts.load_weights, 1, ckpt)
            assert [b["weight_version"] for b in await one.client.weights()] == [1]
            out = await asyncio.to_thread(rollouts, [row(2, 2)] * 2)
            assert {v for vs in out["response_versions"] for v in vs} == {1}
            # One engine goes back to version 0: its tokens are stale, and the batch is refused.
            await two.client.pause_weights()
            await two.client.resume_weights(version=0)
            assert [b["weight_version"] for b in await two.client.weights()] == [0]
            with pytest.raises(RolloutsError, match="weight version 0, but version 1"):
                await asyncio.to_thread(rollouts, [row(1, 1)] * 2 + [row(2, 2)] * 2)


def test_the_docs_table_names_what_rollout_func_returns() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "integrations.md").read_text()
    trl = doc.split("## TRL", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)`(?: \(extra field\))? \|", trl, flags=re.M)
    assert set(rows) == {*KEYS, "job_id"} and len(rows) == len(set(rows))
