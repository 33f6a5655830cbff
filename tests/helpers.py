"""Test helpers, one place for each: polling for state (``eventually``), free ports, and
servers (the ``make_server`` fixture, a ``serve`` subprocess, a forwarding proxy)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import re
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
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
from prorl_async.llm.pool import BackendPool
from prorl_async.sandbox import Runtime, WarmPool
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

    @property
    def runtime(self) -> Runtime:
        """The sandbox runtime (started with the server)."""
        runtime = self.service.shared.runtime
        assert runtime is not None, "the server is not started"
        return runtime

    @property
    def pool(self) -> BackendPool:
        """The LLM backend pool (started with the server)."""
        pool = self.service.shared.pool
        assert pool is not None, "the server is not started"
        return pool


def warm_pool(runtime: Runtime) -> WarmPool:
    """The runtime's warm pool (a server configured with ``warm_sandboxes``)."""
    assert isinstance(runtime.warm, WarmPool), f"no warm pool: {runtime.warm!r}"
    return runtime.warm


ServerFactory = Callable[..., AbstractAsyncContextManager[Server]]
# What a wait awaited: told, described at the failure (sync or async), or the check's source.
Description = str | Callable[[], str] | Callable[[], Awaitable[str]] | None


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
    check: Callable[[], Awaitable[bool] | bool],
    timeout: float = 10.0,
    what: Description = None,
    interval: float = 0.005,
) -> float:
    """Re-check real state until ``check()`` holds; the seconds it took.

    For state with no event to await (another process's, or a counter that announces
    nothing); never a sleep as synchronisation. Bounded: after ``timeout`` s (the check's
    own awaits included) it fails with an ``AssertionError`` naming ``what`` was awaited:
    a string, or a function (sync or async) run at the failure to describe the state then;
    by default the check's source. ``interval``: the pause between checks; longer where a
    check costs the checked process real work (an engine's ``/metrics``)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    scope = asyncio.timeout(timeout)
    try:
        async with scope:
            while True:
                result = check()
                if not isinstance(result, bool):
                    result = await result
                if result:
                    return loop.time() - start
                await asyncio.sleep(interval)
    except TimeoutError:
        if not scope.expired():
            raise  # the check's own timeout, not ours
    described = _describe(what, check)
    if inspect.isawaitable(described):
        try:
            async with asyncio.timeout(timeout):
                described = await described
        except TimeoutError:
            described = f"(describing the state took over {timeout:g} s)"
    raise AssertionError(f"not within {timeout:g} s: {described}")


def eventually_sync(
    check: Callable[[], bool],
    timeout: float,
    what: str | Callable[[], str] | None = None,
    interval: float = 0.1,
) -> float:
    """``eventually`` for synchronous tests (the Slurm cluster's): the seconds it took."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            described = _describe(what, check)
            assert isinstance(described, str)
            raise AssertionError(f"not within {timeout:g} s: {described}")
        time.sleep(interval)
    return time.monotonic() - start


def _describe(what: Description, check: Callable[[], object]) -> str | Awaitable[str]:
    if isinstance(what, str):
        return what
    if what is not None:
        return what()
    try:
        source = inspect.getsource(check).strip()
    except (OSError, TypeError):
        source = getattr(check, "__qualname__", repr(check))
    return f"`{source.splitlines()[0][:200]}` to hold"


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports nothing listens on (yet) at ``host``: connections to them
    are refused until someone binds them (the kernel may hand one out again later)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in socks:
            s.bind((host, 0))
        return [int(s.getsockname()[1]) for s in socks]


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host)[0]


@dataclass
class ServedProcess:
    """A ``prorl-async serve`` started by ``served``; ``lines`` is its log so far."""

    proc: asyncio.subprocess.Process
    url: str
    lines: list[str] = field(default_factory=list)
    reader: asyncio.Task[None] | None = None  # ends when the log does (the process exited)


@asynccontextmanager
async def served(
    state: Path,
    *args: str,
    env: dict[str, str] | None = None,
    prefix: tuple[str, ...] = (),
) -> AsyncIterator[ServedProcess]:
    """A real ``prorl-async serve`` on a free loopback port with ``state`` as its state
    dir, run under ``prefix`` (e.g. ``nsenter ...``). Its log is read throughout (never a
    full pipe) into ``lines``; on exit it is killed and waited for."""
    proc = await asyncio.create_subprocess_exec(
        *prefix,
        sys.executable,
        "-m",
        "prorl_async.cli",
        "serve",
        "--port",
        "0",
        "--state-dir",
        str(state),
        *args,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    server = ServedProcess(proc, "")
    try:
        assert proc.stderr is not None
        async with asyncio.timeout(60):
            while not server.url:
                line = (await proc.stderr.readline()).decode()
                assert line, f"server exited before listening: {server.lines}"
                server.lines.append(line)
                found = re.search(r"listening on (http://\S+)", line)
                if found:
                    server.url = found.group(1)
        server.reader = asyncio.create_task(_read_log(proc.stderr, server.lines))
        yield server
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        if server.reader is not None:
            await server.reader  # ends at the end of the log


async def _read_log(stream: asyncio.StreamReader, lines: list[str]) -> None:
    while line := await stream.readline():
        lines.append(line.decode())


@asynccontextmanager
async def server_process(
    tmp_path: Path, extra_env: dict[str, str], *args: str
) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    """``served`` with ``tmp_path / "state"`` and ``extra_env`` over this environment."""
    async with served(tmp_path / "state", *args, env={**os.environ, **extra_env}) as server:
        yield server.proc, server.url


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
                request.method,
                target + request.path_qs,
                data=await request.read(),
                headers=headers,
            ) as resp:
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
