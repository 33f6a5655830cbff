"""Hostile input: over-deep JSON, undecodable header bytes, bad sampling_params."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import msgspec
import pytest

from tests.helpers import ServerFactory


def _deep(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


def _body(path: str, depth: int) -> bytes:
    nested = _deep(depth)
    if path == "/process":
        return b'{"task": "sleep", "instance": ' + nested + b"}"
    return b'{"jobs": [{"task": "sleep", "metadata": {"x": [' + nested + b"]}}]}"


async def _post(url: str, body: bytes, **kw: Any) -> tuple[int, str, dict[str, Any]]:
    async with aiohttp.ClientSession() as s, s.post(url, data=body, **kw) as r:
        return r.status, r.headers.get("Content-Type", ""), await r.json(content_type=None)


@pytest.mark.parametrize("path", ["/process", "/process/batch"])
@pytest.mark.parametrize("depth", [1_000, 100_000])
async def test_over_deep_json_is_400(make_server: ServerFactory, path: str, depth: int) -> None:
    async with make_server() as srv:
        status, ctype, doc = await _post(srv.url + path, _body(path, depth))
        assert status == 400 and ctype.startswith("application/problem+json")
        assert "nested too deeply" in doc["detail"]
        assert (await srv.client.status())["records"] == 0


async def test_deep_but_decodable_json_round_trips(make_server: ServerFactory) -> None:
    async with make_server() as srv:
        body = b'{"task": "sleep", "instance": {"run_s": 0}, "metadata": ' + _deep(800) + b"}"
        status, _, doc = await _post(srv.url + "/process", body)
        assert status == 202
        result = await srv.client.result(doc["job_id"], wait=30)
        assert result is not None and result["status"] == "done"
        assert result["metadata"] == msgspec.json.decode(_deep(800))


async def _raw(url: str, request: bytes) -> bytes:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(request)
        async with asyncio.timeout(10):
            return await reader.read()
    finally:
        writer.close()


@pytest.mark.parametrize("value", [b"Bearer \xff\xfe\xe9", b"\xc3\x28", b"Bearer s3cret\x80"])
async def test_undecodable_authorization_is_401(make_server: ServerFactory, value: bytes) -> None:
    async with make_server(token="s3cret") as srv:
        request = b"GET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: "
        answer = await _raw(srv.url, request + value + b"\r\n\r\n")
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 401") and b"application/problem+json" in head
        assert msgspec.json.decode(body)["status"] == 401


BAD_SAMPLING = [
    ({"max_tokens": "abc"}, "sampling_params.max_tokens"),
    ({"max_tokens": -5}, "sampling_params.max_tokens"),
    ({"max_tokens": 0}, "sampling_params.max_tokens"),
    ({"max_tokens": [1]}, "sampling_params.max_tokens"),
    ({"max_tokens": None}, "sampling_params.max_tokens"),
    ({"max_tokens": 1.5}, "sampling_params.max_tokens"),
    ({"temperature": -0.1}, "sampling_params.temperature"),
    ({"top_p": 0}, "sampling_params.top_p"),
    ({"top_p": 1.5}, "sampling_params.top_p"),
    ({"top_k": "x"}, "sampling_params.top_k"),
    ({"stop": ["ok", 3]}, "sampling_params.stop[1]"),
    ({"seed": "s"}, "sampling_params.seed"),
    ({"max_token": 5}, "unknown field `max_token`"),
]


@pytest.mark.parametrize(("params", "named"), BAD_SAMPLING)
async def test_bad_sampling_params_are_422_and_create_no_job(
    make_server: ServerFactory, params: dict[str, Any], named: str
) -> None:
    async with make_server() as srv:
        one = {"task": "sleep", "sampling_params": params}
        status, _, doc = await _post(srv.url + "/process", msgspec.json.encode(one))
        assert status == 422 and named in doc["detail"], doc
        batch = {"jobs": [{"task": "sleep"}, one]}
        status, _, doc = await _post(srv.url + "/process/batch", msgspec.json.encode(batch))
        assert status == 422 and named in doc["detail"], doc
        assert doc["detail"].startswith("jobs[1].sampling_params")
        assert (await srv.client.status())["records"] == 0


async def test_good_sampling_params_are_accepted(make_server: ServerFactory) -> None:
    params = {"max_tokens": 8, "temperature": 0, "top_p": 1, "top_k": -1, "stop": "x", "seed": 3}
    async with make_server() as srv:
        job = await srv.client.submit("sleep", {"run_s": 0}, sampling_params=params)
        result = await srv.client.result(job, wait=30)
        assert result is not None and result["status"] == "done"
