"""A real headless Chromium for the page tests, driven over the DevTools protocol (a
websocket, with aiohttp: no selenium, no Playwright).

``Chromium`` owns the browser process: it starts it with a fresh profile and, on exit,
closes it through the protocol, then kills its process group and reaps it. ``Page`` is
one tab: navigate, evaluate, wait for the DOM (bounded, by polling), take a screenshot,
and every console error, exception, dialog and request the page made.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import os
import shutil
import signal
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp

from tests.helpers import eventually

__all__ = ["Chromium", "Page", "chromium_path"]

_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-extensions",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--mute-audio",
    "--hide-scrollbars",
    "--remote-debugging-port=0",
)


def chromium_path() -> str | None:
    """The system Chromium (``PRORL_CHROMIUM`` names another), or None."""
    named = os.environ.get("PRORL_CHROMIUM")
    if named:
        return named if os.access(named, os.X_OK) else None
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


class Chromium:
    """A headless Chromium process and its DevTools connection (async context manager)."""

    def __init__(self, profile: Path, *, width: int = 1280, height: int = 900) -> None:
        self.profile, self.size = profile, (width, height)
        self.proc: asyncio.subprocess.Process | None = None
        self._session: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._reader: asyncio.Task[None] | None = None
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.events: list[tuple[str | None, str, dict[str, Any]]] = []

    async def __aenter__(self) -> Chromium:
        binary = chromium_path()
        assert binary is not None, "no chromium"
        self.profile.mkdir(parents=True, exist_ok=True)
        log = (self.profile / "chromium.log").open("wb")
        try:
            self.proc = await asyncio.create_subprocess_exec(
                binary,
                *_FLAGS,
                f"--user-data-dir={self.profile}",
                f"--window-size={self.size[0]},{self.size[1]}",
                "about:blank",
                stdout=log,
                stderr=log,
                start_new_session=True,  # its helpers are killed with it (killpg)
            )
        finally:
            log.close()
        try:
            await self._connect()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def _connect(self) -> None:
        port_file = self.profile / "DevToolsActivePort"

        def written() -> bool:
            # Chromium creates the file, then writes its port and path: an empty or half
            # file was seen on a loaded machine.
            try:
                return len(port_file.read_text().split()) >= 2
            except FileNotFoundError:
                return False

        await eventually(written, timeout=30, what="Chromium's DevToolsActivePort, written")
        port, path = port_file.read_text().split()[:2]
        self._session = aiohttp.ClientSession()
        self._ws = await self._session.ws_connect(f"ws://127.0.0.1:{port}{path}", max_msg_size=0)
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self._ws is not None
        async for msg in self._ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            data = msg.json()
            future = self._waiting.pop(data.get("id", -1), None)
            if future is not None and not future.done():
                future.set_result(data)
            elif "method" in data:
                self.events.append((data.get("sessionId"), data["method"], data.get("params", {})))

    async def send(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = None
    ) -> dict[str, Any]:
        """One protocol command; its result (an error answer raises)."""
        assert self._ws is not None
        key = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[key] = future
        message: dict[str, Any] = {"id": key, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        await self._ws.send_json(message)
        async with asyncio.timeout(60):
            answer = await future
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        result: dict[str, Any] = answer.get("result", {})
        return result

    async def new_page(self) -> Page:
        """A new tab with the page, runtime, network and log domains on."""
        target = await self.send("Target.createTarget", {"url": "about:blank"})
        attached = await self.send(
            "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}
        )
        page = Page(self, attached["sessionId"])
        for domain in ("Page", "Runtime", "Network", "Log"):
            await page.send(f"{domain}.enable")
        return page

    async def aclose(self) -> None:
        """Close the browser (protocol first, then SIGKILL to its group) and reap it."""
        with contextlib.suppress(Exception):
            if self._ws is not None and not self._ws.closed:
                async with asyncio.timeout(5):
                    await self.send("Browser.close")
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._ws is not None:
            await self._ws.close()
        if self._session is not None:
            await self._session.close()
        proc, self.proc = self.proc, None
        if proc is None:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10):
                await proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # helpers left of the group, if any
        await proc.wait()


class Page:
    """One tab of ``Chromium``."""

    def __init__(self, browser: Chromium, session: str) -> None:
        self.browser, self.session = browser, session

    async def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return await self.browser.send(method, params, self.session)

    def _events(self, method: str) -> list[dict[str, Any]]:
        return [p for s, m, p in self.browser.events if s == self.session and m == method]

    async def set_cookie(self, url: str, name: str, value: str) -> None:
        await self.send(
            "Network.setCookie",
            {"url": url, "name": name, "value": value, "httpOnly": True, "sameSite": "Strict"},
        )

    async def goto(self, url: str) -> None:
        """Navigate and wait for the load event (bounded)."""
        before = len(self._events("Page.loadEventFired"))
        await self.send("Page.navigate", {"url": url})
        await eventually(lambda: len(self._events("Page.loadEventFired")) > before, timeout=30)

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        answer = await self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in answer:
            raise RuntimeError(f"{expression}: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    async def wait_for(self, expression: str, timeout: float = 20.0) -> float:
        """Until ``expression`` is truthy in the page (polled, bounded)."""

        async def holds() -> bool:
            return bool(await self.evaluate(expression))

        return await eventually(holds, timeout=timeout, what=f"page: {expression}", interval=0.05)

    async def url(self) -> str:
        return str(await self.evaluate("location.href"))

    async def screenshot(self, path: Path, full_page: bool = True) -> None:
        params: dict[str, Any] = {"format": "png", "captureBeyondViewport": full_page}
        if full_page:
            metrics = await self.send("Page.getLayoutMetrics")
            size = metrics["cssContentSize"]
            params["clip"] = {
                "x": 0,
                "y": 0,
                "width": size["width"],
                "height": min(size["height"], 4000),
                "scale": 1,
            }
        shot = await self.send("Page.captureScreenshot", params)
        path.write_bytes(base64.b64decode(shot["data"]))

    def console_errors(self) -> list[str]:
        """Console errors, uncaught exceptions and error log entries (CSP refusals,
        failed loads) of this page so far."""
        out = [
            " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", []))
            for p in self._events("Runtime.consoleAPICalled")
            if p.get("type") in ("error", "assert")
        ]
        out += [str(p.get("exceptionDetails")) for p in self._events("Runtime.exceptionThrown")]
        out += [
            f"{p['entry'].get('source')}: {p['entry'].get('text')} {p['entry'].get('url', '')}"
            for p in self._events("Log.entryAdded")
            if p["entry"].get("level") == "error"
        ]
        return out

    def dialogs(self) -> list[dict[str, Any]]:
        return self._events("Page.javascriptDialogOpening")

    def requests(self) -> list[str]:
        """The URL of every request the page sent."""
        return [p["request"]["url"] for p in self._events("Network.requestWillBeSent")]
