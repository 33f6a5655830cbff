"""Framing, dispatch and lifecycle of the server, and the client's failure modes."""

from __future__ import annotations

import asyncio
import os
import struct
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import msgspec
import pytest

from prorl_async.toolserver.client import ToolClient, ToolServerError, ToolTimeoutError
from prorl_async.toolserver.protocol import Request, Response, encode_frame, read_frame
from tests.toolserver.conftest import RunningServer, run_server


async def raw_exchange(socket: str, payload: bytes, *, eof: bool = False) -> Response | None:
    """Send raw bytes, return the first response frame (None if the server hangs up)."""
    reader, writer = await asyncio.open_unix_connection(socket)
    try:
        writer.write(payload)
        await writer.drain()
        if eof:
            writer.write_eof()
        frame = await read_frame(reader)
        return None if frame is None else msgspec.msgpack.decode(frame, type=Response)
    finally:
        writer.close()
        await writer.wait_closed()


def framed(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


async def test_malformed_frames_do_not_kill_the_server(
    client: ToolClient, server: RunningServer
) -> None:
    garbage = await raw_exchange(server.socket, framed(b"\xc1\xff not msgpack"))
    assert garbage is not None and not garbage.ok and "malformed request" in str(garbage.error)
    wrong = msgspec.msgpack.encode({"id": 7, "tool": 3, "args": {}})
    typed = await raw_exchange(server.socket, framed(wrong))
    assert typed is not None and typed.id == 7 and "$.tool" in str(typed.error)
    extra = msgspec.msgpack.encode({"id": 8, "tool": "ping", "bogus": 1})
    unknown_field = await raw_exchange(server.socket, framed(extra))
    assert unknown_field is not None and "bogus" in str(unknown_field.error)
    huge = await raw_exchange(server.socket, struct.pack(">I", 2**31))
    assert huge is not None and "exceeds" in str(huge.error)
    cut = await raw_exchange(server.socket, b"\x00\x00", eof=True)  # half a header
    assert cut is not None and "inside a frame header" in str(cut.error)
    assert (await client.call("ping")).output == "pong"


async def test_unknown_tool_lists_the_known_ones(client: ToolClient) -> None:
    result = await client.call("rm_rf", {})
    assert not result.ok and result.error is not None
    assert "unknown tool 'rm_rf'" in result.error and "bash" in result.error


async def test_bad_args_name_the_field(client: ToolClient) -> None:
    result = await client.call("bash", {"command": "true", "timout": 3})
    assert not result.ok and "unknown field `timout`" in str(result.error)
    result = await client.call("python", {"code": ["x"]})
    assert not result.ok and "$.code" in str(result.error)


async def test_concurrent_calls_are_matched_by_id(client: ToolClient) -> None:
    slow = asyncio.ensure_future(client.call("bash", {"command": "sleep 0.3; echo slow"}))
    pongs = await asyncio.gather(*(client.call("ping", {"n": i}) for i in range(50)))
    assert [p.data["n"] for p in pongs] == list(range(50))
    assert not slow.done()  # the pings overtook the running bash command
    assert (await slow).output == "slow"


async def test_on_call_reports_tool_and_duration(server: RunningServer) -> None:
    seen: list[tuple[str, float]] = []
    async with await server.connect(on_call=lambda tool, s: seen.append((tool, s))) as client:
        await client.call("ping")
        await client.call("bash", {"command": "sleep 0.2"})
    assert [tool for tool, _ in seen] == ["ping", "bash"]
    assert seen[0][1] < 0.2 <= seen[1][1]


async def test_shutdown_waits_for_the_last_connection(workspace: Path) -> None:
    async with run_server(workspace) as server:
        first, second = await server.connect(), await server.connect()
        await first.call("bash", {"command": "true"})  # a shell exists to be cleaned up
        await first.shutdown()
        await first.aclose()
        assert (await second.call("ping")).ok  # still serving the remaining connection
        await second.aclose()
        async with asyncio.timeout(15):
            assert await server.proc.wait() == 0
        assert not os.path.exists(server.socket)


async def test_sigterm_exits_cleanly_and_removes_the_socket(workspace: Path) -> None:
    async with run_server(workspace) as server:
        async with await server.connect() as client:
            await client.call("bash", {"command": "true"})
            assert await server.stop() == 0
            with pytest.raises(ToolServerError):
                await client.call("ping")
        assert not os.path.exists(server.socket)


async def test_connect_gives_up_with_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ToolServerError, match="no tool server listening at .*after 0.2 s"):
        await ToolClient.connect(str(tmp_path / "absent.sock"), timeout=0.2)


async def test_connect_waits_for_a_late_server(workspace: Path) -> None:
    sockdir = tempfile.mkdtemp(prefix="ts-", dir="/tmp")
    connecting = asyncio.ensure_future(ToolClient.connect(f"{sockdir}/late.sock", timeout=20))
    async with double_server(f"{sockdir}/late.sock", _answer_pings):
        async with await connecting as client:
            assert (await client.call("ping")).output == "pong"
    os.rmdir(sockdir)


# Test doubles: a hand-written server that misbehaves on purpose, which the real
# server never does, to prove the client fails fast instead of hanging.

Behaviour = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def double_server(path: str, behaviour: Behaviour) -> AsyncIterator[str]:
    handlers: set[asyncio.Task[None]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        try:
            await behaviour(reader, writer)
        finally:
            writer.close()
            handlers.discard(task)

    server = await asyncio.start_unix_server(handle, path=path)
    try:
        yield path
    finally:
        server.close()
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        os.unlink(path)


async def _answer_pings(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while (frame := await read_frame(reader)) is not None:
        request = msgspec.msgpack.decode(frame, type=Request)
        writer.write(encode_frame(Response(id=request.id, ok=True, output="pong")))


async def _hang_up_after_one_request(reader: asyncio.StreamReader, _: asyncio.StreamWriter) -> None:
    await read_frame(reader)


async def _send_garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_frame(reader)
    writer.write(framed(b"\xc1garbage"))
    await writer.drain()
    await reader.read()


async def _never_answer(reader: asyncio.StreamReader, _: asyncio.StreamWriter) -> None:
    await reader.read()


@pytest.mark.parametrize(
    ("behaviour", "message"),
    [(_hang_up_after_one_request, "closed the connection"), (_send_garbage, "bad frame")],
)
async def test_dead_or_garbled_server_fails_every_pending_call(
    tmp_path: Path, behaviour: Behaviour, message: str
) -> None:
    async with double_server(str(tmp_path / "d.sock"), behaviour) as path:
        async with await ToolClient.connect(path) as client:
            calls = [asyncio.ensure_future(client.call("bash", {"command": "x"})) for _ in range(3)]
            for call in calls:
                with pytest.raises(ToolServerError, match=message):
                    await call
            with pytest.raises(ToolServerError, match=message):
                await client.call("ping")


async def test_client_timeout_raises_a_typed_error(tmp_path: Path) -> None:
    async with double_server(str(tmp_path / "s.sock"), _never_answer) as path:
        async with await ToolClient.connect(path) as client:
            with pytest.raises(ToolTimeoutError, match="'ping' gave no response within 0.1 s"):
                await client.call("ping", timeout=0.1)


async def test_aclose_is_idempotent_and_fails_later_calls(client: ToolClient) -> None:
    await client.aclose()
    await client.aclose()
    with pytest.raises(ToolServerError, match="closed"):
        await client.call("ping")
