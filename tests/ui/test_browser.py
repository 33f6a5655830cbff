"""The pages in a real headless Chromium (tests/ui/browser.py): log in through the form,
watch the dashboard change without a reload, and check a trajectory's DOM against its
result document: every token, mask, version, tool call and observation, and hostile
HTML from a tool shown as text with nothing run. Screenshots for the README are taken
here (written to docs/img with PRORL_UPDATE_SCREENSHOTS=1)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prorl_async.scripted_llm import LatencyModel, ScriptedLLM
from tests.helpers import ServerFactory, eventually
from tests.ui.browser import Chromium, Page
from tests.ui.conftest import (
    HOSTILE,
    TENANTS,
    ToolPolicy,
    ToolTask,
    api,
    checkpoint,
    login,
    shots,
)

SLOW = LatencyModel(per_token_s=0.01)  # a reply of a few hundred tokens: time to load weights


def _same_origin(page: Page, url: str) -> None:
    away = [u for u in page.requests() if not u.startswith(url + "/")]
    assert away == [], f"requests that left {url}: {away}"


async def _text(page: Page, selector: str) -> str:
    return str(await page.evaluate(f"document.querySelector({selector!r}).textContent"))


async def test_login_then_the_dashboard_counts_change_without_a_reload(
    make_server: ServerFactory, chromium: Chromium, tmp_path: Path
) -> None:
    async with make_server(tenants=TENANTS) as srv:
        page = await chromium.new_page()
        await login(page, srv.url, "token-ops")
        assert await _text(page, '[data-live="totals.done"]') == "0"
        await page.evaluate("window.__sameDocument = true")
        body = {"jobs": [{"task": "sleep", "instance": {"run_s": 0.05}}] * 5}
        ids = (await api(srv.url, "POST", "/process/batch", "token-a", body))["job_ids"]
        await page.wait_for(
            "document.querySelector('[data-live=\"totals.done\"]').textContent === '5'"
        )
        await page.wait_for(
            f"(() => {{ const s = document.querySelector('#recent tbody').textContent;"
            f" return {json.dumps(ids)}.every(id => s.includes(id)); }})()"
        )
        assert await page.evaluate("window.__sameDocument") is True  # no reload happened
        tenants = await _text(page, 'tbody[data-rows="tenants"]')
        assert "a" in tenants and "ops" in tenants
        link = await page.evaluate("document.querySelector('#recent tbody a').getAttribute('href')")
        assert link in {f"/ui/jobs/{i}" for i in ids}
        await page.goto(f"{srv.url}/ui/results")
        rows = await page.evaluate(
            "document.querySelectorAll('#results tbody tr[data-job]').length"
        )
        assert rows == 5
        await page.screenshot(shots(tmp_path) / "ui-results.png", full_page=False)
        assert page.console_errors() == [] and page.dialogs() == []
        _same_origin(page, srv.url)


async def _interrupted_job(srv: Any, llm: ScriptedLLM, tmp_path: Path) -> dict[str, Any]:
    """A two-turn job with a tool call whose second turn a weight load interrupts."""
    await api(
        srv.url,
        "POST",
        "/add_llm_server",
        "token-ops",
        {"address": llm.address, "weight_version": 1},
    )
    job = {"task": "ui_tools", "instance": {}, "sampling_params": {"max_tokens": 2000}}
    job_id = (await api(srv.url, "POST", "/process", "token-a", job))["job_id"]
    await llm.wait_requests(2)  # the turn after the tool's observation
    await eventually(lambda: llm.stats.decoding >= 1)
    load = {"version": 2, "path": checkpoint(tmp_path / "ckpt"), "mode": "abort"}
    await api(srv.url, "POST", "/weights/load", "token-ops", load)
    result: dict[str, Any] = await api(srv.url, "GET", f"/jobs/{job_id}?wait=60", "token-a")
    return result


async def test_a_trajectory_shows_every_token_call_and_observation_and_runs_nothing(
    make_server: ServerFactory, chromium: Chromium, tmp_path: Path
) -> None:
    async with (
        ScriptedLLM(policy=ToolPolicy(), latency=SLOW) as llm,
        make_server(handlers=(ToolTask(),), tenants=TENANTS, runtime="local") as srv,
    ):
        doc = await _interrupted_job(srv, llm, tmp_path)
        assert doc["status"] == "done" and doc["weight_versions"] == [1, 2], doc["error"]
        assert len(doc["turns"][2]["segments"]) == 2  # the load landed inside the turn
        page = await chromium.new_page()
        await login(page, srv.url, "token-a")
        await page.goto(f"{srv.url}/ui/jobs/{doc['job_id']}")
        tokens = await page.evaluate(
            "Array.from(document.querySelectorAll('#conversation .strip .t'), t =>"
            " [t.dataset.mask, t.dataset.version, t.title])"
        )
        assert len(tokens) == len(doc["response_ids"])
        assert [int(m) for m, _, _ in tokens] == doc["response_mask"]
        assert [v for _, v, _ in tokens] == [
            "" if v is None else str(v) for v in doc["response_versions"]
        ]
        assert all(
            t.startswith(f"id {i} · logprob {lp:.4f}")
            for (_, _, t), i, lp in zip(
                tokens, doc["response_ids"], doc["response_logprobs"], strict=True
            )
        )
        # The turn's interruption by the load is marked between its segments.
        marks = await page.evaluate(
            "Array.from(document.querySelectorAll('.strip .seg'), s =>"
            " [s.title, 0, Number(s.nextElementSibling.title.split(' ')[1])])"
        )
        loads = [title for title, _, _ in marks if title.startswith("weight load")]
        assert len(loads) == 1 and loads[0].endswith(("version 2", "→ 2")), marks
        # ... right before the first token of the segment made by the new weights.
        before = sum(len(t["token_ids"]) for t in doc["turns"][:2])
        first_new = doc["response_ids"][before + doc["turns"][2]["segments"][1]["start"]]
        assert [n for t, _, n in marks if t.startswith("weight load")] == [first_new]
        assert "interrupted by a weight load" in await _text(page, "#conversation")
        calls = await page.evaluate(
            "Array.from(document.querySelectorAll('.call'), c => c.innerText)"
        )
        assert len(calls) == 2 and "python" in calls[0] and "print(2 + 2) # <i>" in calls[0]
        assert "finish" in calls[1]
        observation = await page.evaluate("document.querySelector('.observation').innerText")
        assert "python" in observation and HOSTILE in observation  # shown as text
        conversation = await page.evaluate("document.getElementById('conversation').innerText")
        assert "What is 2 + 2? <b>bold?</b>" in conversation  # the prompt's user turn
        assert HOSTILE in await page.evaluate("document.getElementById('eval').innerText")
        # Nothing of it ran: no element made of it, no dialog, no console error.
        assert await page.evaluate("document.querySelectorAll('main script, main img').length") == 0
        assert await page.evaluate("typeof window.__xss") == "undefined"
        assert page.dialogs() == [] and page.console_errors() == []
        _same_origin(page, srv.url)
        await page.screenshot(shots(tmp_path) / "ui-trajectory.png")
        # An admin's dashboard names the engine, its weights and the load.
        await login(page, srv.url, "token-ops")
        assert await _text(page, '[data-live="weights.version"]') == "2"
        engines = await _text(page, 'tbody[data-rows="engines"]')
        assert llm.address in engines and "2" in engines
        await page.wait_for(  # the chart has a few samples of the run (one each 2 s)
            "document.querySelector('[data-chart=done]').getAttribute('points')"
            ".split(' ').length > 2"
        )
        await page.screenshot(shots(tmp_path) / "ui-dashboard.png")
        assert page.console_errors() == []


async def test_another_tenants_job_answers_404_in_the_browser(
    make_server: ServerFactory, chromium: Chromium
) -> None:
    async with make_server(tenants=TENANTS) as srv:
        body = {"task": "sleep", "instance": {}}
        job_id = (await api(srv.url, "POST", "/process", "token-a", body))["job_id"]
        await api(srv.url, "GET", f"/jobs/{job_id}?wait=30", "token-a")
        page = await chromium.new_page()
        await page.goto(f"{srv.url}/ui/jobs/{job_id}")
        assert (await page.url()).startswith(f"{srv.url}/ui/login?next=/ui/jobs/")
        await login(page, srv.url, "token-b")
        await page.goto(f"{srv.url}/ui/jobs/{job_id}")
        statuses = [
            p["response"]["status"]
            for s, m, p in chromium.events
            if m == "Network.responseReceived" and p["response"]["url"].endswith(job_id)
        ]
        assert statuses[-1] == 404
        assert await _text(page, "h1") == "Not Found"
        cookie = await page.evaluate("document.cookie")
        assert cookie == ""  # HttpOnly: the page's scripts cannot read the session


async def test_the_dashboard_sends_the_viewer_to_the_login_when_its_session_ends(
    make_server: ServerFactory, chromium: Chromium
) -> None:
    async with make_server(tenants=TENANTS) as srv:
        page = await chromium.new_page()
        await login(page, srv.url, "token-a")
        await page.send("Network.clearBrowserCookies")
        await page.wait_for("location.pathname === '/ui/login'")  # the script went there
        assert await page.evaluate("!!document.getElementById('login')")
