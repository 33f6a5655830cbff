"""What a task handler uses of its sandbox: ``SandboxHandle``, met by a running ``Sandbox``
and by a ``LazySandbox`` (started on first use).

``start_sandbox`` returns one or the other depending on the server's ``sandbox_start``;
handler code typed against this protocol runs unchanged under both.
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, Self

from prorl_async.sandbox.limits import SandboxLimits
from prorl_async.toolserver.client import ExecResult, ToolResult

__all__ = ["SandboxHandle", "ToolChannel"]


class ToolChannel(Protocol):
    """The tool-server calls a handler makes through ``sandbox.client`` (``ToolClient``)."""

    async def call(
        self, tool: str, args: dict[str, Any] | None = None, *, timeout: float | None = None
    ) -> ToolResult: ...
    async def upload(self, path: str, data: bytes, *, mode: int | None = None) -> None: ...
    async def download(self, path: str) -> bytes: ...
    async def exec(
        self, command: str, *, timeout: float = 60.0, stdin: str | None = None
    ) -> ExecResult: ...


class SandboxHandle(Protocol):
    """A job's sandbox as its handler sees it (``Sandbox``'s public surface, less the
    runtime's own wiring). The awaitables and ``client`` work on a handle not started yet
    (they start it); the other properties need it running, except ``closed`` and
    ``limits`` (and ``inner_workspace`` where the runtime isolates paths)."""

    @property
    def id(self) -> str: ...
    @property
    def limits(self) -> SandboxLimits: ...
    @property
    def closed(self) -> bool: ...
    @property
    def inner_workspace(self) -> str: ...
    @property
    def workspace(self) -> Path: ...
    @property
    def loopback_ip(self) -> str: ...
    @property
    def pid(self) -> int: ...
    @property
    def client(self) -> ToolChannel: ...

    async def call(
        self, tool: str, args: dict[str, Any] | None = None, *, timeout: float | None = None
    ) -> ToolResult: ...
    async def write_files(self, files: dict[str, str]) -> None: ...
    async def read_file(self, path: str) -> str: ...
    async def exec(self, command: str, timeout: float = 60.0) -> ExecResult: ...
    async def aclose(self) -> None: ...
    async def __aenter__(self) -> Self: ...
    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...
