"""Engine clients against real ScriptedLLM servers: request bodies, parsing, clamping, errors."""

from __future__ import annotations

import asyncio
import math
import re

import aiohttp
import pytest

from prorl_async.llm.engines import (
    LOGPROB_FLOOR,
    EngineUnavailable,
    MalformedResponse,
    complete_sglang,
    complete_vllm,
    engine_connector,
    engine_pause,
    engine_resume,
    fetch_model,
    parse_sglang,
    parse_vllm,
    server_root,
)
from prorl_async.llm.pool import BackendError, BackendPool, PoolConfig
from prorl_async.scripted_llm import ScriptedLLM
from tests.llm.pool.conftest import StartLLM, backend

CHAT = "<|im_start|>user\nWhat is 6*7?<|im_end|>\n<|im_start|>assistant\n"


def prompt_ids(llm: ScriptedLLM) -> list[int]:
    return llm.tokenizer.encode(CHAT, add_special_tokens=False).ids


async def test_vllm_request_body_and_result_field_by_field(start_llm: StartLLM) -> None:
    llm = await start_llm(model="my-model")
    ids = prompt_ids(llm)
    sampling = {"temperature": 0.7, "top_p": 0.9, "stop": ["</x>"], "max_tokens": 1, "n": 4}
    async with aiohttp.ClientSession() as s:
        gen = await complete_vllm(s, llm.address, "my-model", ids, 200, sampling, weight_version=3)
    [entry] = llm.log
    assert entry.route == "/v1/completions"
    assert entry.body == {
        "model": "my-model",
        "prompt": ids,
        "max_tokens": 200,  # the call's max_tokens wins over the sampling dict's
        "logprobs": 0,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "stream": False,
        "temperature": 0.7,
        "top_p": 0.9,
        "stop": ["</x>"],
    }
    choice = entry.response["choices"][0]
    assert gen.token_ids == choice["token_ids"]
    assert gen.logprobs == choice["logprobs"]["token_logprobs"]
    assert gen.token_ids[-1] == llm.im_end and gen.finish_reason == "stop"
    assert (gen.backend, gen.weight_version, gen.clamped) == (llm.address, 3, 0)


async def test_sglang_request_body_and_result_field_by_field(start_llm: StartLLM) -> None:
    llm = await start_llm()
    ids = prompt_ids(llm)
    async with aiohttp.ClientSession() as s:
        gen = await complete_sglang(
            s, llm.address, ids, 5, {"temperature": 1.0, "top_k": 20, "max_tokens": 99}
        )
    [entry] = llm.log
    assert entry.route == "/generate"  # at the server root, not under /v1
    assert entry.body == {
        "input_ids": ids,
        "sampling_params": {"temperature": 1.0, "top_k": 20, "max_new_tokens": 5},
        "return_logprob": True,
        "logprob_start_len": -1,
        "stream": False,
    }
    meta = entry.response["meta_info"]
    assert gen.token_ids == entry.response["output_ids"] and len(gen.token_ids) == 5
    assert gen.logprobs == [t[0] for t in meta["output_token_logprobs"]]
    assert gen.finish_reason == "length" and meta["finish_reason"]["type"] == "length"
    assert gen.backend == llm.address


async def test_vllm_token_id_strings_fallback(start_llm: StartLLM) -> None:
    llm = await start_llm(legacy_vllm=True)
    async with aiohttp.ClientSession() as s:
        gen = await complete_vllm(s, llm.address, "scripted-llm", prompt_ids(llm), 300, {})
    choice = llm.log[0].response["choices"][0]
    assert "token_ids" not in choice
    assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in gen.token_ids]
    assert gen.token_ids[-1] == llm.im_end and len(gen.token_ids) > 5


@pytest.mark.parametrize("api", ["vllm", "sglang"])
async def test_non_finite_and_missing_logprobs_are_clamped(start_llm: StartLLM, api: str) -> None:
    llm = await start_llm(seed=7)
    llm.set_faults(nan_rate=0.3, missing_rate=0.3)
    async with aiohttp.ClientSession() as s:
        if api == "vllm":
            gen = await complete_vllm(s, llm.address, "scripted-llm", prompt_ids(llm), 300, {})
            sent = llm.log[0].response["choices"][0]["logprobs"]["token_logprobs"]
        else:
            gen = await complete_sglang(s, llm.address, prompt_ids(llm), 300, {})
            sent = [t[0] for t in llm.log[0].response["meta_info"]["output_token_logprobs"]]
    bad = [i for i, v in enumerate(sent) if v is None or math.isnan(v)]
    assert bad and gen.clamped == len(bad)
    assert all(gen.logprobs[i] == LOGPROB_FLOOR for i in bad)
    good = [i for i in range(len(sent)) if i not in bad]
    assert [gen.logprobs[i] for i in good] == [sent[i] for i in good]


def test_missing_logprobs_block_is_clamped_not_fatal() -> None:
    payload = {"choices": [{"token_ids": [5, 6], "logprobs": None, "finish_reason": "length"}]}
    gen = parse_vllm("http://x/v1", payload)
    assert gen.logprobs == [LOGPROB_FLOOR, LOGPROB_FLOOR] and gen.clamped == 2
    inf = {
        "output_ids": [1],
        "meta_info": {
            "finish_reason": {"type": "stop"},
            "output_token_logprobs": [[float("-inf"), 1, None]],
        },
    }
    assert parse_sglang("http://x", inf).clamped == 1


@pytest.mark.parametrize(
    ("payload", "named"),
    [
        ({}, "'choices'"),
        ({"choices": []}, "'choices'"),
        ({"choices": [{"finish_reason": "stop"}]}, "token_ids"),
        ({"choices": [{"token_ids": [1, "a"], "finish_reason": "stop"}]}, "choices[0].token_ids"),
        ({"choices": [{"token_ids": [1], "finish_reason": "weird"}]}, "finish_reason"),
        ({"choices": [{"logprobs": {"tokens": ["hello"]}, "finish_reason": "stop"}]}, "token_id:N"),
        (
            {
                "choices": [
                    {
                        "token_ids": [1],
                        "logprobs": {"token_logprobs": [-1.0, -2.0]},
                        "finish_reason": "stop",
                    }
                ]
            },
            "token_logprobs",
        ),
    ],
)
def test_malformed_vllm_answers_name_the_field(payload: object, named: str) -> None:
    with pytest.raises(MalformedResponse, match=re.escape(named)):
        parse_vllm("http://x/v1", payload)


@pytest.mark.parametrize(
    ("payload", "named"),
    [
        ({"meta_info": {}}, "output_ids"),
        ({"output_ids": [1]}, "meta_info"),
        ({"output_ids": [1], "meta_info": {"finish_reason": None}}, "finish_reason"),
        ({"output_ids": None, "meta_info": {}}, "output_ids"),
    ],
)
def test_malformed_sglang_answers_name_the_field(payload: object, named: str) -> None:
    with pytest.raises(MalformedResponse, match=re.escape(named)):
        parse_sglang("http://x", payload)


async def test_model_discovery_404_counts_against_the_backend_other_4xx_not_retried(
    start_llm: StartLLM,
) -> None:
    llm = await start_llm(model="served-name", max_model_len=64)
    async with aiohttp.ClientSession() as s:
        assert await fetch_model(s, llm.address) == "served-name"
        # A wrong model name (or address) is the backend's fault: retryable elsewhere.
        with pytest.raises(EngineUnavailable, match="404"):
            await complete_vllm(s, llm.address, "wrong", prompt_ids(llm), 10, {})
    async with BackendPool(PoolConfig(retries=2, retry_backoff_s=0.0)) as pool:
        pool.add(llm.address)  # no model: the pool asks /v1/models once
        async with pool.lease() as lease:
            gen = await lease.generate(prompt_ids(llm), 10, {})
            assert llm.log[-1].body["model"] == "served-name" and gen.token_ids
            before = len(llm.log)
            with pytest.raises(BackendError, match="max_tokens=100 cannot be greater"):
                await lease.generate(prompt_ids(llm), 100, {})  # vLLM's 400: the request's fault
            assert len(llm.log) == before + 1  # a refused request is not retried
        pool.add(llm.address, model="wrong")
        async with pool.lease() as lease:
            before = len(llm.log)
            with pytest.raises(BackendError, match="does not exist"):
                await lease.generate(prompt_ids(llm), 10, {})
            assert len(llm.log) == before + 3  # retried, then the backend is marked unhealthy
        assert backend(pool, llm.address).healthy is False


def test_server_root() -> None:
    assert server_root("http://h:1/v1") == "http://h:1"
    assert server_root("http://h:1/v1/") == "http://h:1"
    assert server_root("http://h:1") == "http://h:1"


class DroppingEngine:
    """Test double of an engine's HTTP server closing a kept-alive connection just as the
    next request arrives on it (uvicorn's keep-alive timer ending then; the real race is
    not reproducible on demand). Each connection answers its first request with 200 and
    keep-alive, and closes unanswered on the second (with ``answers=0``, on the first).
    Records each request line."""

    def __init__(self, answers: int = 1) -> None:
        self.answers = answers
        self.requests: list[tuple[int, str]] = []  # (connection number, request line)
        self.connections = 0
        self._server: asyncio.Server | None = None

    @property
    def address(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1"

    async def __aenter__(self) -> DroppingEngine:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        conn = self.connections
        try:
            for n in range(self.answers + 1):
                head = await reader.readuntil(b"\r\n\r\n")
                self.requests.append((conn, head.split(b"\r\n", 1)[0].decode()))
                if n == self.answers:
                    return  # the keep-alive timer ended: close without an answer
                length = re.search(rb"(?i)content-length: *(\d+)", head)
                await reader.readexactly(int(length.group(1)) if length else 0)
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"content-length: 2\r\n\r\n{}"
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()


async def test_an_admin_call_on_a_connection_the_engine_dropped_is_sent_once_more() -> None:
    async with DroppingEngine() as engine, aiohttp.ClientSession(connector=engine_connector()) as s:
        await engine_resume(s, "vllm", engine.address, 5.0)
        await engine_pause(s, "vllm", engine.address, "abort", 5.0)  # reuses the connection
    assert engine.requests == [
        (1, "POST /resume HTTP/1.1"),
        (1, "POST /pause?mode=abort HTTP/1.1"),  # dropped unanswered
        (2, "POST /pause?mode=abort HTTP/1.1"),  # sent once more, on a new connection
    ]


async def test_an_admin_call_dropped_twice_fails_naming_the_engine() -> None:
    async with (
        DroppingEngine(answers=0) as engine,
        aiohttp.ClientSession(connector=engine_connector()) as s,
    ):
        with pytest.raises(EngineUnavailable, match=re.escape(engine.address)):
            await engine_pause(s, "vllm", engine.address, "keep", 5.0)
    assert engine.requests == [
        (1, "POST /pause?mode=keep HTTP/1.1"),
        (2, "POST /pause?mode=keep HTTP/1.1"),
    ]
