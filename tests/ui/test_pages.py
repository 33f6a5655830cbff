"""The ``/ui/`` pages over plain HTTP on a real server: the login and its cookie,
redirects, tenant rules, security headers, the listing's filters and pages (what a
browser sees is in ``test_browser.py``)."""

from __future__ import annotations

import re
from typing import Any

import aiohttp
import pytest

from tests.helpers import ServerFactory
from tests.ui.conftest import TENANTS

PAGES = ["/ui/", "/ui/results", "/ui/jobs/j-x", "/ui/nothing/here"]
QUOTED = {"/ui/results?task=a&status=done": "/ui/results?task%3Da%26status%3Ddone"}


async def _session(url: str, token: str) -> aiohttp.ClientSession:
    """A client session logged in through the form (cookie jar that keeps it)."""
    s = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))
    async with s.post(f"{url}/ui/login", data={"token": token, "next": "/ui/"}) as r:
        assert r.status == 200 and r.url.path == "/ui/", (r.status, r.url)
    return s


async def _sleep_jobs(url: str, token: str, n: int, **instance: Any) -> list[str]:
    jobs = [{"task": "sleep", "instance": instance}] * n
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(headers=headers) as s:
        async with s.post(f"{url}/process/batch", json={"jobs": jobs}) as r:
            ids: list[str] = (await r.json())["job_ids"]
        for job_id in ids:  # every result committed before the pages read them
            async with s.get(f"{url}/jobs/{job_id}?wait=30") as r:
                assert r.status == 200
    return ids


async def test_without_a_session_every_page_redirects_to_the_login_form(
    make_server: ServerFactory,
) -> None:
    async with make_server(tenants=TENANTS) as srv, aiohttp.ClientSession() as s:
        for path in [*PAGES, *QUOTED]:
            async with s.get(srv.url + path, allow_redirects=False) as r:
                assert r.status == 303, path
                assert r.headers["Location"] == f"/ui/login?next={QUOTED.get(path, path)}"
        async with s.get(f"{srv.url}/ui/live") as r:
            assert r.status == 401  # the dashboard's data is not a page: no redirect
        async with s.get(f"{srv.url}/ui/login") as r:
            assert r.status == 200 and 'name="token"' in await r.text()
        async with s.get(f"{srv.url}/ui/static/live.js") as r:
            assert r.status == 200 and r.content_type == "application/javascript"
        # A bearer token opens the API, not the pages (a browser never sends one).
        auth = {"Authorization": "Bearer token-ops"}
        async with s.get(f"{srv.url}/ui/", headers=auth, allow_redirects=False) as r:
            assert r.status == 303


async def test_login_sets_an_httponly_strict_session_cookie_never_the_token(
    make_server: ServerFactory,
) -> None:
    async with make_server(tenants=TENANTS) as srv, aiohttp.ClientSession() as s:
        form = {"token": "token-a", "next": "/ui/results"}
        async with s.post(f"{srv.url}/ui/login", data=form, allow_redirects=False) as r:
            assert r.status == 303 and r.headers["Location"] == "/ui/results"
            cookie = r.headers["Set-Cookie"]
        assert re.search(r"(?i)\bHttpOnly\b", cookie) and "SameSite=Strict" in cookie
        assert "Path=/ui" in cookie and "token-a" not in cookie
        async with s.post(f"{srv.url}/ui/login", data={"token": "wrong"}) as r:
            assert r.status == 401 and "Unknown token" in await r.text()
        # Not an open redirect: `next` stays on this server's pages.
        form = {"token": "token-a", "next": "//evil.example/"}
        async with s.post(f"{srv.url}/ui/login", data=form, allow_redirects=False) as r:
            assert r.headers["Location"] == "/ui/"
        # A login posted from another site is refused.
        evil = {"Origin": "http://evil.example"}
        async with s.post(f"{srv.url}/ui/login", data=form, headers=evil) as r:
            assert r.status == 403


async def test_logout_ends_the_session(make_server: ServerFactory) -> None:
    async with make_server(tenants=TENANTS) as srv:
        s = await _session(srv.url, "token-a")
        async with s:
            async with s.post(f"{srv.url}/ui/logout", allow_redirects=False) as r:
                assert r.status == 303 and r.headers["Location"] == "/ui/login"
            async with s.get(f"{srv.url}/ui/", allow_redirects=False) as r:
                assert r.status == 303


async def test_pages_send_a_strict_csp_and_no_inline_script(make_server: ServerFactory) -> None:
    async with make_server(tenants=TENANTS) as srv:
        (job_id,) = await _sleep_jobs(srv.url, "token-a", 1, result_tokens=40)
        s = await _session(srv.url, "token-a")
        async with s:
            for path in ["/ui/", "/ui/results", f"/ui/jobs/{job_id}", "/ui/login"]:
                async with s.get(srv.url + path) as r:
                    assert r.status == 200, path
                    csp = r.headers["Content-Security-Policy"]
                    html = await r.text()
                assert "script-src 'self'" in csp and "default-src 'none'" in csp
                assert "unsafe-inline" not in csp and r.headers["Cache-Control"] == "no-store"
                # Every script is a file of this server; no inline script or handler.
                assert re.findall(r"<script(?![^>]*\bsrc=\"/ui/static/)", html) == []
                assert not re.search(r"\son[a-z]+=", html) and "style=" not in html
                assert not re.search(r"(src|href)=\"(https?:)?//", html)


async def test_a_tenant_sees_only_its_own_jobs_and_an_admin_sees_all(
    make_server: ServerFactory,
) -> None:
    async with make_server(tenants=TENANTS) as srv:
        (mine,) = await _sleep_jobs(srv.url, "token-a", 1)
        (theirs,) = await _sleep_jobs(srv.url, "token-b", 1)
        a = await _session(srv.url, "token-a")
        ops = await _session(srv.url, "token-ops")
        async with a, ops:
            async with a.get(f"{srv.url}/ui/jobs/{mine}") as r:
                assert r.status == 200 and mine in await r.text()
            async with a.get(f"{srv.url}/ui/jobs/{theirs}") as r:
                assert r.status == 404 and theirs in await r.text()  # named, not shown
            async with a.get(f"{srv.url}/ui/results") as r:
                html = await r.text()
            assert mine in html and theirs not in html
            async with a.get(f"{srv.url}/ui/live") as r:
                live = await r.json()
            assert [row["job_id"] for row in live["recent"]] == [mine]
            assert live["weights"] is None  # /weights is an admin route
            for job_id in (mine, theirs):
                async with ops.get(f"{srv.url}/ui/jobs/{job_id}") as r:
                    assert r.status == 200
            async with ops.get(f"{srv.url}/ui/results?tenant=b") as r:
                html = await r.text()
            assert theirs in html and mine not in html
            async with ops.get(f"{srv.url}/ui/live") as r:
                live = await r.json()
            assert {row["job_id"] for row in live["recent"]} == {mine, theirs}


async def test_open_mode_needs_no_login(make_server: ServerFactory) -> None:
    async with make_server() as srv, aiohttp.ClientSession() as s:
        (job_id,) = await _sleep_jobs(srv.url, "unused", 1)
        async with s.get(f"{srv.url}/ui/jobs/{job_id}") as r:
            assert r.status == 200 and "default (admin)" in await r.text()
        async with s.get(f"{srv.url}/ui/login", allow_redirects=False) as r:
            assert r.status == 303 and r.headers["Location"] == "/ui/"
        async with s.get(f"{srv.url}/ui/results") as r:
            assert "Log out" not in await r.text()


async def test_unknown_page_and_job_are_404_pages_and_the_api_is_unchanged(
    make_server: ServerFactory,
) -> None:
    async with make_server(tenants=TENANTS) as srv:
        s = await _session(srv.url, "token-a")
        async with s:
            for path in ["/ui/nothing/here", "/ui/jobs/j-unknown"]:
                async with s.get(srv.url + path) as r:
                    assert r.status == 404 and r.content_type == "text/html", path
            async with s.post(f"{srv.url}/ui/") as r:
                assert r.status == 405
            # The API still wants its bearer token, cookie or not.
            async with s.get(f"{srv.url}/status") as r:
                assert r.status == 401
            async with s.get(f"{srv.url}/nothing") as r:
                assert r.status == 401 and r.content_type == "application/problem+json"


@pytest.mark.parametrize(
    ("query", "expect"),
    [
        ("status=failed", {"failed"}),
        ("status=done&min_reward=0.5", {"good"}),
        ("max_reward=0.2", {"bad"}),  # a failed job has no reward to compare
        ("task=sleep", {"good", "bad", "failed"}),
        ("task=math", set()),
    ],
)
async def test_results_filter_by_status_reward_and_task(
    make_server: ServerFactory, query: str, expect: set[str]
) -> None:
    async with make_server(tenants=TENANTS) as srv:
        kinds = {
            "good": await _sleep_jobs(srv.url, "token-a", 2, reward=1.0),
            "bad": await _sleep_jobs(srv.url, "token-a", 2, reward=0.0),
            "failed": await _sleep_jobs(srv.url, "token-a", 2, fail_in="run"),
        }
        s = await _session(srv.url, "token-a")
        async with s, s.get(f"{srv.url}/ui/results?{query}") as r:
            html = await r.text()
        shown = set(re.findall(r'data-job="([^"]+)"', html))
        assert shown == {j for kind in expect for j in kinds[kind]}


async def test_results_are_paged_newest_first_by_the_completion_cursor(
    make_server: ServerFactory,
) -> None:
    async with make_server(tenants=TENANTS) as srv:
        ids = []
        for _ in range(3):  # one at a time: their seqs follow this order
            ids += await _sleep_jobs(srv.url, "token-a", 25)
        s = await _session(srv.url, "token-a")
        seen: list[str] = []
        pages = 0
        async with s:
            path = "/ui/results"
            while path:
                async with s.get(srv.url + path) as r:
                    html = await r.text()
                seqs = [int(x) for x in re.findall(r'<tr data-job="[^"]+"><td>(\d+)</td>', html)]
                assert seqs == sorted(seqs, reverse=True)
                seen += re.findall(r'data-job="([^"]+)"', html)
                older = re.search(r'href="(/ui/results\?[^"]*)" id="older"', html)
                path = older.group(1).replace("&amp;", "&") if older else ""
                pages += 1
            async with s.get(f"{srv.url}/ui/results?before=x") as r:
                assert r.status == 400
        assert pages >= 2 and sorted(seen) == sorted(ids) and len(seen) == len(set(seen))
