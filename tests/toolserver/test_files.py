"""upload / download / exec: the handler-facing tools."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from prorl_async.toolserver.client import ToolClient, ToolServerError
from tests.proctree import descendants
from tests.toolserver.conftest import RunningServer


async def test_upload_download_round_trip(client: ToolClient, workspace: Path) -> None:
    blob = bytes(range(256)) * 1000
    await client.upload("data/blob.bin", blob, mode=0o755)
    assert (workspace / "data/blob.bin").read_bytes() == blob
    assert (workspace / "data/blob.bin").stat().st_mode & 0o777 == 0o755
    assert await client.download("data/blob.bin") == blob


async def test_download_of_a_missing_file_names_it(client: ToolClient) -> None:
    with pytest.raises(ToolServerError, match="cannot read 'nope.txt'"):
        await client.download("nope.txt")


async def test_upload_with_bad_data_type_names_the_field(client: ToolClient) -> None:
    result = await client.call("upload", {"path": "x", "data": 12})
    assert not result.ok and result.error is not None and "$.data" in result.error


async def test_exec_collects_stdout_stderr_and_exit_code(
    client: ToolClient, workspace: Path
) -> None:
    result = await client.exec("pwd; cat; echo err >&2; exit 3", timeout=10, stdin="from stdin\n")
    assert result.stdout == f"{workspace}\nfrom stdin\n"
    assert result.stderr == "err\n"
    assert (result.exit_code, result.timed_out) == (3, False)


async def test_exec_timeout_kills_the_whole_group(
    client: ToolClient, server: RunningServer
) -> None:
    started = time.monotonic()
    result = await client.exec("sleep 100 & sleep 100; echo never", timeout=0.5)
    assert time.monotonic() - started < 5
    assert result.timed_out and result.exit_code == -9 and "never" not in result.stdout
    assert not [pid for pid in descendants(server.proc.pid) if b"sleep" in _comm(pid)]


async def test_exec_does_not_touch_the_model_shell(client: ToolClient) -> None:
    await client.call("bash", {"command": "cd /; export SHELL_ONLY=1"})
    result = await client.exec("echo ${SHELL_ONLY:-unset}; pwd", timeout=10)
    assert result.stdout.split("\n")[0] == "unset"
    assert result.stdout.split("\n")[1] != "/"


def _comm(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/comm", "rb") as f:
            return f.read()
    except OSError:
        return b""


async def test_exec_returns_when_the_command_exits_despite_a_background_job(
    client: ToolClient, server: RunningServer
) -> None:
    # The background job keeps running past the command's exit; exec must not wait for it
    # (it used to wait for EOF on pipes the job inherited) and must not leave it behind.
    t0 = time.monotonic()
    result = await client.exec("echo started; sleep 30 </dev/null >/dev/null 2>&1 &", timeout=20)
    assert result.exit_code == 0 and result.stdout == "started\n" and not result.timed_out
    assert time.monotonic() - t0 < 10
    assert not [pid for pid in descendants(server.proc.pid) if b"sleep" in _comm(pid)]
