"""What the engine says about itself: its context window at registration, and an engine that
stops answering (vLLM after SIGTERM) is found out and its calls fail over.

The engine here is the scripted vLLM-protocol test double, which reports ``max_model_len``
in ``/v1/models``, answers a request beyond it with vLLM's HTTP 400, and on ``sigterm()``
behaves as vLLM does (stops listening, never answers the connections it holds).
``tests/engines/`` proves the same against the real vLLM.
"""

from __future__ import annotations

import asyncio

import pytest

from prorl_async.llm.pool import BackendPool, PoolConfig, RegistrationError
from prorl_async.scripted_llm import ScriptedLLM
from tests.helpers import ServerFactory
from tests.llm.pool.conftest import FAST, StartLLM, backend

PROMPT = [1, 2, 3, 4]


async def test_register_reads_the_engines_context_window(start_llm: StartLLM) -> None:
    llm = await start_llm(max_model_len=640, model="served")
    async with BackendPool(FAST) as pool:
        b = await pool.register(llm.address)
        assert (b.max_model_len, b.model) == (640, "served")
        assert pool.snapshot()[0]["max_model_len"] == 640
        async with pool.lease() as lease:
            assert lease.max_model_len == 640


async def test_register_refuses_what_is_not_an_engine(start_llm: StartLLM) -> None:
    llm = await start_llm()
    async with BackendPool(FAST) as pool:
        with pytest.raises(RegistrationError, match=r"did you mean .*/v1\?"):
            await pool.register(llm.root)  # the /v1 suffix forgotten
        await llm.kill()
        with pytest.raises(RegistrationError, match="does not answer like a vllm engine"):
            await pool.register(llm.address)
        assert pool.snapshot() == []


async def test_a_job_asking_more_than_the_engines_room_ends_length_not_400(
    start_llm: StartLLM, make_server: ServerFactory
) -> None:
    # The server allows 32k tokens of context and 3,000 new tokens a turn; the engine 1,200.
    llm = await start_llm(policy="finish", max_model_len=1200)
    async with make_server(max_tokens=3000, runtime="local") as srv:
        await srv.client.add_llm_server(llm.address)
        status = await srv.client.status()
        assert [b["max_model_len"] for b in status["backends"]] == [1200]
        [job] = await srv.client.submit_batch(
            [{"task": "math", "instance": {"problem": "What is 1 + 1?", "answer": "2"}}]
        )
        doc = await srv.client.result(job, wait=60)
    assert doc is not None
    assert doc["status"] == "done", doc["error"]
    assert len(doc["prompt_ids"]) + len(doc["response_ids"]) <= 1200
    sent = [e.body for e in llm.log if isinstance(e.body, dict)]
    assert sent and all(len(b["prompt"]) + b["max_tokens"] <= 1200 for b in sent)
    assert sent[0]["max_tokens"] < 3000
    assert all(e.status != 400 for e in llm.log)


async def test_an_engine_that_stops_answering_is_failed_over_not_waited_out(
    start_llm: StartLLM,
) -> None:
    a, b = await start_llm(), await start_llm()
    # A request timeout far beyond the test's bound: only the health probes can end the call.
    config = PoolConfig(
        failure_threshold=2,
        probe_interval_s=0.05,
        probe_timeout_s=0.5,
        retries=2,
        retry_backoff_s=0.0,
        request_timeout_s=600.0,
    )
    async with BackendPool(config) as pool:
        await pool.register(a.address)
        await pool.register(b.address)
        async with pool.lease() as lease:
            assert lease.address == a.address
            a.hold()
            call = asyncio.create_task(lease.generate(PROMPT, 8, {}))
            await a.wait_requests(1)
            a.sigterm()  # stops listening; the open request is never answered
            a.release()
            gen = await asyncio.wait_for(call, 30)
        assert gen.backend == b.address
        assert a.log[0].outcome == "stalled"
        assert not backend(pool, a.address).healthy


async def test_a_stalled_engine_with_no_other_backend_fails_the_call_naming_it(
    start_llm: StartLLM,
) -> None:
    from prorl_async.llm.pool import BackendError

    a: ScriptedLLM = await start_llm()
    config = PoolConfig(
        failure_threshold=2,
        probe_interval_s=0.05,
        probe_timeout_s=0.5,
        retries=2,
        retry_backoff_s=0.0,
        request_timeout_s=600.0,
    )
    async with BackendPool(config) as pool:
        await pool.register(a.address)
        async with pool.lease() as lease:
            a.hold()
            call = asyncio.create_task(lease.generate(PROMPT, 8, {}))
            await a.wait_requests(1)
            a.sigterm()
            a.release()
            with pytest.raises(BackendError, match="stopped answering") as info:
                await asyncio.wait_for(call, 30)
        assert info.value.address == a.address
