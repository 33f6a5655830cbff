"""Weight updates through the pool, against the scripted engines (TEST DOUBLES of vLLM's
dev-mode routes and SGLang's): pause, load and resume in every mode, and what a turn
interrupted by them records. ``tests/engines/test_weights.py`` does the same on vLLM."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from prorl_async.llm.pool import BackendPool, PoolConfig
from prorl_async.llm.weights import WeightsError
from prorl_async.scripted_llm import LatencyModel, ScriptedLLM
from prorl_async.scripted_llm.policies import tool_call
from prorl_async.util.timer import PausableTimer
from tests.helpers import ServerFactory, eventually
from tests.llm.pool.conftest import StartLLM

PROMPT = [1, 2, 3, 4]
CONFIG = PoolConfig(probe_interval_s=0.05, retries=2, retry_backoff_s=0.0)
SLOW = LatencyModel(per_token_s=0.01)  # 100 tokens take ~1 s: time to interrupt them


def checkpoint(tmp_path: Path) -> str:
    """A directory that looks like a checkpoint to the server's checks (the double loads it)."""
    (tmp_path / "config.json").write_text('{"model_type": "scripted"}')
    (tmp_path / "model.safetensors").write_bytes(b"")
    return str(tmp_path)


def long_reply(llm: ScriptedLLM) -> None:
    """The double's reply: 300 tokens of text (the 'finish' policy's is short)."""
    llm.policy = _Words()


class _Words:
    def reply(self, conversation: str) -> str:
        return " ".join(f"w{i}" for i in range(300))


class _PythonThenFinish:
    def reply(self, conversation: str) -> str:
        if "<tool_response>" in conversation:
            return tool_call("finish", {"answer": "4"})
        return tool_call("python", {"code": "print(2 + 2)"})


async def _started(llm: ScriptedLLM, count: int = 1) -> None:
    await llm.wait_requests(count)
    await eventually(lambda: llm.stats.decoding >= 1)  # a slot is taken right after arrival


@pytest.mark.parametrize("api", ["vllm", "sglang"])
async def test_abort_keeps_the_partial_turn_and_continues_it_under_the_new_weights(
    start_llm: StartLLM, tmp_path: Path, api: str
) -> None:
    llm = await start_llm(latency=SLOW, api=api)
    long_reply(llm)
    address = llm.address if api == "vllm" else llm.root
    async with BackendPool(CONFIG) as pool:
        await pool.register(address, api=api, weight_version=1)  # type: ignore[arg-type]
        async with pool.lease() as lease:
            call = asyncio.create_task(lease.generate(PROMPT, 100, {}))
            await _started(llm)
            load = asyncio.create_task(pool.weights.load(2, checkpoint(tmp_path), "abort"))
            gen = await call
            result = await load
    assert result["version"] == 2 and result["backends"][address]["ok"]
    assert len(gen.token_ids) == len(gen.logprobs) == 100 and gen.finish_reason == "length"
    first, second = gen.segments
    assert (first.start, first.weight_version) == (0, 1) and first.end == second.start
    assert (second.end, second.weight_version) == (100, 2)
    assert 0 < first.end < 100
    # The engine saw the turn twice: the prompt, then prompt + what it had made, for the rest.
    bodies = [e.body for e in llm.log]
    key = "prompt" if api == "vllm" else "input_ids"
    budget = "max_tokens" if api == "vllm" else None
    assert bodies[1][key] == PROMPT + gen.token_ids[: first.end]
    if budget:
        assert bodies[1][budget] == 100 - first.end
    assert llm.weights.loads == [str(tmp_path)] and llm.weights.version == "2"
    assert pool.stats.interrupted == 1 and pool.stats.tokens_kept == first.end


async def test_keep_freezes_the_call_and_marks_its_boundary_unknown(
    start_llm: StartLLM, tmp_path: Path
) -> None:
    llm = await start_llm(latency=SLOW)
    long_reply(llm)
    timer = PausableTimer(None)
    timer.resume()
    async with BackendPool(CONFIG) as pool:
        await pool.register(llm.address, weight_version=1)
        async with pool.lease(timer) as lease:
            call = asyncio.create_task(lease.generate(PROMPT, 100, {}))
            await _started(llm)
            await pool.weights.pause("keep")
            assert not timer.running  # a frozen call is not its job's time
            await pool.weights.resume(2)
            gen = await call
    [seg] = gen.segments
    assert (seg.start, seg.end, seg.weight_version, seg.weight_version_end) == (0, 100, 1, 2)
    assert len(llm.log) == 1 and timer.running


async def test_wait_lets_in_flight_turns_finish_on_the_old_weights(
    start_llm: StartLLM, tmp_path: Path
) -> None:
    llm = await start_llm(latency=SLOW)
    long_reply(llm)
    async with BackendPool(CONFIG) as pool:
        await pool.register(llm.address, weight_version=1)
        async with pool.lease() as lease:
            call = asyncio.create_task(lease.generate(PROMPT, 50, {}))
            await _started(llm)
            await pool.weights.pause("wait")
            assert call.done()  # the pause returned only once the turn had finished
            gen = await call
            later = asyncio.create_task(lease.generate(PROMPT, 5, {}))
            await asyncio.sleep(0)
            assert not later.done()  # paused: nothing new is sent
            await pool.weights.resume(2)
            after = await later
    assert [s.weight_version for s in gen.segments] == [1] and len(gen.token_ids) == 50
    assert [s.weight_version for s in after.segments] == [2]


async def test_sglang_is_told_not_to_abort_on_version_and_load(
    start_llm: StartLLM, tmp_path: Path
) -> None:
    llm = await start_llm(latency=SLOW, api="sglang")
    long_reply(llm)
    async with BackendPool(CONFIG) as pool:
        await pool.register(llm.root, api="sglang", weight_version=1)
        async with pool.lease() as lease:
            call = asyncio.create_task(lease.generate(PROMPT, 60, {}))
            await _started(llm)
            await pool.weights.load(2, checkpoint(tmp_path), "keep")  # in_place: nothing aborted
            gen = await call
    assert llm.weights.aborted == 0 and len(llm.log) == 1
    assert len(gen.token_ids) == 60 and llm.weights.version == "2"
    body = next(e for e in llm.log if e.route == "/generate").body
    assert body["input_ids"] == PROMPT


async def test_the_sglang_double_aborts_on_a_bare_version_update(start_llm: StartLLM) -> None:
    import aiohttp

    llm = await start_llm(latency=SLOW, api="sglang")
    long_reply(llm)
    async with aiohttp.ClientSession() as s:
        gen = asyncio.create_task(
            s.post(
                f"{llm.root}/generate",
                json={
                    "input_ids": PROMPT,
                    "return_logprob": True,
                    "sampling_params": {"max_new_tokens": 80},
                },
            )
        )
        await _started(llm)
        async with s.post(f"{llm.root}/update_weight_version", json={"new_version": "3"}) as r:
            assert r.status == 200
        async with await gen as resp:
            doc = await resp.json()
    assert doc["meta_info"]["finish_reason"]["type"] == "abort" and len(doc["output_ids"]) < 80


async def test_a_checkpoint_that_is_not_there_is_refused_before_any_pause(
    start_llm: StartLLM, tmp_path: Path
) -> None:
    llm = await start_llm()
    async with BackendPool(CONFIG) as pool:
        await pool.register(llm.address, weight_version=1)
        with pytest.raises(WeightsError) as info:
            await pool.weights.load(2, str(tmp_path / "missing"), "abort")
        assert info.value.status == 422 and "no such directory" in info.value.detail
        assert not llm.weights.paused and pool.weights.snapshot()[0]["paused"] is False
        with pytest.raises(WeightsError) as unknown:
            await pool.weights.pause("abort", ["http://127.0.0.1:1/v1"])
        assert unknown.value.status == 422 and "not registered" in unknown.value.detail


async def test_a_job_records_a_version_per_token_and_none_for_observations(
    start_llm: StartLLM, make_server: ServerFactory, tmp_path: Path
) -> None:
    llm = await start_llm(policy=_PythonThenFinish())
    async with make_server(runtime="local") as srv:
        await srv.client.add_llm_server(llm.address, weight_version=7)
        [job] = await srv.client.submit_batch(
            [{"task": "math", "instance": {"problem": "2+2?", "answer": "4"}}]
        )
        doc = await srv.client.result(job, wait=60)
        weights = await srv.client.weights()
    assert doc is not None and doc["status"] == "done", doc and doc["error"]
    versions, mask = doc["response_versions"], doc["response_mask"]
    assert len(versions) == len(doc["response_ids"])
    assert all((v == 7) if m else (v is None) for v, m in zip(versions, mask, strict=True))
    turns = [t for t in doc["turns"] if t["role"] == "assistant"]
    assert all(
        t["segments"] == [{"start": 0, "end": len(t["token_ids"]), "weight_version": 7}]
        for t in turns
    )
    assert doc["weight_versions"] == [7]
    expected = {
        "address": llm.address,
        "weight_version": 7,
        "paused": False,
        "weights_path": "scripted-llm",
        "loaded_at": None,
        "last_load_s": None,
        "healthy": True,
        "resync": None,
    }
    assert weights == [expected]


async def test_regenerate_mode_starts_the_turn_over_under_the_new_weights(
    start_llm: StartLLM, tmp_path: Path
) -> None:
    llm = await start_llm(latency=SLOW)
    long_reply(llm)
    config = PoolConfig(probe_interval_s=0.05, retries=2, on_interrupt="regenerate")
    async with BackendPool(config) as pool:
        await pool.register(llm.address, weight_version=1)
        async with pool.lease() as lease:
            call = asyncio.create_task(lease.generate(PROMPT, 100, {}))
            await _started(llm)
            await pool.weights.load(2, checkpoint(tmp_path), "abort")
            gen = await call
    assert [(s.start, s.end, s.weight_version) for s in gen.segments] == [(0, 100, 2)]
    first, second = (e.body for e in llm.log)
    assert second["prompt"] == PROMPT and second["max_tokens"] == 100
    assert first["max_tokens"] == 100
    assert pool.stats.tokens_kept == 0 and pool.stats.tokens_discarded > 0


async def test_a_caller_that_goes_away_mid_load_leaves_nothing_paused(
    start_llm: StartLLM, tmp_path: Path
) -> None:
    llm = await start_llm(latency=SLOW)
    long_reply(llm)
    async with BackendPool(CONFIG) as pool:
        await pool.register(llm.address, weight_version=1)
        async with pool.lease() as lease:
            call = asyncio.create_task(lease.generate(PROMPT, 80, {}))
            await _started(llm)
            load = asyncio.create_task(pool.weights.load(2, checkpoint(tmp_path), "wait"))
            await eventually(lambda: llm.weights.paused)  # waiting for the turn to finish
            load.cancel()  # the HTTP client went away
            with pytest.raises(asyncio.CancelledError):
                await load
            await call
            await eventually(lambda: not pool.weights.snapshot()[0]["paused"])
    assert not llm.weights.paused and llm.weights.version == "2"
