"""Fixtures of the page tests: tenants, a real Chromium, a task whose tool answers with
hostile HTML, and the scripted model (TEST DOUBLE) that calls it."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from prorl_async import AgentHandler, Job, run_agent
from prorl_async.scripted_llm.policies import tool_call
from tests.conftest import require
from tests.ui.browser import Chromium, Page, chromium_path

ROOT = Path(__file__).resolve().parents[2]
TENANTS: dict[str, dict[str, Any]] = {
    "a": {"token": "token-a"},
    "b": {"token": "token-b", "max_inflight": 50},
    "ops": {"token": "token-ops", "admin": True},
}
HOSTILE = (
    "<script>window.__xss = 1; alert('xss')</script>"
    '<img src=x onerror="window.__xss = 2; alert(2)">'
)
PYTHON_SPEC = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run Python code.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}},
    },
}


@pytest.fixture
async def chromium(tmp_path: Path) -> AsyncIterator[Chromium]:
    require(chromium_path() is not None, "chromium is not installed (the browser tests)")
    async with Chromium(tmp_path / "chromium") as browser:
        yield browser


def shots(tmp_path: Path) -> Path:
    """Where screenshots go: docs/img with PRORL_UPDATE_SCREENSHOTS=1 (the README's),
    else the test's own directory (taken all the same, the tree stays clean)."""
    if os.environ.get("PRORL_UPDATE_SCREENSHOTS") == "1":
        (ROOT / "docs" / "img").mkdir(exist_ok=True)
        return ROOT / "docs" / "img"
    return tmp_path


async def login(page: Page, url: str, token: str) -> None:
    """Log in through the form, as a person does (logging out first if logged in)."""
    await page.goto(f"{url}/ui/login")
    if not await page.evaluate("!!document.getElementById('login')"):
        await page.evaluate("document.querySelector('form.logout').submit()")
        await page.wait_for("!!document.getElementById('login')")
    await page.evaluate(
        "(() => { const f = document.getElementById('login');"
        f" f.elements.token.value = {token!r}; f.submit(); }})()"
    )
    await page.wait_for(
        "location.pathname === '/ui/' && document.readyState === 'complete'"
        " && !!document.getElementById('live')"
    )


async def api(url: str, method: str, path: str, token: str, body: Any = None) -> Any:
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        aiohttp.ClientSession() as s,
        s.request(method, url + path, json=body, headers=headers) as r,
    ):
        assert r.status < 300, (r.status, await r.text())
        return await r.json()


class HostileTools:
    """TEST DOUBLE tools: ``python`` answers with the code it got and hostile HTML."""

    @property
    def specs(self) -> list[dict[str, Any]]:
        return [PYTHON_SPEC]

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        return f"ran {arguments.get('code')!r}: 4\n{HOSTILE}"


class ToolTask(AgentHandler):
    """A task with a tool and no sandbox: its rollouts hold tool calls and observations."""

    name = "ui_tools"

    async def run(self, job: Job) -> None:
        messages = [
            {"role": "system", "content": "You are a careful agent. Use the python tool."},
            {"role": "user", "content": "What is 2 + 2? <b>bold?</b>"},
        ]
        await run_agent(job, messages=messages, tools=HostileTools())

    async def eval(self, job: Job) -> None:
        answer = getattr(job.trajectory, "answer", None)
        job.reward = 1.0 if answer == "4" else 0.0
        job.eval = {"correct": answer == "4", "predicted": answer, "note": HOSTILE}


class ToolPolicy:
    """TEST DOUBLE model: calls ``python``, then talks ``words`` words and finishes."""

    def __init__(self, words: int = 200) -> None:
        self.words = words

    def reply(self, conversation: str) -> str:
        if "<tool_response>" not in conversation:
            return "Let me compute.\n" + tool_call("python", {"code": "print(2 + 2) # <i>"})
        talk = " ".join(f"w{i}" for i in range(self.words))
        return f"The tool says 4. {talk}\n" + tool_call("finish", {"answer": "4"})


def checkpoint(path: Path) -> str:
    """A directory the server takes for a checkpoint (the scripted engine 'loads' it)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text('{"model_type": "scripted"}')
    (path / "model.safetensors").write_bytes(b"")
    return str(path)
