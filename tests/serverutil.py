from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from prorl_async.api.app import run_server
from prorl_async.api.routes import SERVICE
from prorl_async.client import RolloutClient
from prorl_async.config import load_config
from prorl_async.core.handler import HandlerRegistry
from prorl_async.service import RolloutService
from tests.blocking import BlockingHandler


class Server:
    def __init__(self, app: web.Application, url: str, client: RolloutClient) -> None:
        self.app = app
        self.url = url
        self.client = client

    @property
    def service(self) -> RolloutService:
        return self.app[SERVICE]


ServerFactory = Callable[..., AbstractAsyncContextManager[Server]]


@pytest.fixture
def blocking() -> BlockingHandler:
    return BlockingHandler()


@pytest.fixture
def make_server(tmp_path: Path, blocking: BlockingHandler) -> ServerFactory:
    @asynccontextmanager
    async def factory(handlers: tuple[Any, ...] = (), **overrides: Any) -> AsyncIterator[Server]:
        cfg = load_config(
            overrides={"port": 0, "state_dir": str(tmp_path / "state"), **overrides}, env={}
        )
        registry = HandlerRegistry.discover()
        registry.register(blocking)
        for handler in handlers:
            registry.register(handler)
        async with run_server(cfg, registry) as (app, url):
            async with RolloutClient(url, token=cfg.token) as client:
                yield Server(app, url, client)

    return factory


async def eventually(
    check: Callable[[], Awaitable[bool] | bool], timeout: float = 10.0, interval: float = 0.005
) -> None:
    """Re-check real server state until it holds (bounded; for state with no event to await).

    ``interval``: the pause between checks; longer where a check costs the checked process
    real work (an engine's ``/metrics``)."""
    async with asyncio.timeout(timeout):
        while True:
            result = check()
            if not isinstance(result, bool):
                result = await result
            if result:
                return
            await asyncio.sleep(interval)


@asynccontextmanager
async def server_process(
    tmp_path: Path, extra_env: dict[str, str], *args: str
) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    env = {**os.environ, **extra_env}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "prorl_async.cli",
        "serve",
        "--port",
        "0",
        "--state-dir",
        str(tmp_path / "state"),
        *args,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        assert proc.stderr is not None
        async with asyncio.timeout(30):
            while True:
                line = (await proc.stderr.readline()).decode()
                assert line, "server exited before listening"
                found = re.search(r"listening on (http://\S+)", line)
                if found:
                    break
        yield proc, found.group(1)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@asynccontextmanager
async def forwarding_proxy(
    target: str, seen: Callable[[web.Request], None] = lambda request: None
) -> AsyncIterator[str]:
    """TEST DOUBLE network: forwards every request to ``target`` and its answer back;
    ``seen(request)`` runs once the answer is read (it may count the request, or cut
    the connection so that the answer is lost after the server did the work)."""
    async with aiohttp.ClientSession() as session:

        async def handle(request: web.Request) -> web.Response:
            headers = {k: v for k, v in request.headers.items() if k.lower() != "host"}
            async with session.request(
                request.method, target + request.path_qs, data=await request.read(),
                headers=headers,
            ) as resp:  # fmt: skip
                body, status = await resp.read(), resp.status
                ctype = resp.headers.get("Content-Type", "application/json")
            seen(request)
            return web.Response(body=body, status=status, headers={"Content-Type": ctype})

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            yield f"http://127.0.0.1:{runner.addresses[0][1]}"
        finally:
            await runner.cleanup()
