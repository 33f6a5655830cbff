"""The bash tool through the whole path: client -> UDS -> server -> real PTY bash."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from prorl_async.toolserver.client import ToolClient
from tests.helpers import eventually
from tests.proctree import cmdline, descendants
from tests.toolserver.conftest import run_server


async def bash(client: ToolClient, command: str, **args: float) -> tuple[str, dict[str, object]]:
    result = await client.call("bash", {"command": command, **args})
    assert result.ok, result.error
    return result.output, result.data


async def test_state_persists_across_commands(client: ToolClient, workspace: Path) -> None:
    assert await bash(client, "pwd") == (
        str(workspace),
        {"exit_code": 0, "cwd": str(workspace), "timed_out": False},
    )
    (workspace / "sub").mkdir()
    await bash(client, 'cd sub && export GREETING=hello && greet() { echo "$GREETING $1"; }')
    output, data = await bash(client, "pwd; greet world")
    assert output == f"{workspace / 'sub'}\nhello world"
    assert data["cwd"] == str(workspace / "sub")


async def test_exit_code_is_reported(client: ToolClient) -> None:
    output, data = await bash(client, "echo oops >&2; exit_with() { return $1; }; exit_with 3")
    assert data["exit_code"] == 3
    assert output == "oops\n[exit code: 3]"
    output, data = await bash(client, "nosuchcommand-xyz")
    assert "nosuchcommand-xyz: command not found" in output
    assert "/prorl-bash-" not in output  # the sourced file's path is not leaked
    assert data["exit_code"] == 127


async def test_timeout_interrupts_and_shell_stays_usable(client: ToolClient) -> None:
    await bash(client, "export KEEP=1")
    started = time.monotonic()
    output, data = await bash(client, "echo before; sleep 100; echo never", timeout=1)
    assert time.monotonic() - started < 5
    assert output.startswith("before\n")
    assert "never" not in output
    assert "timed out after 1 s; interrupted with Ctrl-C" in output
    assert data["timed_out"] is True
    output, data = await bash(client, "echo after $KEEP")
    assert (output, data["exit_code"], data["timed_out"]) == ("after 1", 0, False)


async def test_timeout_of_a_busy_builtin_loop(client: ToolClient) -> None:
    output, data = await bash(client, "while true; do :; done", timeout=0.5)
    assert data["timed_out"] is True
    assert (await bash(client, "echo ok"))[0] == "ok"


async def test_no_output_timeout(client: ToolClient) -> None:
    started = time.monotonic()
    output, data = await bash(client, "echo tick; sleep 100", timeout=60, no_output_timeout=0.5)
    assert time.monotonic() - started < 5
    assert output.startswith("tick\n")
    assert "no output for 0.5 s" in output
    assert data["timed_out"] is True
    assert (await bash(client, "echo alive"))[0] == "alive"


async def test_sigint_ignoring_job_is_killed(client: ToolClient) -> None:
    output, data = await bash(client, "bash -c \"trap '' INT; sleep 100\"", timeout=0.5)
    assert data["timed_out"] is True
    assert (await bash(client, "echo recovered"))[0] == "recovered"


async def test_output_is_capped_head_and_tail(workspace: Path) -> None:
    async with run_server(workspace, "--output-cap", "2000") as server:
        async with await server.connect() as client:
            output, data = await bash(client, "seq 1 100000")
    assert data["exit_code"] == 0
    assert output.startswith("1\n2\n3\n")
    assert output.endswith("99999\n100000")
    assert "characters omitted ...]" in output
    assert 2000 <= len(output) <= 2100


async def test_ansi_sequences_are_stripped(client: ToolClient) -> None:
    output, _ = await bash(client, r"printf '\033[1;31mred\033[0m \033]0;title\007plain\n'")
    assert output == "red plain"


async def test_long_multiline_command(client: ToolClient, workspace: Path) -> None:
    # Longer than the 4096-byte canonical-mode line limit, with a heredoc and quotes.
    body = "x" * 10_000
    command = f"cat > big.txt <<'EOF'\n{body}\nEOF\nwc -c < big.txt; echo \"it's\" 'a \"b\"'"
    output, _ = await bash(client, command)
    assert output == f'{len(body) + 1}\nit\'s a "b"'
    assert (workspace / "big.txt").read_text() == body + "\n"


async def test_unbalanced_quote_is_a_syntax_error_not_a_hang(client: ToolClient) -> None:
    output, data = await bash(client, "echo 'unterminated", timeout=10)
    assert data["timed_out"] is False
    assert "unexpected EOF" in output
    assert (await bash(client, "echo next"))[0] == "next"


async def test_exit_restarts_the_shell(client: ToolClient) -> None:
    output, data = await bash(client, "exit 4")
    assert "the shell exited" in output
    output, data = await bash(client, "echo reborn")
    assert (output, data["exit_code"]) == ("reborn", 0)


async def test_concurrent_calls_are_serialised(client: ToolClient) -> None:
    results = await asyncio.gather(*(bash(client, f"echo {i}") for i in range(20)))
    assert [out for out, _ in results] == [str(i) for i in range(20)]


async def test_stopping_mid_command_leaves_no_process(workspace: Path) -> None:
    async with run_server(workspace) as server:
        client = await server.connect()
        _, data = await bash(client, "nohup sleep 300 >/dev/null 2>&1 & echo $! > bg.pid")
        background = int((workspace / "bg.pid").read_text())
        running = asyncio.ensure_future(client.call("bash", {"command": "sleep 200"}))
        # no event announces another process's exec
        await eventually(
            lambda: any("sleep 200" in cmdline(pid) for pid in descendants()),
            timeout=10,
            what="'sleep 200' to start",
            interval=0.01,
        )
        tree = descendants(server.proc.pid)
        assert await server.stop() == 0
        await client.aclose()
        await asyncio.gather(running, return_exceptions=True)
    assert not any(_alive(pid) for pid in tree | {background})


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
