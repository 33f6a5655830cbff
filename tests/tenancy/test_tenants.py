"""Tenants on a real server: isolation, admin routes, quotas, tokens file, restart."""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from prorl_async.client import (
    ConflictError,
    ForbiddenError,
    NotFoundError,
    RolloutClient,
    TooManyRequestsError,
    UnauthorizedError,
)
from tests.blocking import BlockingHandler
from tests.helpers import ServerFactory, eventually, server_process
from tests.sse import open_events

TENANTS: dict[str, dict[str, Any]] = {
    "a": {"token": "token-a"},
    "b": {"token": "token-b", "max_inflight": 3},
    "ops": {"token": "token-ops", "admin": True},
}


@asynccontextmanager
async def _clients(url: str, *names: str) -> AsyncIterator[list[RolloutClient]]:
    async with AsyncExitStack() as stack:
        out = []
        for name in names:
            token = TENANTS[name]["token"] if name in TENANTS else name
            out.append(await stack.enter_async_context(RolloutClient(url, token=str(token))))
        yield out


async def test_a_tenant_cannot_see_poll_stream_or_cancel_another_tenants_jobs(
    make_server: ServerFactory, blocking: BlockingHandler
) -> None:
    async with make_server(tenants=TENANTS) as srv, _clients(srv.url, "a", "b") as (a, b):
        mine = await a.submit("sleep", {})
        theirs = await b.submit("blocking", {"block": ["run"]})
        done = await b.submit("sleep", {})
        await eventually(lambda: srv.service.store.status(done) == "done")
        for job in (theirs, done):
            with pytest.raises(NotFoundError):
                await a.result(job)
            with pytest.raises(NotFoundError):
                await a.delete(job)
            async with aiohttp.ClientSession(headers={"Authorization": "Bearer token-a"}) as s:
                async with s.get(f"{srv.url}/jobs/{job}/callback") as r:
                    assert r.status == 404
        out = await a.poll([theirs, done, mine], wait=5)
        assert out["unknown"] == [theirs, done] and [d["job_id"] for d in out["done"]] == [mine]
        assert (await a.cancel([theirs]))["not_found"] == [theirs]
        with pytest.raises(ConflictError, match="not available"):
            await a.submit("sleep", {}, job_id=theirs)
        assert [d["job_id"] for d in (await a.results(0, wait=10))["results"]] == [mine]
        async with (
            aiohttp.ClientSession() as s,
            open_events(s, srv.url, token="token-a", after=0) as stream,
        ):
            (event,) = await stream.jobs(1)
            assert event.data["job_id"] == mine and event.data["tenant"] == "a"
        # b's job ran on untouched; b cancels it
        assert srv.service.store.status(theirs) == "run"
        assert (await b.cancel([theirs]))["cancelled"] == [theirs]
        assert (await b.results(0, limit=10, wait=10))["results"][0]["job_id"] == done
        blocking.release(theirs)


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/workers", {"run": 2}),
        ("POST", "/stop", None),
        ("POST", "/start", None),
        ("POST", "/add_llm_server", {"address": "http://127.0.0.1:9/v1"}),
        ("POST", "/remove_llm_server", {"address": "x"}),
        ("POST", "/clear_llm_server", None),
    ],
)
async def test_a_non_admin_tenant_gets_403_on_admin_routes(
    make_server: ServerFactory, method: str, path: str, body: Any
) -> None:
    async with make_server(tenants=TENANTS) as srv, aiohttp.ClientSession() as s:
        for token, status in (("token-a", 403), ("nope", 401)):
            headers = {"Authorization": f"Bearer {token}"}
            async with s.request(method, srv.url + path, json=body, headers=headers) as r:
                assert r.status == status
                if status == 403:
                    detail = (await r.json())["detail"]
                    assert "admin route" in detail and "'a'" in detail
        headers = {"Authorization": "Bearer token-ops"}
        async with s.request(method, srv.url + path, json=body, headers=headers) as r:
            assert r.status not in (401, 403)


async def test_a_wrong_path_or_method_asks_for_a_token_first_then_answers_404_or_405(
    make_server: ServerFactory,
) -> None:
    """Guarded as every route: 401 without a known token; then, for any tenant, 404 or
    405 as problem+json (never 403: no admin route is involved)."""
    cases = [
        ("GET", "/nope", 404, None),
        ("POST", "/jobs/x/y/z", 404, None),
        ("GET", "/process", 405, "POST"),
        # /jobs/{job_id}'s routes were added apart (GET, later DELETE): all are named.
        ("POST", "/jobs/j-1", 405, "DELETE,GET,HEAD"),
    ]
    async with make_server(tenants=TENANTS) as srv, aiohttp.ClientSession() as s:
        for method, path, status, allow in cases:
            async with s.request(method, srv.url + path) as r:
                assert (r.status, r.content_type) == (401, "application/problem+json"), path
            for token in ("token-a", "token-ops"):
                headers = {"Authorization": f"Bearer {token}"}
                async with s.request(method, srv.url + path, headers=headers) as r:
                    doc = await r.json(content_type="application/problem+json")
                assert (r.status, doc["status"]) == (status, status), (method, path, token)
                assert r.headers.get("Allow") == allow
                if status == 405:
                    assert doc["detail"].startswith(f"{method} {path}: method not allowed; use ")
        # A wrong method on an open path needs no token (the path is open).
        async with s.delete(srv.url + "/healthz") as r:
            assert r.status == 405 and r.headers["Allow"] == "GET,HEAD"
        async with s.delete(
            f"{srv.url}/jobs/j-unknown", headers={"Authorization": "Bearer token-a"}
        ) as r:
            assert r.status == 404  # DELETE still reaches its own route


async def test_status_and_metrics_are_broken_down_by_tenant(
    make_server: ServerFactory, blocking: BlockingHandler
) -> None:
    async with (
        make_server(tenants=TENANTS) as srv,
        _clients(srv.url, "a", "b", "ops") as (
            a,
            b,
            ops,
        ),
    ):
        held = await a.submit("blocking", {"block": ["run"]})
        await b.submit_batch([{"task": "sleep"}] * 2)
        await blocking.event(held, "run").wait()
        await eventually(lambda: srv.service.tenants.ended.get("b", Counter())["done"] == 2)
        await eventually(lambda: srv.service.store.log.last("b") == 2)  # committed
        mine = await a.status()
        assert set(mine["tenants"]) == {"a"}
        assert mine["tenants"]["a"]["active"]["run"] == 1 and mine["tenants"]["a"]["inflight"] == 1
        everyone = (await ops.status())["tenants"]
        assert set(everyone) >= {"a", "b", "ops"}
        assert everyone["b"]["jobs"]["done"] == 2 and everyone["b"]["max_inflight"] == 3
        assert everyone["b"]["last_seq"] == 2 and everyone["a"]["last_seq"] == 0
        admin = {"Authorization": "Bearer token-ops"}
        async with aiohttp.ClientSession() as s, s.get(f"{srv.url}/metrics", headers=admin) as r:
            text = await r.text()
        assert 'prorl_tenant_active_jobs{stage="run",tenant="a"} 1.0' in text
        assert 'prorl_tenant_jobs_total{status="done",tenant="b"} 2.0' in text
        assert 'prorl_tenant_inflight{tenant="a"} 1.0' in text
        blocking.release(held)


async def test_over_max_inflight_is_429_and_creates_nothing(
    make_server: ServerFactory, blocking: BlockingHandler
) -> None:
    async with make_server(tenants=TENANTS) as srv, _clients(srv.url, "b", "a") as (b, a):
        held = [await b.submit("blocking", {"block": ["init"]}) for _ in range(3)]
        rows = len(srv.service.store)
        with pytest.raises(TooManyRequestsError, match="max_inflight=3") as info:
            await b.submit("blocking", {}, job_id="fourth")
        assert info.value.retry_after == 1
        with pytest.raises(TooManyRequestsError):
            await b.submit_batch([{"task": "blocking"}])
        assert len(srv.service.store) == rows and srv.service.store.status("fourth") is None
        await a.submit_batch([{"task": "sleep"}] * 5)  # another tenant is not held back
        blocking.release(held[0])
        await eventually(lambda: srv.service.tenants.inflight["b"] == 2)
        await b.submit("blocking", {}, job_id="fourth")
        for job in held[1:]:
            blocking.release(job)


async def test_without_tokens_everyone_is_the_admin_tenant_default(
    make_server: ServerFactory,
) -> None:
    async with make_server() as srv:
        st = await srv.client.set_workers(run=3)
        assert st["tenants"]["default"]["admin"] is True


def _tokens_file(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


async def test_tokens_file_tenants_beside_the_single_admin_token(tmp_path: Path) -> None:
    tokens = _tokens_file(tmp_path / "tokens.toml", '[tenants.a]\ntoken = "token-a"\n')
    env = {"PRORL_TOKEN": "root"}
    async with server_process(tmp_path, env, "--tokens-file", str(tokens)) as (_, url):
        async with _clients(url, "a", "root", "wrong") as (a, root, wrong):
            with pytest.raises(ForbiddenError):
                await a.set_workers(run=2)
            assert (await root.set_workers(run=2))["workers"]["run"] == 2
            with pytest.raises(UnauthorizedError):
                await wrong.status()
            job = await a.submit("sleep", {})
            with pytest.raises(NotFoundError):  # the admin tenant is a tenant too
                await root.result(job)
            assert (await a.result(job, wait=10) or {}).get("status") == "done"


@pytest.mark.parametrize(
    ("text", "mode", "message"),
    [
        ('[tenants.a]\ntoken = "t"\n', 0o644, "mode 0644 lets other users read the tokens"),
        ('[tenants.a]\ntoken = "t"\nquota = 3\n', 0o600, "unknown field `quota`"),
        ('[tenants.a]\ntoken = "t"\n[tenants.b]\ntoken = "t"\n', 0o600, "the same token as"),
        ('[tenants.a]\ntoken = "t"\nweight = 0\n', 0o600, "weight"),
        ('[tenants."a b"]\ntoken = "t"\n', 0o600, "tenants.a b: a name is"),
    ],
)
async def test_a_bad_tokens_file_is_a_clear_start_error(
    tmp_path: Path, text: str, mode: int, message: str
) -> None:
    tokens = _tokens_file(tmp_path / "tokens.toml", text, mode)
    cmd = [
        sys.executable,
        "-m",
        "prorl_async.cli",
        "serve",
        "--port",
        "0",
        "--state-dir",
        str(tmp_path / "state"),
        "--tokens-file",
        str(tokens),
    ]
    proc = await asyncio.create_subprocess_exec(*cmd, stderr=asyncio.subprocess.PIPE)
    async with asyncio.timeout(30):
        _, err = await proc.communicate()
    assert proc.returncode == 2, err.decode()
    assert f"tokens_file {tokens}" in err.decode() and message in err.decode()


async def test_the_tenant_is_stored_with_the_job_across_kill9(tmp_path: Path) -> None:
    tokens = _tokens_file(
        tmp_path / "tokens.toml", '[tenants.a]\ntoken = "token-a"\n[tenants.b]\ntoken = "token-b"\n'
    )
    args = ("--tokens-file", str(tokens))
    async with server_process(tmp_path, {}, *args) as (proc, url):
        async with _clients(url, "a") as (a,):
            ids = await a.submit_batch([{"task": "sleep", "instance": {"run_s": 30}}] * 5)
        proc.kill()
        await proc.wait()
    async with server_process(tmp_path, {}, *args, "--on-restart", "fail") as (_, url):
        async with _clients(url, "a", "b") as (a, b):
            docs: list[dict[str, Any]] = []
            async with asyncio.timeout(30):
                while len(docs) < len(ids):
                    docs += (await a.results(len(docs) and docs[-1]["seq"], wait=10))["results"]
            assert {d["job_id"] for d in docs} == set(ids)
            assert {d["error"]["type"] for d in docs} == {"ServerRestart"}
            assert (await b.results(0))["results"] == []
            with pytest.raises(NotFoundError):
                await b.result(ids[0])


async def test_metrics_answer_only_an_admin_or_the_scrape_token(
    make_server: ServerFactory, tmp_path: Path
) -> None:
    scrape = tmp_path / "scrape-token"
    scrape.write_text("  scrape-s3cret\n")  # whitespace around it is dropped
    async with make_server(tenants=TENANTS, metrics_token_file=str(scrape)) as srv:
        answers = {}
        for who in (None, "token-a", "token-ops", "scrape-s3cret", "wrong"):
            headers = {} if who is None else {"Authorization": f"Bearer {who}"}
            async with aiohttp.ClientSession() as s:
                async with s.get(f"{srv.url}/metrics", headers=headers) as r:
                    answers[who] = (r.status, await r.text())
        assert {who: status for who, (status, _) in answers.items()} == {
            None: 401,
            "token-a": 403,  # a tenant sees its own part in /status, not everyone's
            "token-ops": 200,
            "scrape-s3cret": 200,
            "wrong": 401,
        }
        assert "prorl_tenant_inflight" in answers["scrape-s3cret"][1]
        assert "not an admin" in answers["token-a"][1]
        # The scrape token opens /metrics only.
        async with aiohttp.ClientSession() as s:
            headers = {"Authorization": "Bearer scrape-s3cret"}
            async with s.get(f"{srv.url}/status", headers=headers) as r:
                assert r.status == 401
