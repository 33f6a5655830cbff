"""Every bad input gets its status as problem+json, never a 500."""

from __future__ import annotations

import io
from typing import Any

import aiohttp
import pytest

from tests.helpers import ServerFactory


async def _call(
    url: str,
    method: str,
    path: str,
    data: bytes | io.BytesIO | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, Any], str, dict[str, str]]:
    async with (
        aiohttp.ClientSession() as s,
        s.request(method, url + path, data=data, headers=headers) as r,
    ):
        ctype = r.headers.get("Content-Type", "")
        body = await r.json(content_type=None) if "json" in ctype else {}
        return r.status, body, r.headers.get("Content-Type", ""), dict(r.headers)


CASES = [
    ("POST", "/process", b"{not json", 400, "malformed JSON"),
    ("POST", "/process", b"", 400, "empty request body"),
    ("POST", "/process", b'{"task": 5}', 400, "$.task"),
    ("POST", "/process", b'{"instance": {}}', 400, "task"),
    ("POST", "/process", b'{"task": "sleep", "bogus": 1}', 400, "bogus"),
    ("POST", "/process", b'{"task": "sleep", "timeout_s": "x"}', 400, "$.timeout_s"),
    ("POST", "/process", b'{"task": "sleep", "timeout_s": -1}', 400, "$.timeout_s"),
    ("POST", "/process", b'{"task": "sleep", "job_id": "a/b"}', 400, "$.job_id"),
    ("POST", "/process", b'{"task": "nope"}', 422, "unknown task 'nope'"),
    ("POST", "/process", b'{"task": "sleep", "instance": {"run_s": "x"}}', 422, "instance.run_s"),
    ("POST", "/process", b'{"task": "sleep", "instance": {"zzz": 1}}', 422, "zzz"),
    ("POST", "/process/batch", b'{"jobs": [{"task": "sleep"}, {"task": "nope"}]}', 422, "jobs[1]"),
    (
        "POST",
        "/process/batch",
        b'{"jobs": [{"task": "sleep"}, {"task": 1}]}',
        400,
        "$.jobs[1].task",
    ),
    ("POST", "/poll", b'{"job_ids": "x"}', 400, "$.job_ids"),
    ("POST", "/poll", b'{"job_ids": [], "wait": -1}', 400, "$.wait"),
    ("POST", "/cancel", b"{}", 400, "job_id"),
    ("GET", "/jobs/unknown-id", None, 404, "unknown-id"),
    ("GET", "/jobs/x?wait=abc", None, 400, "wait"),
    ("GET", "/jobs/x?wait=nan", None, 400, "wait"),
    ("DELETE", "/jobs/unknown-id", None, 404, "unknown-id"),
    ("POST", "/remove_llm_server", b'{"address": 3}', 400, "$.address"),
    ("GET", "/no/such/route", None, 404, ""),
    ("PUT", "/process", b"{}", 405, ""),
]


@pytest.mark.parametrize(("method", "path", "body", "status", "detail"), CASES)
async def test_bad_input(
    make_server: ServerFactory, method: str, path: str, body: bytes | None, status: int, detail: str
) -> None:
    async with make_server() as srv:
        got, doc, ctype, _ = await _call(srv.url, method, path, data=body)
        assert got == status, doc
        assert ctype.startswith("application/problem+json")
        assert set(doc) == {"type", "title", "status", "detail"} and doc["status"] == status
        assert detail in doc["detail"]


async def test_body_over_limit_is_413(make_server: ServerFactory) -> None:
    async with make_server(max_body_bytes=1024) as srv:
        body = b'{"task": "sleep", "metadata": {"x": "' + b"a" * 4096 + b'"}}'
        got, doc, _, _ = await _call(srv.url, "POST", "/process", data=body)
        assert got == 413 and "1024" in doc["detail"]


async def test_default_body_limit_is_8_mib(make_server: ServerFactory) -> None:
    async with make_server() as srv:
        body = b'{"task": "sleep", "metadata": {"x": "' + b"a" * (8 * 1024 * 1024) + b'"}}'
        got, _, _, _ = await _call(srv.url, "POST", "/process", data=io.BytesIO(body))
        assert got == 413


async def test_admission_full_is_503_with_retry_after(make_server: ServerFactory) -> None:
    async with make_server(max_jobs=2) as srv:
        for _ in range(2):
            await srv.client.submit("sleep", {"run_s": 30})
        got, doc, _, headers = await _call(srv.url, "POST", "/process", data=b'{"task": "sleep"}')
        assert got == 503 and "admission full" in doc["detail"]
        assert int(headers["Retry-After"]) >= 1
        got, doc, _, _ = await _call(
            srv.url, "POST", "/process/batch", data=b'{"jobs": [{"task": "sleep"}]}'
        )
        assert got == 503


async def test_stopped_is_503(make_server: ServerFactory) -> None:
    async with make_server() as srv:
        await srv.client.stop()
        got, doc, _, headers = await _call(srv.url, "POST", "/process", data=b'{"task": "sleep"}')
        assert got == 503 and "stopped" in doc["detail"] and "Retry-After" in headers


async def test_bearer_token(make_server: ServerFactory) -> None:
    async with make_server(token="s3cret") as srv:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            got, doc, _, _ = await _call(srv.url, "GET", "/status", headers=headers)
            assert got == 401 and "Authorization" in doc["detail"]
        got, _, _, _ = await _call(
            srv.url, "GET", "/status", headers={"Authorization": "Bearer s3cret"}
        )
        assert got == 200
        got, _, _, _ = await _call(srv.url, "GET", "/healthz")
        assert got == 200  # open: a load balancer's probe has no token
        got, _, _, _ = await _call(srv.url, "GET", "/metrics")
        assert got == 401  # every tenant's counts: not for anyone
        # the client sends the token
        assert (await srv.client.status())["state"] == "running"


async def test_client_raises_typed_errors(make_server: ServerFactory) -> None:
    from prorl_async import client as c

    async with make_server() as srv:
        with pytest.raises(c.UnprocessableError, match="unknown task"):
            await srv.client.submit("nope", {})
        with pytest.raises(c.NotFoundError):
            await srv.client.result("missing")
        with pytest.raises(c.BadRequestError, match="wait"):
            await srv.client.poll(["a"], wait=-1)
        with pytest.raises(c.BadRequestError, match="api"):
            await srv.client.add_llm_server("http://127.0.0.1:1/v1", api="bogus")
        with pytest.raises(c.UnprocessableError, match="address"):
            await srv.client.add_llm_server("not a url")
        with pytest.raises(c.NotFoundError, match="address"):
            await srv.client.remove_llm_server("http://127.0.0.1:1/v1")
