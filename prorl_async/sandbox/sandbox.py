"""A running sandbox: its process, tool-server connection, address and directories.

Teardown (``aclose``) is idempotent and leaves nothing: a graceful phase (ask the
tool server to exit, then SIGTERM the sandbox's process group) runs shielded and
bounded by the grace period; then, whether that finished, timed out or was
cancelled, every process in the sandbox is SIGKILLed (process group, the process
tree snapshot taken at close, the pids cgroup), the exits are awaited through
pidfds, and the directories, loopback address and record are released. A
cancellation is re-raised after all of that.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prorl_async.sandbox.cgroup import SandboxCgroup
from prorl_async.sandbox.layout import Layout
from prorl_async.sandbox.limits import SandboxLimits
from prorl_async.sandbox.loopback import LoopbackLease
from prorl_async.sandbox.records import SandboxRecords
from prorl_async.sandbox.spec import check_relative_path
from prorl_async.toolserver.client import ExecResult, ToolClient, ToolResult, ToolServerError
from prorl_async.util.procs import descendants, kill_all, start_time, wait_exited
from prorl_async.util.resource import AsyncResource

__all__ = ["Sandbox"]

log = logging.getLogger(__name__)


class Sandbox(AsyncResource):
    """One live sandbox. Use as ``async with await runtime.start(spec) as sb:``."""

    def __init__(
        self,
        *,
        runtime: str,
        layout: Layout,
        lease: LoopbackLease,
        limits: SandboxLimits,
        records: SandboxRecords,
        cgroup: SandboxCgroup | None,
        close_grace: float,
        on_close: Callable[[Sandbox], None] | None = None,
    ) -> None:
        self.id = layout.sandbox_id
        self.runtime = runtime
        self.layout = layout
        self.limits = limits
        self._lease = lease
        self._records = records
        self._cgroup = cgroup
        self._grace = close_grace
        self._on_close = on_close
        self._proc: asyncio.subprocess.Process | None = None
        self._client: ToolClient | None = None
        self._helpers: list[asyncio.subprocess.Process] = []
        self._tree: dict[int, int] = {}
        self._closing = False
        self._closed = asyncio.Event()

    # -- what callers use -------------------------------------------------
    @property
    def workspace(self) -> Path:
        """The workspace directory on the host."""
        return self.layout.workspace

    @property
    def inner_workspace(self) -> str:
        """The workspace path as processes inside the sandbox see it."""
        return self.layout.inner_workspace

    @property
    def loopback_ip(self) -> str:
        """This sandbox's own ``127.x.y.z`` (``SANDBOX_LOOPBACK_IP`` inside)."""
        return self._lease.ip

    @property
    def loopback_lock(self) -> str:
        """The lock file holding the loopback address (recorded for crash cleanup)."""
        return str(self._lease.path)

    @property
    def pid(self) -> int:
        """Host pid of the sandbox's top process (leader of its own process group)."""
        if self._proc is None:
            raise RuntimeError(f"sandbox {self.id} has no process")
        return self._proc.pid

    @property
    def client(self) -> ToolClient:
        """The connection to the tool server inside."""
        if self._client is None:
            raise RuntimeError(f"sandbox {self.id} is not connected")
        return self._client

    @property
    def closed(self) -> bool:
        return self._closing

    @property
    def cgroup(self) -> SandboxCgroup | None:
        """The sandbox's cgroup (pids, memory), where one could be created."""
        return self._cgroup

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.returncode

    async def call(
        self, tool: str, args: dict[str, Any] | None = None, *, timeout: float | None = None
    ) -> ToolResult:
        """Run one tool inside the sandbox (see ``ToolClient.call``)."""
        return await self.client.call(tool, args, timeout=timeout)

    async def write_files(self, files: dict[str, str]) -> None:
        """Write text files into the workspace, through the tool server (symlink-safe)."""
        for path in files:
            check_relative_path(path, what="write_files")
        for path, text in files.items():
            await self.client.upload(path, text.encode())

    async def read_file(self, path: str) -> str:
        """Read a workspace file as text, through the tool server (symlink-safe)."""
        check_relative_path(path, what="read_file")
        data = await self.client.download(path)
        return data.decode(errors="replace")

    async def exec(self, command: str, timeout: float = 60.0) -> ExecResult:
        """``bash -c command`` in the workspace; output capped at ``limits.output_bytes``."""
        result = await self.client.exec(command, timeout=timeout)
        cap = self.limits.output_bytes
        return ExecResult(
            exit_code=result.exit_code,
            stdout=_cap(result.stdout, cap),
            stderr=_cap(result.stderr, cap),
            timed_out=result.timed_out,
        )

    # -- wiring used by the runtime -------------------------------------------
    def attach_process(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc

    def attach_client(self, client: ToolClient) -> None:
        self._client = client

    def attach_helper(self, proc: asyncio.subprocess.Process) -> None:
        """A host-side process serving the sandbox (slirp4netns), ended with it."""
        self._helpers.append(proc)

    def process_exited(self) -> bool:
        return self._proc is None or self._proc.returncode is not None

    async def wait_process(self) -> int:
        if self._proc is None:
            return 0
        return await self._proc.wait()

    # -- teardown -----------------------------------------------------------
    async def aclose(self) -> None:
        """Stop everything in the sandbox and release its resources; safe to call twice."""
        if self._closing:
            await self._closed.wait()
            return
        self._closing = True
        try:
            self._snapshot_tree()
            graceful = asyncio.ensure_future(self._graceful())
            try:
                await asyncio.shield(graceful)
            finally:
                if not graceful.done():
                    graceful.cancel()  # cancelled from outside: stop waiting, go straight to kill
                    await asyncio.wait([graceful])
                await self._force()
        finally:
            self._release()
            self._closed.set()

    def _snapshot_tree(self) -> None:
        if self._proc is None or self._proc.returncode is not None:
            return
        for pid in descendants(self._proc.pid) | {self._proc.pid}:
            started = start_time(pid)
            if started is not None:
                self._tree[pid] = started

    async def _graceful(self) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._grace):
                await self._shutdown_tool_server()
                await self.wait_process()
        if not self.process_exited():
            self._signal_group(signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._grace / 2):
                    await self.wait_process()

    async def _shutdown_tool_server(self) -> None:
        client = self._client
        if client is None or client.closed or self.process_exited():
            return
        with contextlib.suppress(ToolServerError):
            await client.shutdown()
        await client.aclose()

    async def _force(self) -> None:
        self._signal_group(signal.SIGKILL)
        victims = [p for p, t in self._tree.items() if start_time(p) == t]
        kill_all(victims)
        for helper in self._helpers:
            if helper.returncode is None:
                helper.kill()
        for proc in (self._proc, *self._helpers):
            if proc is not None:
                await proc.wait()
        left = await wait_exited(victims, timeout=5.0)
        if left:
            log.error("sandbox %s: processes survived SIGKILL: %s", self.id, sorted(left))
        if self._cgroup is not None:
            await self._cgroup.kill_and_remove()
        if self._client is not None:
            await self._client.aclose()

    def _signal_group(self, sig: int) -> None:
        if self._proc is None or self._proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, sig)

    def _release(self) -> None:
        self.layout.remove()
        self._lease.release()
        self._records.remove(self.id)
        if self._on_close is not None:
            self._on_close(self)

    def __repr__(self) -> str:
        pid = self._proc.pid if self._proc is not None else None
        return f"Sandbox({self.id!r}, runtime={self.runtime!r}, pid={pid}, ip={self.loopback_ip!r})"


def _cap(text: str, cap: int) -> str:
    data = text.encode()
    if len(data) <= cap:
        return text
    cut = data[:cap].decode(errors="ignore")
    return f"{cut}\n[... {len(data) - cap} bytes of output truncated]"
