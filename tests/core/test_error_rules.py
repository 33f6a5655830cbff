"""What a newcomer's first mistakes get: an empty body, no instance, the wrong method,
each answered with what was wrong (docs/API.md: 400 for the envelope, 422 for content)."""

from __future__ import annotations

import aiohttp

from tests.helpers import ServerFactory


async def test_an_empty_body_says_so(make_server: ServerFactory) -> None:
    async with make_server() as srv, aiohttp.ClientSession() as s:
        async with s.post(f"{srv.url}/process", data=b"") as r:
            doc = await r.json()
    assert r.status == 400 and doc["detail"].startswith("empty request body: POST /process")


async def test_a_missing_instance_says_the_instance_is_missing(make_server: ServerFactory) -> None:
    async with make_server() as srv, aiohttp.ClientSession() as s:
        async with s.post(f"{srv.url}/process", json={"task": "math"}) as r:
            doc = await r.json()
        async with s.post(f"{srv.url}/process", json={"task": "math", "instance": {}}) as r2:
            doc2 = await r2.json()
    assert r.status == 422 and doc["detail"].startswith("instance: missing; task 'math'")
    assert r2.status == 422 and "instance: missing" in doc2["detail"]


async def test_a_field_of_a_given_instance_is_named(make_server: ServerFactory) -> None:
    async with make_server() as srv, aiohttp.ClientSession() as s:
        body = {"task": "math", "instance": {"problem": "2+2?"}}
        async with s.post(f"{srv.url}/process", json=body) as r:
            doc = await r.json()
    assert r.status == 422 and "answer" in doc["detail"] and "missing;" not in doc["detail"]


async def test_the_wrong_method_names_the_allowed_ones(make_server: ServerFactory) -> None:
    async with make_server() as srv, aiohttp.ClientSession() as s:
        async with s.get(f"{srv.url}/process") as r:
            doc = await r.json()
    assert r.status == 405 and r.headers["Allow"] == "POST"
    assert doc["detail"] == "GET /process: method not allowed; use POST"


async def test_an_unknown_field_is_the_envelope_400_a_bad_task_is_content_422(
    make_server: ServerFactory,
) -> None:
    async with make_server() as srv, aiohttp.ClientSession() as s:
        async with s.post(f"{srv.url}/process", json={"task": "sleep", "nope": 1}) as r:
            envelope = await r.json()
        async with s.post(f"{srv.url}/process", json={"task": "nope"}) as r2:
            content = await r2.json()
    assert r.status == 400 and "nope" in envelope["detail"]
    assert r2.status == 422 and content["detail"].startswith("task: unknown task 'nope'")
