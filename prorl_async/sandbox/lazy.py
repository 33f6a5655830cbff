"""A sandbox started on first use: ``LazySandbox``.

Many rollouts never call a tool (a model that answers at once); for them a sandbox
started ahead of use is pure cost: a bwrap and tool-server start (~0.12 s of CPU) and a
slot of the sandbox budget held through INIT, the RUN queue and RUN. A ``LazySandbox``
checks its spec when it is made (so a bad spec still fails where it is asked for) and
starts the sandbox the first time something awaits it: a tool call, ``exec``,
``read_file``, ``write_files`` or a call through ``client``.

The start runs in the task of the first use, with the scope current then (the job's
stage: the budget ranks the start by it and pauses the job's timer while it waits for a
slot), so cancelling that task cancels the start and ``Runtime.start`` cleans up. A lock
makes concurrent first uses start one sandbox: the others wait for it. A start that
failed stays failed (a later use raises the same error); a cancelled one is tried again
at the next use. Closing a handle that never started costs nothing and holds no slot.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prorl_async.sandbox.layout import INNER_WORKSPACE
from prorl_async.sandbox.limits import SandboxLimits
from prorl_async.sandbox.sandbox import Sandbox
from prorl_async.sandbox.spec import SandboxSpec
from prorl_async.stages.scope import StageScope
from prorl_async.toolserver.client import ExecResult, ToolResult, ToolServerError
from prorl_async.util.resource import AsyncResource

if TYPE_CHECKING:
    from prorl_async.sandbox.handle import ToolChannel
    from prorl_async.sandbox.runtime import Runtime

__all__ = ["LazySandbox"]


class LazySandbox(AsyncResource):
    """A sandbox of ``runtime`` for ``spec`` that starts when first used (``SandboxHandle``).

    ``scope`` is asked at the first use for the scope to start under (``lambda:
    job.scope``: the job's stage at that moment). Raises ``SpecError`` at once for a spec
    ``runtime`` cannot start.
    """

    def __init__(
        self,
        runtime: Runtime,
        spec: SandboxSpec,
        scope: Callable[[], StageScope | None] = lambda: None,
    ) -> None:
        runtime.check(spec)
        self._runtime = runtime
        self._spec = spec
        self._scope = scope
        self._sandbox: Sandbox | None = None
        self._failure: Exception | None = None
        self._lock = asyncio.Lock()
        self._closing = False

    # -- starting ----------------------------------------------------------------------------

    @property
    def started(self) -> bool:
        """Whether the sandbox has been started (it may have closed since)."""
        return self._sandbox is not None

    async def ready(self) -> Sandbox:
        """The running sandbox, started now if it was not (once, whoever asks first)."""
        sb = self._sandbox
        if sb is not None:
            return sb
        async with self._lock:
            if self._sandbox is None:
                self._sandbox = await self._start()
            return self._sandbox

    async def _start(self) -> Sandbox:
        if self._closing:
            raise ToolServerError("the sandbox is closed (it was never started)")
        if self._failure is not None:
            raise self._failure
        try:
            sb = await self._runtime.start(self._spec, self._scope())
        except Exception as exc:
            self._failure = exc
            raise
        if self._closing:  # closed while it started (from another task): leave nothing
            await sb.aclose()
            raise ToolServerError("the sandbox was closed while it started")
        return sb

    # -- what callers use (as on a Sandbox) --------------------------------------------------

    async def call(
        self, tool: str, args: dict[str, Any] | None = None, *, timeout: float | None = None
    ) -> ToolResult:
        """Run one tool inside the sandbox (``Sandbox.call``), starting it first if need be."""
        return await (await self.ready()).call(tool, args, timeout=timeout)

    async def write_files(self, files: dict[str, str]) -> None:
        """``Sandbox.write_files``, starting the sandbox first if need be."""
        await (await self.ready()).write_files(files)

    async def read_file(self, path: str) -> str:
        """``Sandbox.read_file``, starting the sandbox first if need be."""
        return await (await self.ready()).read_file(path)

    async def exec(self, command: str, timeout: float = 60.0) -> ExecResult:
        """``Sandbox.exec``, starting the sandbox first if need be."""
        return await (await self.ready()).exec(command, timeout=timeout)

    @property
    def client(self) -> ToolChannel:
        """The tool server's client; before the start, one whose calls start the sandbox."""
        if self._sandbox is not None:
            return self._sandbox.client
        return _DeferredClient(self)

    @property
    def closed(self) -> bool:
        return self._closing or (self._sandbox is not None and self._sandbox.closed)

    @property
    def limits(self) -> SandboxLimits:
        return self._spec.limits

    @property
    def inner_workspace(self) -> str:
        """The workspace as sandboxed processes see it (known before the start where the
        runtime isolates paths: every such sandbox has it at the same place)."""
        if self._sandbox is None and self._runtime.isolated:
            return INNER_WORKSPACE
        return self._running().inner_workspace

    @property
    def id(self) -> str:
        return self._running().id

    @property
    def workspace(self) -> Path:
        return self._running().workspace

    @property
    def loopback_ip(self) -> str:
        return self._running().loopback_ip

    @property
    def pid(self) -> int:
        return self._running().pid

    def _running(self) -> Sandbox:
        if self._sandbox is None:
            raise RuntimeError(
                "the sandbox is not started yet: it starts at its first use "
                "(sandbox_start = on_first_use); `await sandbox.ready()` starts it now"
            )
        return self._sandbox

    # -- teardown ----------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the sandbox if it was started; nothing to do (no slot, no process) if
        not. A start under way in another task ends first (its sandbox is closed too)."""
        self._closing = True
        if self._sandbox is None and not self._lock.locked():
            return
        async with self._lock:
            sb = self._sandbox
        if sb is not None:
            await sb.aclose()

    def __repr__(self) -> str:
        state = repr(self._sandbox) if self._sandbox is not None else "not started"
        return f"LazySandbox({state}, runtime={self._runtime.name!r})"


class _DeferredClient:
    """``sandbox.client`` of a handle not started yet: each call starts it, then goes to
    the tool server's own client."""

    def __init__(self, handle: LazySandbox) -> None:
        self._handle = handle

    async def call(
        self, tool: str, args: dict[str, Any] | None = None, *, timeout: float | None = None
    ) -> ToolResult:
        return await (await self._handle.ready()).client.call(tool, args, timeout=timeout)

    async def upload(self, path: str, data: bytes, *, mode: int | None = None) -> None:
        await (await self._handle.ready()).client.upload(path, data, mode=mode)

    async def download(self, path: str) -> bytes:
        return await (await self._handle.ready()).client.download(path)

    async def exec(
        self, command: str, *, timeout: float = 60.0, stdin: str | None = None
    ) -> ExecResult:
        client = (await self._handle.ready()).client
        return await client.exec(command, timeout=timeout, stdin=stdin)
