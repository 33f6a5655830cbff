"""The ``python`` tool: a persistent IPython kernel reached over ipc (Unix) sockets.

The kernel starts on first use (about 0.85 s). Each call sends one
``execute_request`` and gathers the iopub messages it causes (streams, results,
displays, tracebacks) until the kernel reports idle. A timeout interrupts the
kernel (SIGINT), which raises ``KeyboardInterrupt`` in the user code and leaves
the kernel and its state usable.
"""

from __future__ import annotations

import asyncio
import os
import queue
import shutil
import tempfile
from pathlib import Path
from typing import Any

import msgspec

from prorl_async.toolserver._base import ToolError, ToolOutput, parse_args
from prorl_async.toolserver._text import CappedText, strip_ansi
from prorl_async.util.procs import kill_tree
from prorl_async.util.resource import AsyncResource

__all__ = ["IpcKernel", "PythonTool"]


class IpcKernel(AsyncResource):
    """One IPython kernel process and its client; ``transport`` is ``ipc`` unless benchmarking."""

    def __init__(self, manager: Any, client: Any, runtime: Path) -> None:
        self._manager = manager
        self._client = client
        self._runtime = runtime
        self._closed = False

    @classmethod
    async def start(cls, cwd: Path, *, transport: str = "ipc", timeout: float = 60.0) -> IpcKernel:
        """Launch the kernel in ``cwd`` and wait until it answers."""
        # Imported here: jupyter_client costs ~0.5 s of server start-up otherwise.
        from jupyter_client.manager import AsyncKernelManager

        runtime = Path(tempfile.mkdtemp(prefix="prorl-kernel-"))
        manager = AsyncKernelManager(
            kernel_name="python3",
            transport=transport,
            connection_file=str(runtime / "kernel.json"),
        )
        if transport == "ipc":
            manager.ip = str(runtime / "k")  # ipc sockets are files named <ip>-<port>
        kernel = cls(manager, None, runtime)
        try:
            await manager.start_kernel(cwd=str(cwd))
            kernel._client = manager.client()
            kernel._client.start_channels()
            await kernel._client.wait_for_ready(timeout=timeout)
        except BaseException:
            await kernel.aclose()
            raise
        return kernel

    @property
    def pid(self) -> int | None:
        pid = getattr(self._manager.provisioner, "pid", None)
        return int(pid) if pid is not None else None

    @property
    def connection_file(self) -> str:
        return str(self._manager.connection_file)

    def execute(self, code: str) -> str:
        """Send ``code`` for execution; returns the request's message id."""
        msg_id: str = self._client.execute(code, store_history=True, allow_stdin=False)
        return msg_id

    async def collect(self, msg_id: str, sink: CappedText, timeout: float) -> dict[str, Any] | None:
        """Gather output for ``msg_id`` into ``sink`` until idle; ``None`` on timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            try:
                msg = await self._client.get_iopub_msg(timeout=remaining)
            except queue.Empty:
                return None
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if _is_idle(msg):
                return await self._reply(msg_id)
            _render_message(msg, sink)

    async def _reply(self, msg_id: str) -> dict[str, Any]:
        while True:
            try:
                msg = await self._client.get_shell_msg(timeout=5.0)
            except queue.Empty:
                return {}
            if msg["parent_header"].get("msg_id") == msg_id:
                content: dict[str, Any] = msg["content"]
                return content

    async def interrupt(self) -> None:
        await self._manager.interrupt_kernel()

    async def aclose(self) -> None:
        """Shut the kernel down (politely for 2 s, then SIGKILL) and reap it; idempotent."""
        if self._closed:
            return
        self._closed = True
        pid = self.pid
        if self._client is not None:
            self._client.stop_channels()
        try:
            await asyncio.shield(self._shutdown(pid))
        finally:
            shutil.rmtree(self._runtime, ignore_errors=True)

    async def _shutdown(self, pid: int | None) -> None:
        if self._manager.has_kernel:
            try:
                async with asyncio.timeout(2.0):
                    await self._manager.shutdown_kernel(now=False)
            except TimeoutError:
                await self._manager.shutdown_kernel(now=True)
        if pid is not None:
            kill_tree(pid)  # anything the user code started in the kernel's session
            _reap(pid)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass  # the manager already reaped it


def _is_idle(msg: dict[str, Any]) -> bool:
    return bool(msg["msg_type"] == "status" and msg["content"].get("execution_state") == "idle")


def _render_message(msg: dict[str, Any], sink: CappedText) -> None:
    kind, content = msg["msg_type"], msg["content"]
    if kind == "stream":
        sink.append(content.get("text", ""))
    elif kind in ("execute_result", "display_data"):
        text = content.get("data", {}).get("text/plain")
        if text:
            sink.append(text + "\n")
    elif kind == "error":
        sink.append("\n".join(content.get("traceback", [])) + "\n")


class _PythonArgs(msgspec.Struct, forbid_unknown_fields=True):
    code: str
    timeout: float | None = None


class PythonTool:
    """Runs code in an :class:`IpcKernel` started on first use."""

    name = "python"

    def __init__(self, workspace: Path, *, output_cap: int = 16_000, timeout: float = 180.0):
        self.workspace = workspace
        self.output_cap = output_cap
        self.timeout = timeout
        self._kernel: IpcKernel | None = None
        self._lock = asyncio.Lock()

    async def call(self, args: dict[str, Any]) -> ToolOutput:
        parsed = parse_args(self.name, args, _PythonArgs)
        timeout = self.timeout if parsed.timeout is None else parsed.timeout
        if timeout <= 0:
            raise ToolError("bad arguments for tool 'python': `timeout` must be positive")
        async with self._lock:
            if self._kernel is None:
                self._kernel = await IpcKernel.start(self.workspace)
            return await self._run(self._kernel, parsed.code, timeout)

    async def aclose(self) -> None:
        """Shut the kernel down and reap it; idempotent."""
        kernel, self._kernel = self._kernel, None
        if kernel is not None:
            await kernel.aclose()

    async def _run(self, kernel: IpcKernel, code: str, timeout: float) -> ToolOutput:
        sink = CappedText(2 * self.output_cap)
        msg_id = kernel.execute(code)
        reply = await kernel.collect(msg_id, sink, timeout)
        note = None
        if reply is None:
            await kernel.interrupt()
            reply = await kernel.collect(msg_id, sink, 10.0)
            note = f"[timed out after {timeout:g} s; the kernel was interrupted]"
            if reply is None:
                await self.aclose()
                note = f"[timed out after {timeout:g} s; the kernel was restarted: state is lost]"
        text = sink.text(self.output_cap, strip_ansi).rstrip("\n")
        output = f"{text}\n{note}" if text and note else (note or text)
        data = {
            "status": (reply or {}).get("status", "timeout"),
            "execution_count": (reply or {}).get("execution_count"),
            "timed_out": note is not None,
            "connection_file": kernel.connection_file,
            "kernel_pid": kernel.pid,
        }
        return ToolOutput(output=output, data=data)
