"""``prorl-async serve --port 0 --port-file F``: the bound port is published atomically."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import aiohttp

from prorl_async.api.serve import write_port_file
from tests.helpers import eventually


async def _healthz(url: str) -> int:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/healthz") as resp:
        return resp.status


async def test_port_file_names_the_listening_port(tmp_path: Path) -> None:
    port_file = tmp_path / "port"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "prorl_async.cli",
        "serve",
        "--host",
        "localhost",
        "--port",
        "0",
        "--port-file",
        str(port_file),
        "--state-dir",
        str(tmp_path / "state"),
        env={**os.environ, "PRORL_TOKEN": "s3cret"},
    )
    try:
        await eventually(port_file.exists, timeout=30)
        port = int(port_file.read_text())
        assert port > 0
        # a NodeAddr may be a name: "localhost" resolved and bound
        assert await _healthz(f"http://127.0.0.1:{port}") == 200
        proc.terminate()
        assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_write_port_file_replaces_whole_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "p"
    target.write_text("garbage")
    write_port_file(str(target), 41234)
    assert target.read_text() == "41234\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p"]
