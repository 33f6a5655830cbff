"""Prompt batching (``pool.batch_prompts``) on a real vLLM: calls made together go as one
request with a list of prompts, and each gets what its own request would have."""

from __future__ import annotations

import asyncio

import pytest

from prorl_async.llm.generation import Generation
from prorl_async.llm.pool import BackendError, BackendPool, PoolConfig
from prorl_async.vllm_cpu import VllmProcess
from tests.engines.conftest import ENGINE_TIMEOUT, MAX_MODEL_LEN, running_requests
from tests.helpers import eventually

pytestmark = ENGINE_TIMEOUT

GREEDY = {"temperature": 0.0}
PROMPTS = [[100 + 7 * i, 2000 + 13 * i, 30 + i, 400 + 3 * i] for i in range(12)]


async def _generate_all(
    pool: BackendPool, prompts: list[list[int]], max_tokens: int = 8
) -> list[Generation | BaseException]:
    async def one(prompt: list[int]) -> Generation:
        async with pool.lease() as lease:
            return await lease.generate(prompt, max_tokens, GREEDY)

    return await asyncio.gather(*(one(p) for p in prompts), return_exceptions=True)


async def test_batched_calls_get_what_their_own_requests_get(vllm: VllmProcess) -> None:
    async with BackendPool() as pool:
        await pool.register(vllm.address)
        alone = await _generate_all(pool, PROMPTS)
        assert pool.batchers == {}
    async with BackendPool(PoolConfig(batch_prompts=5)) as pool:
        await pool.register(vllm.address)
        batched = await _generate_all(pool, PROMPTS)
        batcher = pool.batchers[vllm.address]
        # 12 calls made together, at most 5 a request.
        assert (batcher.prompts, batcher.requests) == (12, 3)
    for a, b in zip(alone, batched, strict=True):
        assert isinstance(a, Generation) and isinstance(b, Generation)
        assert b.token_ids == a.token_ids
        assert len(b.token_ids) == 8 and b.finish_reason == a.finish_reason == "length"
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)


async def test_a_prompt_the_engine_refuses_fails_alone(vllm: VllmProcess) -> None:
    too_long = list(range(1, MAX_MODEL_LEN + 10))
    prompts = [PROMPTS[0], too_long, PROMPTS[1]]
    async with BackendPool(PoolConfig(batch_prompts=8)) as pool:
        await pool.register(vllm.address)
        first, refused, last = await _generate_all(pool, prompts)
        # One batch refused whole (400), then each prompt on its own.
        assert pool.batchers[vllm.address].requests == 1 + 3
    assert isinstance(refused, BackendError), refused
    assert "400" in str(refused)
    assert isinstance(first, Generation) and isinstance(last, Generation)
    assert len(first.token_ids) == len(last.token_ids) == 8


async def test_a_cancelled_call_leaves_the_rest_of_its_batch(vllm: VllmProcess) -> None:
    long = {**GREEDY, "ignore_eos": True}
    async with BackendPool(PoolConfig(batch_prompts=4)) as pool:
        await pool.register(vllm.address)

        async def one(prompt: list[int]) -> Generation:
            async with pool.lease() as lease:
                return await lease.generate(prompt, 400, long)

        tasks = [asyncio.create_task(one(p)) for p in PROMPTS[:4]]
        await eventually(
            lambda: _running(vllm, 4), timeout=60, what="the batch's 4 prompts running"
        )
        tasks[1].cancel()
        done = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(done[1], asyncio.CancelledError)
        for gen in (done[0], done[2], done[3]):
            assert isinstance(gen, Generation) and len(gen.token_ids) == 400
        assert pool.batchers[vllm.address].requests == 1


async def _running(vllm: VllmProcess, n: int) -> bool:
    return await running_requests(vllm) >= n


def test_batch_prompts_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="batch_prompts must be >= 1, got 0"):
        PoolConfig(batch_prompts=0)
