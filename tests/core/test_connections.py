"""Connection limits: header/body read timeouts, the connection cap, the open-file limit."""

from __future__ import annotations

import asyncio
import contextlib
import resource
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp

from prorl_async.api.app import CONNECTIONS
from prorl_async.client import RolloutClient
from prorl_async.scripted_llm import ScriptedLLM
from tests.conftest import require
from tests.helpers import ServerFactory, eventually

Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def _host_port(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


@contextlib.asynccontextmanager
async def _connections(url: str, count: int) -> AsyncIterator[list[Conn]]:
    host, port = _host_port(url)
    conns: list[Conn] = []
    try:
        for start in range(0, count, 100):
            batch = range(start, min(count, start + 100))
            conns += await asyncio.gather(*(asyncio.open_connection(host, port) for _ in batch))
        yield conns
    finally:
        for _, writer in conns:
            writer.close()


async def _eof_after(reader: asyncio.StreamReader, deadline: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes, and how long that took."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    async with asyncio.timeout(deadline):
        data = await reader.read()
    return data, loop.time() - start


async def _response(conn: Conn, request: bytes) -> bytes:
    reader, writer = conn
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    return head + await reader.readexactly(length)


GET_HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


async def test_silent_and_half_sent_requests_are_closed(make_server: ServerFactory) -> None:
    async with make_server(read_timeout_s=0.5, keepalive_s=60) as srv:
        async with _connections(srv.url, 2) as ((silent, _), (half, half_w)):
            half_w.write(b"POST /process HTTP/1.1\r\nHost: x\r\nContent-")
            for data, took in await asyncio.gather(_eof_after(silent, 10), _eof_after(half, 10)):
                assert data == b"" and 0.4 < took < 10
        assert srv.app[CONNECTIONS].timed_out == 2


async def test_half_sent_next_request_on_a_kept_alive_connection_is_closed(
    make_server: ServerFactory,
) -> None:
    async with make_server(read_timeout_s=0.5, keepalive_s=60) as srv:
        async with _connections(srv.url, 1) as [conn]:
            assert (await _response(conn, GET_HEALTHZ)).startswith(b"HTTP/1.1 200")
            conn[1].write(b"GET /healthz HTTP/1.1\r\n")
            data, took = await _eof_after(conn[0], 10)
            # keepalive_s is 60: it is the read timeout that closed it
            assert data == b"" and 0.4 < took < 10


async def test_half_sent_body_is_answered_408_and_closed(make_server: ServerFactory) -> None:
    async with make_server(read_timeout_s=0.5) as srv:
        async with _connections(srv.url, 1) as [(reader, writer)]:
            head = b"POST /process HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
            writer.write(head + b'{"task": "blocking"')
            data, took = await _eof_after(reader, 10)
            assert data.startswith(b"HTTP/1.1 408") and b"application/problem+json" in data
            assert b"within 0.5 s" in data and took < 10
        assert (await srv.client.status())["records"] == 0  # no job was created


async def test_long_poll_is_not_cut_by_the_read_timeout(make_server: ServerFactory) -> None:
    async with make_server(read_timeout_s=0.3) as srv:
        job = await srv.client.submit("blocking", {"block": ["run"]})
        loop = asyncio.get_running_loop()
        start = loop.time()
        async with aiohttp.ClientSession() as s, s.get(f"{srv.url}/jobs/{job}?wait=1.5") as r:
            assert r.status == 202 and (await r.json())["status"] == "run"
        assert loop.time() - start >= 1.4
        assert srv.app[CONNECTIONS].timed_out == 0
        await srv.client.cancel(job)


async def test_connections_over_the_cap_are_refused_established_ones_work(
    make_server: ServerFactory,
) -> None:
    async with make_server(max_connections=20) as srv:
        guard = srv.app[CONNECTIONS]
        async with _connections(srv.url, 20) as conns:
            await eventually(lambda: guard.open == 20)
            async with _connections(srv.url, 1) as [(extra, _)]:
                data, took = await _eof_after(extra, 10)
            assert data.startswith(b"HTTP/1.1 503") and b"too many open connections" in data
            assert guard.refused == 1 and guard.open == 20
            for conn in conns[:3]:  # established connections are untouched
                assert (await _response(conn, GET_HEALTHZ)).startswith(b"HTTP/1.1 200")
            for _, writer in conns[10:]:
                writer.close()
            await eventually(lambda: guard.open == 10)
            assert (await srv.client.status())["state"] == "running"


def _raise_own_nofile(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    require(hard >= need, f"open-file hard limit {hard} < {need}")
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


@contextlib.asynccontextmanager
async def _server_with_nofile(tmp_path: Path, soft: int) -> AsyncIterator[str]:
    # `ulimit -Sn` in front of the real CLI: the server starts with a 1,024 soft limit.
    script = f'ulimit -Sn {soft} && exec "$@"'
    args = ["-m", "prorl_async.cli", "serve", "--port", "0", "--state-dir", str(tmp_path)]
    proc = await asyncio.create_subprocess_exec(
        "bash", "-c", script, "bash", sys.executable, *args, stderr=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stderr is not None
        async with asyncio.timeout(30):
            while b"listening on " not in (line := await proc.stderr.readline()):
                assert line, "server exited before listening"
        yield line.decode().split("listening on ")[1].split()[0]
    finally:
        proc.kill()
        await proc.wait()


async def test_1100_idle_connections_then_a_request_and_a_sandbox_job(tmp_path: Path) -> None:
    _raise_own_nofile(4096)
    async with (
        ScriptedLLM(policy="finish") as llm,
        _server_with_nofile(tmp_path, 1024) as url,
        _connections(url, 1100),
        RolloutClient(url) as client,
    ):
        assert (await client.status())["state"] == "running"
        await client.add_llm_server(llm.address)
        job = {"prompt": "say done", "reward_command": "ls /proc/self/fd | wc -l"}
        doc = await client.result(await client.submit("sandbox", job), wait=60)
        assert doc is not None and doc["status"] == "done", doc and doc["error"]
        assert doc["reward"] == 1.0
