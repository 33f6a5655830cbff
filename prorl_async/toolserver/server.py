"""The tool server: serves tool calls over a Unix socket inside the sandbox.

One request per frame (see :mod:`.protocol`); every request runs in its own task
so a long ``bash`` command does not hold up a ``download`` on the same
connection. Tools that own processes (the shell, the kernel, ``exec`` commands)
are closed, and their processes killed and reaped, when the server stops: on
SIGTERM/SIGINT, or once the last connection closes after a ``shutdown`` request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from prorl_async.toolserver._base import ToolError, ToolOutput
from prorl_async.toolserver.bash import BashTool
from prorl_async.toolserver.editor import EditorTool
from prorl_async.toolserver.files import ExecTool, FileTools
from prorl_async.toolserver.kernel import PythonTool
from prorl_async.toolserver.protocol import (
    FrameError,
    Request,
    Response,
    decode_request,
    encode_frame,
    read_frame,
    request_id_of,
)
from prorl_async.util.resource import AsyncResource

__all__ = ["ToolServer"]

log = logging.getLogger(__name__)

Handler = Callable[[dict[str, Any]], Awaitable[ToolOutput]]


class ToolServer(AsyncResource):
    """Owns the tools and serves them; use as an async context manager around :meth:`serve`."""

    def __init__(self, *, workspace: Path, output_cap: int = 16_000) -> None:
        self.workspace = workspace.resolve()
        self._bash = BashTool(self.workspace, output_cap=output_cap)
        self._python = PythonTool(self.workspace, output_cap=output_cap)
        self._exec = ExecTool(self.workspace)
        files = FileTools(self.workspace)
        self._handlers: dict[str, Handler] = {
            "bash": self._bash.call,
            "python": self._python.call,
            "str_replace_editor": EditorTool(self.workspace).call,
            "exec": self._exec.call,
            "upload": files.upload,
            "download": files.download,
            "ping": self._ping,
            "shutdown": self._request_shutdown,
        }
        self._connections: set[asyncio.Task[None]] = set()
        self._shutdown_requested = False
        self._stop = asyncio.Event()
        self._closed = False

    @property
    def tools(self) -> list[str]:
        return sorted(self._handlers)

    def stop(self) -> None:
        """Make :meth:`serve` return (signal-handler safe: only sets a flag)."""
        self._stop.set()

    async def serve(self, socket_path: str, *, tcp: tuple[str, int] | None = None) -> None:
        """Listen on ``socket_path`` (and ``tcp`` if given) until stopped."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(socket_path)  # a stale socket from a previous run
        servers = [await asyncio.start_unix_server(self._on_connect, path=socket_path)]
        if tcp is not None:
            servers.append(await asyncio.start_server(self._on_connect, tcp[0], tcp[1]))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)
        log.info("tool server listening on %s (workspace %s)", socket_path, self.workspace)
        try:
            await self._stop.wait()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            for server in servers:
                server.close()
            await self._drop_connections()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(socket_path)

    async def dispatch(self, request: Request) -> Response:
        """Run one request and turn whatever happens (except cancellation) into a response."""
        handler = self._handlers.get(request.tool)
        if handler is None:
            known = ", ".join(self.tools)
            error = f"unknown tool {request.tool!r}; known tools: {known}"
            return Response(id=request.id, ok=False, error=error)
        try:
            out = await handler(request.args)
        except ToolError as exc:
            return Response(id=request.id, ok=False, error=str(exc))
        except Exception as exc:
            log.exception("tool %r failed", request.tool)
            error = f"internal error in tool {request.tool!r}: {type(exc).__name__}: {exc}"
            return Response(id=request.id, ok=False, error=error)
        return Response(id=request.id, ok=True, output=out.output, data=out.data)

    async def aclose(self) -> None:
        """Drop connections, then close every tool and reap its processes; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        await self._drop_connections()
        for close in (self._bash.aclose, self._python.aclose, self._exec.aclose):
            await asyncio.shield(close())

    async def _ping(self, args: dict[str, Any]) -> ToolOutput:
        return ToolOutput(output="pong", data=args)

    async def _request_shutdown(self, args: dict[str, Any]) -> ToolOutput:
        self._shutdown_requested = True
        return ToolOutput(output="shutting down when the last connection closes")

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            await _Connection(self, reader, writer).run()
        finally:
            self._connections.discard(task)
            if self._shutdown_requested and not self._connections:
                self._stop.set()

    async def _drop_connections(self) -> None:
        tasks = list(self._connections)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class _Connection:
    """One client connection: reads frames, runs each request as its own task."""

    def __init__(
        self, server: ToolServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self._server = server
        self._reader = reader
        self._writer = writer
        self._calls: set[asyncio.Task[None]] = set()
        self._write_lock = asyncio.Lock()

    async def run(self) -> None:
        try:
            await self._read_requests()
        except (ConnectionError, OSError):
            pass  # the client went away; its calls are cancelled below
        finally:
            for call in self._calls:
                call.cancel()
            await asyncio.gather(*self._calls, return_exceptions=True)
            self._writer.close()

    async def _read_requests(self) -> None:
        while True:
            try:
                payload = await read_frame(self._reader)
            except FrameError as exc:
                # The stream is out of step with the framing: answer once and hang up.
                await self._send(Response(id=0, ok=False, error=str(exc)))
                return
            if payload is None:
                return
            try:
                request = decode_request(payload)
            except FrameError as exc:
                await self._send(Response(id=request_id_of(payload), ok=False, error=str(exc)))
                continue
            call = asyncio.get_running_loop().create_task(self._answer(request))
            self._calls.add(call)
            call.add_done_callback(self._calls.discard)

    async def _answer(self, request: Request) -> None:
        response = await self._server.dispatch(request)
        with contextlib.suppress(ConnectionError, OSError):
            await self._send(response)  # a vanished client cannot be told

    async def _send(self, response: Response) -> None:
        try:
            frame = encode_frame(response)
        except FrameError as exc:
            frame = encode_frame(Response(id=response.id, ok=False, error=str(exc)))
        async with self._write_lock:
            self._writer.write(frame)
            await self._writer.drain()
