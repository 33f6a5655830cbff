"""Client side of the tool server: one Unix-socket connection, many calls in flight.

The sandbox runtime starts ``python -m prorl_async.toolserver`` inside the
sandbox and connects with :meth:`ToolClient.connect`. A call is a request frame
tagged with an id; a background reader matches responses to calls by that id.
If the connection dies, every pending call fails with :class:`ToolServerError`
at once instead of hanging.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import time
from collections.abc import Callable
from typing import Any

import msgspec

from prorl_async.toolserver.protocol import (
    FrameError,
    Request,
    Response,
    decode_response,
    encode_frame,
    read_frame,
)
from prorl_async.util.resource import AsyncResource
from prorl_async.util.tasks import cancel_and_wait

__all__ = [
    "ExecResult",
    "OnCall",
    "ToolClient",
    "ToolResult",
    "ToolServerError",
    "ToolTimeoutError",
]

ToolResult = Response
"""What :meth:`ToolClient.call` returns: ``ok``, ``output``, ``error``, ``data``."""

OnCall = Callable[[str, float], None]
"""Called with ``(tool, seconds)`` after every call, e.g. to feed ``prorl_tool_seconds``."""


class ToolServerError(Exception):
    """The tool server is unreachable, died, or sent something undecodable."""


class ToolTimeoutError(ToolServerError):
    """A call got no response within its client-side timeout."""


class ExecResult(msgspec.Struct, frozen=True):
    """Outcome of a one-off ``exec`` command."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool


class ToolClient(AsyncResource):
    """A connection to one tool server. Use ``async with await ToolClient.connect(...)``."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        on_call: OnCall | None = None,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._on_call = on_call
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Response]] = {}
        self._failure: ToolServerError | None = None
        self._write_lock = asyncio.Lock()
        self._reader_task = asyncio.get_running_loop().create_task(self._read_loop())

    @classmethod
    async def connect(
        cls,
        socket_path: str,
        *,
        timeout: float = 10.0,
        on_call: OnCall | None = None,
    ) -> ToolClient:
        """Connect to the server at ``socket_path``, retrying until it listens.

        Readiness *is* a successful connect: the server binds only once it can
        serve. Retries back off from 2 ms to 100 ms; after ``timeout`` seconds a
        :class:`ToolServerError` names the socket and the last error.
        """
        reader, writer = await _connect_retrying(
            lambda: asyncio.open_unix_connection(socket_path), socket_path, timeout
        )
        return cls(reader, writer, on_call=on_call)

    @classmethod
    async def connect_tcp(
        cls, host: str, port: int, *, timeout: float = 10.0, on_call: OnCall | None = None
    ) -> ToolClient:
        """Connect over TCP (only for transport comparisons in the benchmark)."""
        reader, writer = await _connect_retrying(
            lambda: asyncio.open_connection(host, port), f"{host}:{port}", timeout
        )
        return cls(reader, writer, on_call=on_call)

    @property
    def closed(self) -> bool:
        return self._failure is not None

    async def call(
        self, tool: str, args: dict[str, Any] | None = None, *, timeout: float | None = None
    ) -> ToolResult:
        """Run ``tool`` with ``args`` on the server and return its response.

        A tool-level failure (bad args, unknown tool, edit refused) comes back as
        ``ok=False`` with ``error`` set; transport failures raise
        :class:`ToolServerError`, an expired ``timeout`` :class:`ToolTimeoutError`.
        """
        started = time.perf_counter()
        try:
            return await self._roundtrip(tool, args or {}, timeout)
        finally:
            if self._on_call is not None:
                self._on_call(tool, time.perf_counter() - started)

    async def upload(self, path: str, data: bytes, *, mode: int | None = None) -> None:
        """Write ``data`` to ``path`` (relative paths are inside the workspace)."""
        args: dict[str, Any] = {"path": path, "data": data}
        if mode is not None:
            args["mode"] = mode
        _raise_unless_ok(await self.call("upload", args), "upload")

    async def download(self, path: str) -> bytes:
        """Return the bytes of ``path`` (relative paths are inside the workspace)."""
        result = _raise_unless_ok(await self.call("download", {"path": path}), "download")
        data = result.data.get("data", b"")
        return data if isinstance(data, bytes) else base64.b64decode(data)

    async def exec(
        self, command: str, *, timeout: float = 60.0, stdin: str | None = None
    ) -> ExecResult:
        """Run ``bash -c command`` in the workspace as a one-off process."""
        args: dict[str, Any] = {"command": command, "timeout": timeout}
        if stdin is not None:
            args["stdin"] = stdin
        result = _raise_unless_ok(await self.call("exec", args, timeout=timeout + 30.0), "exec")
        return msgspec.convert(result.data, ExecResult)

    async def shutdown(self) -> None:
        """Ask the server to exit once every connection to it has closed."""
        _raise_unless_ok(await self.call("shutdown", timeout=10.0), "shutdown")

    async def aclose(self) -> None:
        """Close the connection and fail pending calls; safe to call twice."""
        self._fail(ToolServerError("tool client closed"))
        await cancel_and_wait(self._reader_task)
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except OSError:
            pass  # the peer may already be gone; closing is what we wanted

    async def _roundtrip(self, tool: str, args: dict[str, Any], timeout: float | None) -> Response:
        if self._failure is not None:
            raise self._failure
        request_id = next(self._ids)
        future: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            await self._send(Request(id=request_id, tool=tool, args=args))
            async with asyncio.timeout(timeout):
                return await future
        except TimeoutError as exc:
            raise ToolTimeoutError(f"tool {tool!r} gave no response within {timeout} s") from exc
        finally:
            self._pending.pop(request_id, None)

    async def _send(self, request: Request) -> None:
        frame = encode_frame(request)
        async with self._write_lock:
            try:
                self._writer.write(frame)
                await self._writer.drain()
            except (ConnectionError, OSError) as exc:
                self._fail(ToolServerError(f"tool server connection lost: {exc}"))
                raise ToolServerError(f"tool server connection lost: {exc}") from exc

    async def _read_loop(self) -> None:
        try:
            while (payload := await read_frame(self._reader)) is not None:
                response = decode_response(payload)
                future = self._pending.get(response.id)
                if future is not None and not future.done():
                    future.set_result(response)
            self._fail(ToolServerError("tool server closed the connection"))
        except FrameError as exc:
            self._fail(ToolServerError(f"bad frame from tool server: {exc}"))
        except (ConnectionError, OSError) as exc:
            self._fail(ToolServerError(f"tool server connection lost: {exc}"))

    def _fail(self, error: ToolServerError) -> None:
        if self._failure is None:
            self._failure = error
        for future in self._pending.values():
            if not future.done():
                future.set_exception(self._failure)
        self._pending.clear()


async def _connect_retrying(
    opener: Callable[[], Any], where: str, timeout: float
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    delay = 0.002
    while True:
        try:
            result: tuple[asyncio.StreamReader, asyncio.StreamWriter] = await opener()
            return result
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            if loop.time() + delay > deadline:
                raise ToolServerError(
                    f"no tool server listening at {where} after {timeout} s: {exc}"
                ) from exc
        await asyncio.sleep(delay)  # connect backoff: there is no event to wait on
        delay = min(delay * 2, 0.1)


def _raise_unless_ok(result: ToolResult, what: str) -> ToolResult:
    if not result.ok:
        raise ToolServerError(f"{what} failed: {result.error}")
    return result
