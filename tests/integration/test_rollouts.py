"""Token-in/token-out rollouts through the real server against scripted LLM test doubles."""

from __future__ import annotations

import asyncio
from typing import Any

from tokenizers import Tokenizer

from prorl_async.llm.tokenizer import ChatTokenizer
from prorl_async.scripted_llm import LatencyModel, ScriptedLLM
from prorl_async.scripted_llm.policies import tool_call
from tests.helpers import Server, ServerFactory, eventually
from tests.integration.fakes import CUT_REPLY, FINISH_REPLY, MultibytePolicy, ToolUseHandler


def _served(llms: list[ScriptedLLM]) -> dict[tuple[int, ...], tuple[str, list[int], list[float]]]:
    """prompt ids -> (backend address, completion ids, logprobs) for every answered request."""
    out = {}
    for llm in llms:
        for entry in llm.log:
            if entry.outcome != "ok":
                continue
            if entry.route.endswith("completions"):
                prompt = entry.body["prompt"]
                choice = entry.response["choices"][0]
                ids, lps = choice["token_ids"], choice["logprobs"]["token_logprobs"]
            else:
                prompt = entry.body["input_ids"]
                triples = entry.response["meta_info"]["output_token_logprobs"]
                ids, lps = entry.response["output_ids"], [t[0] for t in triples]
            out[tuple(prompt)] = (llm.address, ids, lps)
    return out


def check_token_invariants(doc: dict[str, Any], served: dict[tuple[int, ...], Any]) -> None:
    ids, mask, lps = doc["response_ids"], doc["response_mask"], doc["response_logprobs"]
    assert len(ids) == len(mask) == len(lps)
    buffer = list(doc["prompt_ids"])
    last_request: list[int] = []
    pos = 0
    for turn in doc["turns"]:
        n = len(turn["token_ids"])
        assert ids[pos : pos + n] == turn["token_ids"]
        if turn["role"] == "assistant":
            assert mask[pos : pos + n] == [1] * n
            backend, got_ids, got_lps = served[tuple(buffer)]  # the exact request sent
            assert turn["token_ids"] == got_ids and turn["logprobs"] == got_lps
            assert lps[pos : pos + n] == got_lps and turn["backend"] == backend
            last_request = buffer + got_ids
        else:
            assert mask[pos : pos + n] == [0] * n and lps[pos : pos + n] == [0.0] * n
        buffer += turn["token_ids"]
        pos += n
    assert pos == len(ids)
    # prompt + response is exactly the last request's prompt plus its completion
    assert doc["prompt_ids"] + ids == last_request


async def _drain(srv: Server, ids: list[str], wait: float = 60) -> dict[str, dict[str, Any]]:
    docs: dict[str, dict[str, Any]] = {}
    pending = list(ids)
    async with asyncio.timeout(wait):
        while pending:
            out = await srv.client.poll(pending, wait=10)
            docs.update({d["job_id"]: d for d in out["done"]})
            pending = out["pending"]
    return docs


async def test_token_invariants_on_200_random_tool_trajectories(
    make_server: ServerFactory, vocab: str | None, engine_vocab: Tokenizer | None
) -> None:
    async with (
        ScriptedLLM(tokenizer=engine_vocab, policy="random_tools", seed=7) as a,
        ScriptedLLM(
            tokenizer=engine_vocab,
            policy="random_tools",
            seed=7,
        ) as b,
        make_server(handlers=(ToolUseHandler(),), tokenizer=vocab) as srv,
    ):
        await srv.client.add_llm_server(a.address, weight_version=1)
        await srv.client.add_llm_server(b.address, api="sglang", weight_version=1)
        jobs = [
            {
                "task": "tooluse",
                "instance": {"prompt": f"job {i}: explore"},
                "sampling_params": {"temperature": 0.7, "max_tokens": 256},
            }
            for i in range(200)
        ]
        docs = await _drain(srv, await srv.client.submit_batch(jobs))
        served = _served([a, b])
        multi = 0
        for doc in docs.values():
            assert doc["status"] == "done", doc["error"]
            check_token_invariants(doc, served)
            backends = {t["backend"] for t in doc["turns"] if t["role"] == "assistant"}
            assert len(backends) == 1  # affinity: one backend for the whole RUN stage
            multi += doc["num_turns"] > 1
        assert multi > 100
        assert {d["turns"][0]["backend"] for d in docs.values()} == {a.address, b.address}


async def test_request_bodies_field_by_field(
    make_server: ServerFactory, vocab: str | None, engine_vocab: Tokenizer | None
) -> None:
    async with (
        ScriptedLLM(tokenizer=engine_vocab, policy="finish", model="m1") as v,
        ScriptedLLM(tokenizer=engine_vocab, policy="finish") as s,
        make_server(handlers=(ToolUseHandler(),), tokenizer=vocab, max_model_len=4096) as srv,
    ):
        await srv.client.add_llm_server(v.address, model="m1")
        params = {"temperature": 0.5, "top_p": 0.9, "max_tokens": 100}
        job = await srv.client.submit("tooluse", {}, sampling_params=params)
        doc = await srv.client.result(job, wait=30)
        assert doc is not None and doc["status"] == "done"
        body = v.log[-1].body
        assert v.log[-1].route.endswith("/v1/completions")
        assert body["model"] == "m1" and body["prompt"] == doc["prompt_ids"]
        assert all(isinstance(t, int) for t in body["prompt"])
        assert body["max_tokens"] == 100 and body["logprobs"] == 0
        assert body["return_token_ids"] is True and body["temperature"] == 0.5
        assert body["top_p"] == 0.9
        await srv.client.clear_llm_server()
        await srv.client.add_llm_server(s.address, api="sglang")
        job = await srv.client.submit("tooluse", {}, sampling_params=params)
        doc = await srv.client.result(job, wait=30)
        assert doc is not None and doc["status"] == "done"
        body = s.log[-1].body
        assert s.log[-1].route == "/generate"
        assert body["input_ids"] == doc["prompt_ids"]
        assert body["return_logprob"] is True and body["logprob_start_len"] == -1
        sp = body["sampling_params"]
        assert sp["max_new_tokens"] == 100 and sp["temperature"] == 0.5 and sp["top_p"] == 0.9


async def test_least_in_flight_placement_with_uneven_lengths(make_server: ServerFactory) -> None:
    async with (
        ScriptedLLM(policy="finish") as a,
        ScriptedLLM(policy="finish") as b,
        make_server(handlers=(ToolUseHandler(),)) as srv,
    ):
        await srv.client.add_llm_server(a.address)
        await srv.client.add_llm_server(b.address)
        a.hold()
        b.hold()
        first = await srv.client.submit_batch([{"task": "tooluse", "instance": {}}] * 6)
        await a.wait_requests(3)
        await b.wait_requests(3)
        inflight = {x["address"]: x["inflight"] for x in (await srv.client.status())["backends"]}
        assert inflight == {a.address: 3, b.address: 3}
        a.release()  # A's (short) jobs end, B's (long) ones keep going
        await eventually(lambda: srv.pool.snapshot()[0]["inflight"] == 0)
        a.hold()
        more = await srv.client.submit_batch([{"task": "tooluse", "instance": {}}] * 3)
        await a.wait_requests(6)
        st = {x["address"]: x for x in (await srv.client.status())["backends"]}
        # all three new jobs went to the idle backend although it was assigned as many in total
        assert st[a.address]["inflight"] == 3 and st[b.address]["inflight"] == 3
        assert st[a.address]["assigned"] == 6 and st[b.address]["assigned"] == 3
        a.release()
        b.release()
        docs = await _drain(srv, first + more)
        assert all(d["status"] == "done" for d in docs.values())


async def test_max_inflight_respected_and_wait_pauses_timer(make_server: ServerFactory) -> None:
    latency = LatencyModel(ttft_s=0.05, per_token_s=0.001)
    async with (
        ScriptedLLM(policy="random_tools", seed=3, latency=latency) as a,
        make_server(handlers=(ToolUseHandler(),)) as srv,
    ):
        await srv.client.add_llm_server(a.address, max_inflight=2)
        jobs = [{"task": "tooluse", "instance": {}, "timeout_s": 2.0}] * 12
        ids = await srv.client.submit_batch(jobs)
        await eventually(lambda: srv.pool.waiting > 0)
        status = await srv.client.status()
        assert status["backend_waiting"] > 0 and status["backends"][0]["inflight"] <= 2
        docs = await _drain(srv, ids)
        assert all(d["status"] == "done" for d in docs.values())
        assert a.stats.peak_active <= 2
        waited = [d["timing"]["backend_wait_s"] for d in docs.values()]
        assert max(waited) > 0.1  # waiting for the capped backend did not count as active time


async def test_clear_mid_run_and_new_weight_version(make_server: ServerFactory) -> None:
    async with (
        ScriptedLLM(policy="random_tools", seed=11) as a,
        ScriptedLLM(policy="random_tools", seed=11) as b,
        make_server(handlers=(ToolUseHandler(),)) as srv,
    ):
        await srv.client.add_llm_server(a.address, weight_version=1)
        a.hold()
        running = await srv.client.submit("tooluse", {"prompt": "long job", "max_turns": 6})
        await a.wait_requests(1)
        await srv.client.clear_llm_server()
        # registration of the same backend with a new version mid-run shows per turn
        queued = await srv.client.submit("tooluse", {"prompt": "after clear"})
        await eventually(lambda: srv.pool.waiting == 1)
        a.release()  # the running job finishes on the backend it holds, though cleared
        doc = await srv.client.result(running, wait=30)
        assert doc is not None and doc["status"] == "done"
        assert {t["backend"] for t in doc["turns"] if t["role"] == "assistant"} == {a.address}
        job = srv.service.store.get(queued)
        assert job is not None and job.status == "run"  # still waiting for a backend
        await srv.client.add_llm_server(b.address, weight_version=2)
        doc2 = await srv.client.result(queued, wait=30)
        assert doc2 is not None and doc2["status"] == "done" and doc2["weight_versions"] == [2]


async def test_weight_version_update_shows_per_turn(make_server: ServerFactory) -> None:
    async with (
        ScriptedLLM(policy="random_tools", seed=5) as a,
        make_server(handlers=(ToolUseHandler(),)) as srv,
    ):
        await srv.client.add_llm_server(a.address, weight_version=7)
        a.hold()
        job = await srv.client.submit("tooluse", {"prompt": "multi", "max_turns": 8})
        await a.wait_requests(1)
        a.release()  # the first request goes through on version 7...
        a.hold()  # ...and the next one waits while the checkpoint is swapped
        await a.wait_requests(2)
        await srv.client.add_llm_server(a.address, weight_version=8)
        a.release()
        doc = await srv.client.result(job, wait=30)
        assert doc is not None and doc["status"] == "done"
        turns = [t for t in doc["turns"] if t["role"] == "assistant"]
        assert [s["weight_version"] for s in turns[0]["segments"]] == [7]
        # The turn in flight across the swap cannot know where the new weights began: it
        # is marked with both versions, and counted as the older one.
        [held] = turns[1]["segments"]
        assert (held["weight_version"], held["weight_version_end"]) == (7, 8)
        assert turns[1]["weight_version"] == 7
        assert {t["weight_version"] for t in turns[2:]} <= {8}
        assert doc["weight_versions"] == [7, 8]


async def test_backend_killed_mid_run_fails_over(
    make_server: ServerFactory, vocab: str | None, engine_vocab: Tokenizer | None
) -> None:
    latency = LatencyModel(ttft_s=0.02)
    async with (
        ScriptedLLM(tokenizer=engine_vocab, policy="random_tools", seed=2, latency=latency) as a,
        ScriptedLLM(tokenizer=engine_vocab, policy="random_tools", seed=2, latency=latency) as b,
        make_server(handlers=(ToolUseHandler(),), tokenizer=vocab) as srv,
    ):
        await srv.client.add_llm_server(a.address)
        await srv.client.add_llm_server(b.address)
        ids = await srv.client.submit_batch(
            [
                {"task": "tooluse", "instance": {"prompt": f"p{i}", "max_turns": 6}}
                for i in range(20)
            ]
        )
        await eventually(lambda: a.stats.served >= 10)  # first turns done on A
        await a.kill()
        docs = await _drain(srv, ids)
        assert any(e.outcome == "killed" for e in a.log)
        assert all(d["status"] == "done" for d in docs.values()), [
            d["error"] for d in docs.values() if d["status"] != "done"
        ]
        moved = [
            d
            for d in docs.values()
            if len({t["backend"] for t in d["turns"] if t["role"] == "assistant"}) == 2
        ]
        assert moved, "no job failed over from the killed backend"
        served = _served([a, b])
        for doc in docs.values():
            check_token_invariants(doc, served)


async def test_all_backends_down_fails_cleanly(make_server: ServerFactory) -> None:
    async with (
        ScriptedLLM(policy="random_tools", seed=4) as a,
        ScriptedLLM(policy="random_tools", seed=4) as b,
        make_server(handlers=(ToolUseHandler(),)) as srv,
    ):
        await srv.client.add_llm_server(a.address)
        await srv.client.add_llm_server(b.address)
        a.hold()
        b.hold()
        ids = await srv.client.submit_batch([{"task": "tooluse", "instance": {}}] * 6)
        await a.wait_requests(3)
        await b.wait_requests(3)
        await a.kill()
        await b.kill()
        docs = await _drain(srv, ids, wait=60)
        for doc in docs.values():
            assert doc["status"] == "failed" and doc["error"]["stage"] == "run"
            assert "BackendError" in doc["error"]["type"]
        status = await srv.client.status()
        assert status["active"]["run"] == 0
        assert not any(x["healthy"] for x in status["backends"])


async def test_context_exhaustion_ends_run_normally(
    make_server: ServerFactory, vocab: str | None, engine_vocab: Tokenizer | None
) -> None:
    async with (
        ScriptedLLM(tokenizer=engine_vocab, policy="random_tools", seed=9) as a,
        make_server(handlers=(ToolUseHandler(),), tokenizer=vocab, max_model_len=700) as srv,
    ):
        await srv.client.add_llm_server(a.address)
        ids = await srv.client.submit_batch(
            [
                {"task": "tooluse", "instance": {"prompt": f"q{i}", "max_turns": 50}}
                for i in range(10)
            ]
        )
        docs = await _drain(srv, ids)
        finishes = {d["finish"] for d in docs.values()}
        assert all(d["status"] == "done" for d in docs.values())
        assert "context_exhausted" in finishes
        assert any(d["num_turns"] > 1 for d in docs.values())
        for d in docs.values():
            assert len(d["prompt_ids"]) + len(d["response_ids"]) <= 700
            check_token_invariants(d, _served([a]))


async def test_engine_output_cut_mid_character_keeps_its_ids(
    make_server: ServerFactory,
    tok: ChatTokenizer,
    vocab: str | None,
    engine_vocab: Tokenizer | None,
) -> None:
    ids = tok.encode(CUT_REPLY)
    # The first cut that ends inside a character (its text ends with U+FFFD).
    cut = next(n for n in range(1, len(ids)) if tok.decode(ids[:n]).endswith("\ufffd"))
    assert tok.decode(ids[:cut]).startswith(tool_call("bash", {"command": "ls"}))
    assert len(tok.encode(FINISH_REPLY)) + 1 <= cut
    async with (
        ScriptedLLM(tokenizer=engine_vocab, policy=MultibytePolicy()) as llm,
        make_server(handlers=(ToolUseHandler(),), tokenizer=vocab) as srv,
    ):
        await srv.client.add_llm_server(llm.address)
        job = await srv.client.submit("tooluse", {}, sampling_params={"max_tokens": cut})
        doc = await srv.client.result(job, wait=30)
        assert doc is not None and doc["status"] == "done", doc
        check_token_invariants(doc, _served([llm]))
    first, obs = doc["turns"][0], doc["turns"][1]
    assert first["token_ids"] == ids[:cut] and first["text"].endswith("\ufffd")
    assert obs["token_ids"][0] == tok.eos_id and "输出：完成 ✓ 🙂" in obs["text"]
    assert doc["finish"] == "finish_tool" and doc["num_turns"] == 2
