"""Handler-facing tools: ``upload``, ``download`` and one-off ``exec`` commands.

These are not shown to the model. Handlers use them to place task files, fetch
results (``git diff``, reports) and run reward commands or hidden tests in the
workspace without touching the model's persistent shell.
"""

from __future__ import annotations

import asyncio
import codecs
import os
import signal
from pathlib import Path
from typing import Any

import msgspec

from prorl_async.toolserver._base import ToolError, ToolOutput, parse_args
from prorl_async.toolserver._text import CappedText, strip_ansi

__all__ = ["ExecTool", "FileTools", "resolve_path"]


def resolve_path(workspace: Path, path: str, *, confine: bool) -> Path:
    """Absolute, symlink-resolved ``path`` (relative ones start at ``workspace``).

    With ``confine`` the result must lie inside the workspace: ``..`` and
    symlinks are resolved *before* the check, so neither can escape it.
    """
    if not path:
        raise ToolError("`path` must not be empty")
    if "\x00" in path:
        raise ToolError("`path` must not contain NUL bytes")
    resolved = (workspace / path).resolve()
    if confine and not resolved.is_relative_to(workspace):
        raise ToolError(f"path {path!r} resolves to {str(resolved)!r}, outside the workspace")
    return resolved


class _UploadArgs(msgspec.Struct, forbid_unknown_fields=True):
    path: str
    data: bytes
    mode: int | None = None


class _DownloadArgs(msgspec.Struct, forbid_unknown_fields=True):
    path: str


class FileTools:
    """``upload`` and ``download``; relative paths are taken from the workspace."""

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace

    async def upload(self, args: dict[str, Any]) -> ToolOutput:
        parsed = parse_args("upload", args, _UploadArgs)
        target = resolve_path(self.workspace, parsed.path, confine=False)
        await asyncio.to_thread(_write_file, target, parsed.data, parsed.mode)
        return ToolOutput(output=f"wrote {len(parsed.data)} bytes to {target}")

    async def download(self, args: dict[str, Any]) -> ToolOutput:
        parsed = parse_args("download", args, _DownloadArgs)
        target = resolve_path(self.workspace, parsed.path, confine=False)
        try:
            data = await asyncio.to_thread(target.read_bytes)
        except OSError as exc:
            raise ToolError(f"cannot read {parsed.path!r}: {exc.strerror or exc}") from exc
        return ToolOutput(output=f"read {len(data)} bytes from {target}", data={"data": data})


def _write_file(target: Path, data: bytes, mode: int | None) -> None:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        if mode is not None:
            target.chmod(mode)
    except OSError as exc:
        raise ToolError(f"cannot write {str(target)!r}: {exc.strerror or exc}") from exc


class _ExecArgs(msgspec.Struct, forbid_unknown_fields=True):
    command: str
    timeout: float = 60.0
    stdin: str | None = None
    output_cap: int = 1_000_000


# After the command and its group are gone, output still in the pipes is read for this long.
_DRAIN_GRACE_S = 2.0


class ExecTool:
    """Runs ``bash -c`` one-off commands in their own process group.

    A command's whole group is killed when it times out and again when it ends
    (so stray background jobs do not outlive it); :meth:`aclose` kills any still
    running.
    """

    name = "exec"

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace
        self._running: set[asyncio.subprocess.Process] = set()

    async def call(self, args: dict[str, Any]) -> ToolOutput:
        parsed = parse_args("exec", args, _ExecArgs)
        if parsed.timeout <= 0:
            raise ToolError("`timeout` must be positive")
        proc = await asyncio.create_subprocess_exec(
            "bash",
            "-c",
            parsed.command,
            cwd=self.workspace,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        self._running.add(proc)
        try:
            return await self._collect(proc, parsed)
        finally:
            await _kill_group(proc)
            self._running.discard(proc)

    async def _collect(self, proc: asyncio.subprocess.Process, args: _ExecArgs) -> ToolOutput:
        out, err = CappedText(args.output_cap), CappedText(args.output_cap)
        readers = [
            asyncio.create_task(_feed(proc, args.stdin)),
            asyncio.create_task(_drain(proc.stdout, out)),
            asyncio.create_task(_drain(proc.stderr, err)),
        ]
        timed_out = False
        try:
            # Wait for the command's exit, not for EOF: a background job it started may
            # hold the pipes (uvloop children also inherit a copy of them).
            async with asyncio.timeout(args.timeout):
                await proc.wait()
        except TimeoutError:
            timed_out = True
        finally:
            await _kill_group(proc)  # stray background jobs end with the command
            _, pending = await asyncio.wait(readers, timeout=_DRAIN_GRACE_S)
            for task in pending:
                task.cancel()
            await asyncio.gather(*readers, return_exceptions=True)
        stdout = out.text(args.output_cap, strip_ansi)
        stderr = err.text(args.output_cap, strip_ansi)
        exit_code = -9 if timed_out else (proc.returncode if proc.returncode is not None else -1)
        data = {"exit_code": exit_code, "stdout": stdout, "stderr": stderr, "timed_out": timed_out}
        note = f"\n[timed out after {args.timeout} s]" if timed_out else ""
        return ToolOutput(output=stdout + stderr + note, data=data)

    async def aclose(self) -> None:
        """Kill every command still running; safe to call twice."""
        for proc in list(self._running):
            await _kill_group(proc)


async def _feed(proc: asyncio.subprocess.Process, stdin: str | None) -> None:
    assert proc.stdin is not None
    try:
        if stdin:
            proc.stdin.write(stdin.encode())
            await proc.stdin.drain()
        proc.stdin.close()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the command exited without reading its input; that is its business


async def _drain(stream: asyncio.StreamReader | None, sink: CappedText) -> None:
    assert stream is not None
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    while chunk := await stream.read(65536):
        sink.append(decoder.decode(chunk))
    sink.append(decoder.decode(b"", final=True))


async def _kill_group(proc: asyncio.subprocess.Process) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # group already empty
    await asyncio.shield(proc.wait())
