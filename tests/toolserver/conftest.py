"""Fixtures: a real tool server subprocess on a Unix socket, and a client connected to it."""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from prorl_async.toolserver.client import ToolClient


class RunningServer:
    """A tool server process, its socket and workspace."""

    def __init__(self, proc: asyncio.subprocess.Process, socket: str, workspace: Path) -> None:
        self.proc = proc
        self.socket = socket
        self.workspace = workspace

    async def connect(self, **kwargs: object) -> ToolClient:
        return await ToolClient.connect(self.socket, timeout=20.0, **kwargs)  # type: ignore[arg-type]

    async def stop(self) -> int:
        """SIGTERM and wait; SIGKILL if it does not exit within 15 s."""
        if self.proc.returncode is None:
            self.proc.terminate()
        try:
            async with asyncio.timeout(15):
                return await self.proc.wait()
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
            raise


@asynccontextmanager
async def run_server(workspace: Path, *extra: str) -> AsyncIterator[RunningServer]:
    """Start ``python -m prorl_async.toolserver`` and stop it (and check it exited) afterwards."""
    # Socket paths are limited to ~107 bytes, and pytest's tmp_path can be longer.
    sockdir = tempfile.mkdtemp(prefix="ts-", dir="/tmp")
    socket = f"{sockdir}/tools.sock"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "prorl_async.toolserver",
        "--socket",
        socket,
        "--workspace",
        str(workspace),
        *extra,
        stderr=asyncio.subprocess.DEVNULL,
    )
    server = RunningServer(proc, socket, workspace)
    try:
        yield server
    finally:
        await server.stop()
        shutil.rmtree(sockdir, ignore_errors=True)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


@pytest.fixture
async def server(workspace: Path) -> AsyncIterator[RunningServer]:
    async with run_server(workspace) as running:
        yield running


@pytest.fixture
async def client(server: RunningServer) -> AsyncIterator[ToolClient]:
    async with await server.connect() as connected:
        yield connected
