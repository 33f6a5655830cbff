"""Tool-path latencies, side by side with the alternatives they replace.

    python bench/tools.py [--rounds 200]

Rows:
- bash round trip of a trivial command through the whole tool-server path
  (ToolClient -> UDS -> server -> PTY bash -> sentinel), against the same command
  driven through tmux ``send-keys`` + ``capture-pane`` polling (how tmux-based
  harnesses do it; polled back to back, i.e. tmux's best case);
- IPython ``1+1`` execute round trip with the kernel on ipc vs tcp transport;
- a tool-server ``ping`` request round trip over the Unix socket vs TCP loopback.
If ``bench/sandboxes.py`` is present its rows (sandbox start/close) follow.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prorl_async.toolserver.client import ToolClient  # noqa: E402
from prorl_async.toolserver.kernel import IpcKernel  # noqa: E402
from prorl_async.toolserver.shell import PtyShell  # noqa: E402
from tests.helpers import free_port  # noqa: E402

Row = tuple[str, str]


def _ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _fig(values: list[float]) -> str:
    return f"p50 {_ms(values, 0.5):8.3f} ms   p99 {_ms(values, 0.99):8.3f} ms   (n={len(values)})"


async def _timed(rounds: int, once: Callable[[int], Awaitable[object]]) -> list[float]:
    for i in range(min(10, rounds)):  # warm-up
        await once(i)
    samples = []
    for i in range(rounds):
        started = time.perf_counter()
        await once(i)
        samples.append(time.perf_counter() - started)
    return samples


@asynccontextmanager
async def _tool_server(workspace: str, tcp_port: int | None = None) -> AsyncIterator[str]:
    sock = f"{tempfile.mkdtemp(prefix='bt-', dir='/tmp')}/tools.sock"
    extra = ["--tcp", f"127.0.0.1:{tcp_port}"] if tcp_port else []
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "prorl_async.toolserver",
        "--socket",
        sock,
        "--workspace",
        workspace,
        *extra,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        yield sock
    finally:
        proc.terminate()
        await proc.wait()
        shutil.rmtree(Path(sock).parent, ignore_errors=True)


async def bash_rows(workspace: str, rounds: int) -> list[Row]:
    async with _tool_server(workspace) as sock, await ToolClient.connect(sock) as client:

        async def via_server(i: int) -> None:
            result = await client.call("bash", {"command": f"echo hi{i}"})
            assert result.output == f"hi{i}", result.output

        server = await _timed(rounds, via_server)
    async with await PtyShell.start(Path(workspace)) as shell:

        async def direct(i: int) -> None:
            pattern = shell.submit(f"echo hi{i}")
            while shell.match(pattern) is None:
                await shell.wait_activity(5.0)

        pty = await _timed(rounds, direct)
    tmux = _tmux_samples(rounds) if shutil.which("tmux") else []
    rows = [
        ("bash: tool server (UDS + PTY)", _fig(server)),
        ("bash: bare PtyShell (no server)", _fig(pty)),
    ]
    if not tmux:
        return rows + [("bash: tmux send-keys/capture-pane", "tmux not installed")]
    ratio = f"p50 ratio tmux/ours {_ms(tmux, 0.5) / _ms(server, 0.5):.1f}x"
    return rows + [("bash: tmux send-keys/capture-pane", _fig(tmux)), ("", ratio)]


def _tmux_samples(rounds: int) -> list[float]:
    sock = f"/tmp/bench-tmux-{uuid.uuid4().hex[:8]}"
    tmux = ["tmux", "-S", sock]
    subprocess.run(
        [*tmux, "new-session", "-d", "-s", "b", "-x", "200", "-y", "50", "bash --norc --noprofile"],
        check=True,
    )
    try:
        samples = []
        for i in range(rounds + 10):
            started = time.perf_counter()
            _tmux_command(tmux, f"echo hi{i}", f"__DONE_{i}__")
            if i >= 10:  # warm-up
                samples.append(time.perf_counter() - started)
        return samples
    finally:
        subprocess.run([*tmux, "kill-server"], check=False)


def _tmux_command(tmux: list[str], command: str, marker: str) -> None:
    # Split the marker so that the echoed command line does not match it.
    typed = f'{command}; echo {marker[:4]}""{marker[4:]}'
    subprocess.run([*tmux, "send-keys", "-t", "b", typed, "Enter"], check=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pane = subprocess.run(
            [*tmux, "capture-pane", "-p", "-t", "b"], capture_output=True, text=True, check=True
        ).stdout
        if marker in pane:
            subprocess.run([*tmux, "clear-history", "-t", "b"], check=True)
            subprocess.run([*tmux, "send-keys", "-t", "b", "clear", "Enter"], check=True)
            return
    raise TimeoutError(f"tmux never showed {marker}")


async def kernel_rows(workspace: str, rounds: int) -> list[Row]:
    rows = []
    for transport in ("ipc", "tcp"):
        started = time.perf_counter()
        async with await IpcKernel.start(Path(workspace), transport=transport) as kernel:
            start_s = time.perf_counter() - started

            async def execute(i: int, kernel: IpcKernel = kernel) -> None:
                from prorl_async.toolserver._text import CappedText

                sink = CappedText(1000)
                assert await kernel.collect(kernel.execute("1+1"), sink, 10.0) is not None

            samples = await _timed(rounds, execute)
        rows.append((f"python 1+1: kernel over {transport}", _fig(samples)))
        rows.append((f"python: kernel start ({transport})", f"{start_s * 1000:8.0f} ms"))
    return rows


async def transport_rows(workspace: str, rounds: int) -> list[Row]:
    port = free_port()
    async with _tool_server(workspace, tcp_port=port) as sock:
        uds = await ToolClient.connect(sock)
        tcp = await ToolClient.connect_tcp("127.0.0.1", port)
        async with uds, tcp:
            u = await _timed(rounds * 10, lambda i: uds.call("ping"))
            t = await _timed(rounds * 10, lambda i: tcp.call("ping"))
    ratio = f"p50 ratio tcp/uds {_ms(t, 0.5) / _ms(u, 0.5):.2f}x"
    return [
        ("ping request: Unix socket", _fig(u)),
        ("ping request: TCP loopback", _fig(t)),
        ("", ratio),
    ]


async def sandbox_rows() -> list[Row]:
    path = Path(__file__).with_name("sandboxes.py")
    if not path.exists():
        return []
    spec = importlib.util.spec_from_file_location("bench_sandboxes", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows: list[Row] = await module.run_section()
    return [(f"sandbox: {what}", figures) for what, figures in rows]


async def run(rounds: int) -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="bench-tools-") as workspace:
        rows = await bash_rows(workspace, rounds)
        rows += await kernel_rows(workspace, min(rounds, 100))
        rows += await transport_rows(workspace, rounds)
    return rows + await sandbox_rows()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    rows = uvloop.run(run(parser.parse_args().rounds))
    width = max(len(what) for what, _ in rows)
    for what, figures in rows:
        print(f"{what:<{width}}  {figures}")


if __name__ == "__main__":
    main()
