"""``GET /events``: Server-Sent Events of terminal jobs, on a real server."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import aiohttp
import pytest

from bench._server import open_fds, rss_mib
from prorl_async.client import RolloutClient
from tests.helpers import ServerFactory, eventually, server_process
from tests.sse import open_events

SLEEP = {"task": "sleep", "instance": {}}


async def test_one_event_per_terminal_job_then_heartbeats(make_server: ServerFactory) -> None:
    async with make_server(events={"heartbeat_s": 0.05}) as srv, aiohttp.ClientSession() as s:
        ids = await srv.client.submit_batch([SLEEP] * 5)
        async with open_events(s, srv.url, after=0) as stream:
            events = await stream.jobs(5)
            assert {e.data["job_id"] for e in events} == set(ids)
            assert [e.id for e in events] == [e.data["seq"] for e in events] == [1, 2, 3, 4, 5]
            assert {(e.data["status"], e.data["reward"], e.data["tenant"]) for e in events} == {
                ("done", 1.0, "default")
            }
            while (event := await stream.next()).kind != "comment":
                pass
            assert event.data["text"] in ("stream open", "heartbeat")
            while (await stream.next()).data.get("text") != "heartbeat":
                pass  # nothing happens: a heartbeat comes
            assert srv.service.store.log.streams == 1


async def test_without_a_cursor_the_stream_starts_from_now(make_server: ServerFactory) -> None:
    async with make_server() as srv, aiohttp.ClientSession() as s:
        await srv.client.submit_batch([SLEEP] * 3)
        await eventually(lambda: srv.service.store.log.committed == 3)
        async with open_events(s, srv.url) as stream:
            new = await srv.client.submit("sleep", {})
            (event,) = await stream.jobs(1)
            assert event.data["job_id"] == new and event.id == 4


async def test_a_dropped_client_resumes_from_last_event_id_missing_nothing(
    make_server: ServerFactory,
) -> None:
    async with make_server() as srv, aiohttp.ClientSession() as s:
        ids = await srv.client.submit_batch([SLEEP] * 30)
        async with open_events(s, srv.url, after=0) as stream:
            seen = await stream.jobs(10)
        # the connection is gone; more jobs end meanwhile
        ids += await srv.client.submit_batch([SLEEP] * 30)
        async with open_events(s, srv.url, last_event_id=seen[-1].id) as stream:
            seen += await stream.jobs(50)
        assert [e.id for e in seen] == list(range(1, 61))  # in order, none twice, none missed
        assert {e.data["job_id"] for e in seen} == set(ids)


async def test_streams_end_when_the_server_shuts_down(make_server: ServerFactory) -> None:
    async with aiohttp.ClientSession() as s:
        server = make_server()
        srv = await server.__aenter__()
        closing: asyncio.Future[bool | None] | None = None
        try:
            async with open_events(s, srv.url) as stream:
                assert (await stream.next()).data["text"] == "stream open"
                closing = asyncio.ensure_future(server.__aexit__(None, None, None))
                with pytest.raises(EOFError):
                    await stream.jobs(1)
        finally:
            await (closing or server.__aexit__(None, None, None))


async def _stalled_client(url: str) -> socket.socket:
    """Connects, asks for every event from the start, and never reads a byte."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    request = f"GET /events?after=0 HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
    await asyncio.get_running_loop().sock_sendall(sock, request)
    return sock


async def test_a_consumer_that_stops_reading_is_dropped_and_others_are_not(
    tmp_path: Path,
) -> None:
    config = tmp_path / "server.toml"
    config.write_text("[events]\nbuffer_bytes = 16384\nstall_s = 0.5\n")
    args = ("--store", "memory", "--config", str(config))
    async with server_process(tmp_path, {}, *args) as (_, url), RolloutClient(url) as c:
        stalled = [await _stalled_client(url) for _ in range(5)]
        try:
            await eventually(lambda: _streams(c, 5), timeout=30)
            async with aiohttp.ClientSession() as s, open_events(s, url, after=0) as healthy:
                ids: list[str] = []
                for _ in range(5):  # ~1 MB of events: far past what a stalled one can hold
                    ids += await c.submit_batch([SLEEP] * 1000)
                events = await healthy.jobs(len(ids))
                assert {e.data["job_id"] for e in events} == set(ids)

                async def dropped() -> bool:
                    st = await c.status()
                    return bool(st["events"] == {"streams": 1, "dropped": 5})

                await eventually(dropped, timeout=60)
        finally:
            for sock in stalled:
                sock.close()


async def _streams(c: RolloutClient, n: int) -> bool:
    return bool((await c.status())["events"]["streams"] == n)


async def _open_raw(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"GET /events HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    await reader.readuntil(b": stream open\n")
    return reader, writer


async def _count_jobs(reader: asyncio.StreamReader, n: int) -> None:
    buf = b""
    while buf.count(b"\nevent: job\n") < n:
        chunk = await reader.read(65536)
        assert chunk, "stream ended early"
        buf += chunk


async def test_a_thousand_streams_take_bounded_memory_and_one_fd_each(tmp_path: Path) -> None:
    clients = 1000
    async with server_process(tmp_path, {}, "--store", "memory") as (proc, url):
        async with RolloutClient(url) as c:
            await c.submit_batch([SLEEP] * 10)  # warm up every code path first
            fds0, rss0 = open_fds(proc.pid), rss_mib(proc.pid)
            conns = await asyncio.gather(*(_open_raw(url) for _ in range(clients)))
            try:
                await eventually(lambda: _streams(c, clients), timeout=60)
                fds1, rss1 = open_fds(proc.pid), rss_mib(proc.pid)
                await c.submit_batch([SLEEP] * 20)
                async with asyncio.timeout(60):
                    await asyncio.gather(*(_count_jobs(r, 20) for r, _ in conns))
                rss2 = rss_mib(proc.pid)
            finally:
                for _, writer in conns:
                    writer.close()
            await eventually(lambda: _streams(c, 0), timeout=60)
            fds3 = open_fds(proc.pid)
    print(  # noqa: T201 (the figures, for the record)
        f"\n{clients} streams: +{fds1 - fds0} fds, +{rss1 - rss0:.1f} MiB RSS open, "
        f"+{rss2 - rss0:.1f} MiB after 20 events each; fds after close +{fds3 - fds0}"
    )
    assert fds1 - fds0 <= clients + 16
    assert fds3 - fds0 <= 16
    assert rss2 - rss0 < 64  # < 64 KiB a stream, buffers included
