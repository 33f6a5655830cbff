"""Start a real server process for a benchmark and read its RSS and open fds."""

from __future__ import annotations

import asyncio
import os
import re
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from pathlib import Path

from prorl_async.util.procs import descendants

_ROOT = str(Path(__file__).resolve().parents[1])  # bench/ is a package of the checkout


def rss_mib(pid: int) -> float:
    """Resident memory of the server and its descendants (shared pages counted twice)."""
    total = 0
    for p in (pid, *descendants(pid)):
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def cpu_seconds(pid: int) -> float:
    """User + system CPU time so far of the server and its descendants (all threads)."""
    ticks = 0
    for p in (pid, *descendants(pid)):
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def connection_fds(pid: int) -> int:
    """Descriptors of ``pid`` that are established TCP connections (its sockets matched
    by inode against its network namespace's /proc/PID/net/tcp tables)."""
    established: set[str] = set()
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if parts[3] == "01":
                        established.add(parts[9])
        except OSError:
            continue
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed since the listing
        if target.startswith("socket:[") and target[8:-1] in established:
            count += 1
    return count


def tcp_connections(pid: int, port: int) -> int:
    """Established TCP connections on the server's port (from /proc/net/tcp)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    local_port = int(parts[1].rsplit(":", 1)[1], 16)
                    if local_port == port and parts[3] == "01":
                        count += 1
        except OSError:
            continue
    return count


@asynccontextmanager
async def server(
    *args: str, env: dict[str, str] | None = None, source: str | None = None
) -> AsyncIterator[tuple[int, str]]:
    """A ``prorl-async serve`` process on a free port: yields (pid, base URL).

    Without ``--state-dir`` in ``args`` it gets a fresh temporary one (never the user's).
    ``source``: a checkout whose ``prorl_async`` it runs (``python -m`` puts the working
    directory first on the path), e.g. an earlier commit to compare against.
    """
    async with AsyncExitStack() as stack:
        if "--state-dir" not in args:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="prorl-bench-"))
            args = (*args, "--state-dir", tmp)
        async with _serve(*args, env=env, cwd=source) as out:
            yield out


@asynccontextmanager
async def bare() -> AsyncIterator[tuple[int, str]]:
    """The bare aiohttp + uvloop baseline (``bench/_bare.py``): yields (pid, base URL)."""
    async with _spawn(("-m", "bench._bare", "--port", "0"), env=None, cwd=_ROOT) as out:
        yield out


def _serve(
    *args: str, env: dict[str, str] | None, cwd: str | None = None
) -> AbstractAsyncContextManager[tuple[int, str]]:
    return _spawn(("-m", "prorl_async.cli", "serve", "--port", "0", *args), env=env, cwd=cwd)


@asynccontextmanager
async def _spawn(
    argv: tuple[str, ...], env: dict[str, str] | None, cwd: str | None = None
) -> AsyncIterator[tuple[int, str]]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *argv,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )
    assert proc.stderr is not None
    drain: asyncio.Task[None] | None = None
    said: list[str] = []  # what it wrote before listening: the reason if it never does
    try:
        async with asyncio.timeout(30):
            while True:
                line = (await proc.stderr.readline()).decode()
                if not line:
                    raise RuntimeError(
                        f"{' '.join(argv)}: exited before listening:\n{''.join(said[-20:])}"
                    )
                said.append(line)
                found = re.search(r"listening on (http://\S+)", line)
                if found:
                    break
        drain = asyncio.create_task(_drain(proc.stderr))
        yield proc.pid, found.group(1)
    finally:
        if proc.returncode is None:
            proc.terminate()
        await proc.wait()
        if drain is not None:
            await drain


async def _drain(stream: asyncio.StreamReader) -> None:
    while line := await stream.readline():
        sys.stderr.write("server: " + line.decode())
