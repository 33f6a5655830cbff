"""The python tool: a real IPython kernel over ipc sockets, through the real server."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

from prorl_async.toolserver.client import ToolClient
from tests.helpers import eventually
from tests.toolserver.conftest import run_server


async def python(client: ToolClient, code: str, **args: float) -> tuple[str, dict[str, object]]:
    result = await client.call("python", {"code": code, **args})
    assert result.ok, result.error
    return result.output, result.data


async def test_state_stdout_result_and_traceback(client: ToolClient, workspace: Path) -> None:
    output, data = await python(client, "import os\nx = 41\nprint('cwd', os.getcwd())\nx + 1")
    assert output == f"cwd {workspace}\n42"
    assert data["status"] == "ok"
    output, _ = await python(client, "import sys; print('to stderr', file=sys.stderr); x * 2")
    assert output == "to stderr\n82"
    output, data = await python(client, "def f():\n    return 1 / 0\nf()")
    assert data["status"] == "error"
    assert "ZeroDivisionError" in output and "return 1 / 0" in output
    assert "\x1b" not in output


async def test_timeout_interrupts_and_kernel_keeps_state(client: ToolClient) -> None:
    await python(client, "kept = 'yes'")
    started = time.monotonic()
    output, data = await python(client, "while True: pass", timeout=1)
    assert time.monotonic() - started < 8
    assert "KeyboardInterrupt" in output
    assert "timed out after 1 s; the kernel was interrupted" in output
    assert data["timed_out"] is True
    output, data = await python(client, "print(kept)")
    assert (output, data["timed_out"]) == ("yes", False)


async def test_kernel_uses_ipc_and_is_reaped(workspace: Path) -> None:
    async with run_server(workspace) as server:
        async with await server.connect() as client:
            _, data = await python(client, "1")
            info = json.loads(Path(str(data["connection_file"])).read_text())
            assert info["transport"] == "ipc"
            pid = int(str(data["kernel_pid"]))
            # The client side (the server process) talks to the kernel without any TCP socket.
            assert not _tcp_sockets_of(server.proc.pid)
            # ipykernel always binds one loopback PULL socket of its own for output from
            # forked children (iostream.py, _setup_pipe_in); nothing else may be TCP.
            assert len(_tcp_sockets_of(pid)) <= 1
            assert all(
                Path(f"{info['ip']}-{info[p]}").exists() for p in ("shell_port", "iopub_port")
            )
        assert await server.stop() == 0
    assert not os.path.exists(f"/proc/{pid}")


def _tcp_sockets_of(pid: int) -> set[str]:
    fds = Path(f"/proc/{pid}/fd")
    inodes = {
        os.readlink(fd)[8:-1] for fd in fds.iterdir() if os.readlink(fd).startswith("socket:")
    }
    tcp: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            tcp.add(line.split()[9])
    return inodes & tcp


async def test_stopping_while_the_kernel_is_busy_leaves_no_process(workspace: Path) -> None:
    async with run_server(workspace) as server:
        client = await server.connect()
        _, data = await python(
            client, "import subprocess; child = subprocess.Popen(['sleep', '300'])"
        )
        pid = int(str(data["kernel_pid"]))
        child = int((await python(client, "print(child.pid)"))[0])
        code = "open('busy', 'w').close(); import time; time.sleep(100)"
        busy = asyncio.ensure_future(client.call("python", {"code": code}))
        # no event says the kernel started the cell
        await eventually(
            (workspace / "busy").exists, timeout=10, what="the cell to start", interval=0.01
        )
        started = time.monotonic()
        assert await server.stop() == 0
        assert time.monotonic() - started < 10
        await client.aclose()
        await asyncio.gather(busy, return_exceptions=True)
    assert not os.path.exists(f"/proc/{pid}") and not os.path.exists(f"/proc/{child}")
