"""The bearer token from PRORL_TOKEN or --token-file, through the real command line."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import aiohttp
import pytest

from tests.helpers import server_process


async def _statuses(url: str, token: str) -> tuple[int, int, int]:
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{url}/status") as bare:
            pass
        async with s.get(f"{url}/status", headers={"Authorization": f"Bearer {token}"}) as auth:
            pass
        async with s.get(f"{url}/healthz") as health:
            pass
    return bare.status, auth.status, health.status


async def test_token_from_prorl_token(tmp_path: Path) -> None:
    async with server_process(tmp_path, {"PRORL_TOKEN": "from-env"}) as (_, url):
        assert await _statuses(url, "from-env") == (401, 200, 200)


async def test_token_from_token_file(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    token_file.chmod(0o600)
    async with server_process(tmp_path, {}, "--token-file", str(token_file)) as (_, url):
        assert await _statuses(url, "from-file") == (401, 200, 200)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--token-file", "/nonexistent/token"], "token_file /nonexistent/token"),
        (["--token-file", "EMPTY"], "the file is empty"),
        (["--token-file", "TOKEN", "--token", "x"], "give one of them"),
    ],
)
async def test_bad_token_file_is_a_clear_start_error(
    tmp_path: Path, args: list[str], message: str
) -> None:
    (tmp_path / "EMPTY").write_text(" \n")
    (tmp_path / "TOKEN").write_text("t")
    args = [str(tmp_path / a) if a in ("EMPTY", "TOKEN") else a for a in args]
    cmd = [sys.executable, "-m", "prorl_async.cli", "serve", "--port", "0", *args]
    proc = await asyncio.create_subprocess_exec(*cmd, stderr=asyncio.subprocess.PIPE)
    async with asyncio.timeout(30):
        _, err = await proc.communicate()
    assert proc.returncode == 2 and message in err.decode()
