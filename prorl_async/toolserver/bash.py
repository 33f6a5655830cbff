"""The ``bash`` tool: commands in one persistent shell, with timeouts and capped output."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
from pathlib import Path
from typing import Any

import msgspec

from prorl_async.toolserver._base import ToolError, ToolOutput, parse_args
from prorl_async.toolserver.shell import PtyShell, Sentinel, ShellDied

__all__ = ["BashTool"]

_OLD_SENTINEL = re.compile(r"(?:\r?\n)?__PRORL_[0-9a-f]{16}_-?\d+_.*__\r?\n?")


class _BashArgs(msgspec.Struct, forbid_unknown_fields=True):
    command: str
    timeout: float | None = None
    no_output_timeout: float | None = None


class BashTool:
    """Runs commands in a :class:`PtyShell` started on first use.

    A command that outlives ``timeout`` (or prints nothing for
    ``no_output_timeout``) is interrupted with Ctrl-C and its partial output
    returned with a note; a fresh sentinel then proves the shell usable again.
    If even that fails, the shell is restarted and the note says state was lost.
    """

    name = "bash"

    def __init__(
        self,
        workspace: Path,
        *,
        output_cap: int = 16_000,
        timeout: float = 180.0,
        no_output_timeout: float = 60.0,
    ) -> None:
        self.workspace = workspace
        self.output_cap = output_cap
        self.timeout = timeout
        self.no_output_timeout = no_output_timeout
        self._shell: PtyShell | None = None
        self._lock = asyncio.Lock()
        self._dirty = False

    async def call(self, args: dict[str, Any]) -> ToolOutput:
        parsed = parse_args(self.name, args, _BashArgs)
        timeout = self.timeout if parsed.timeout is None else parsed.timeout
        idle = (
            self.no_output_timeout if parsed.no_output_timeout is None else parsed.no_output_timeout
        )
        if timeout <= 0 or idle <= 0:
            raise ToolError("bad arguments for tool 'bash': timeouts must be positive")
        async with self._lock:
            shell = await self._ready_shell()
            self._dirty = True  # until the command's sentinel (or a recovery) is seen
            result = await self._run(shell, parsed.command, timeout, idle)
            self._dirty = False
            return result

    async def aclose(self) -> None:
        """Kill the shell and everything it started; idempotent."""
        shell, self._shell = self._shell, None
        if shell is not None:
            await shell.aclose()

    async def _ready_shell(self) -> PtyShell:
        if self._shell is not None and self._shell.alive and self._dirty:
            # A previous call was cancelled mid-command: interrupt it first.
            if await self._recover(self._shell) is None:
                await self.aclose()
        if self._shell is None or not self._shell.alive:
            await self.aclose()
            self._shell = await PtyShell.start(self.workspace, output_limit=2 * self.output_cap)
        return self._shell

    async def _run(self, shell: PtyShell, command: str, timeout: float, idle: float) -> ToolOutput:
        pattern = shell.submit(command)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            while (found := shell.match(pattern)) is None:
                now = loop.time()
                if now >= deadline:
                    return await self._interrupted(shell, f"timed out after {timeout:g} s")
                if shell.idle_seconds >= idle:
                    return await self._interrupted(shell, f"no output for {idle:g} s")
                await shell.wait_activity(min(deadline - now, idle - shell.idle_seconds))
        except ShellDied:
            text = self._render(shell)
            await self.aclose()
            note = "[the shell exited; a new one will start with the next command]"
            return ToolOutput(output=_join(text, note), data={"exit_code": -1, "exited": True})
        return self._finish(shell, found, note=None)

    async def _interrupted(self, shell: PtyShell, why: str) -> ToolOutput:
        found = await self._recover(shell)
        if found is not None:
            return self._finish(shell, found, note=f"[{why}; interrupted with Ctrl-C]")
        text = self._render(shell)
        await self.aclose()
        note = f"[{why}; the shell did not recover and was restarted: its state is lost]"
        return ToolOutput(output=_join(text, note), data={"exit_code": -1, "timed_out": True})

    async def _recover(self, shell: PtyShell) -> Sentinel | None:
        """Ctrl-C, wait for bash to own the terminal again, then a fresh sentinel."""
        try:
            shell.write("\x03")
            if not await _wait_foreground(shell, 2.0):
                group = shell.foreground_group()
                if group is not None and group != shell.pid:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(group, signal.SIGKILL)
                if not await _wait_foreground(shell, 2.0):
                    return None
            return await shell.sync(timeout=5.0)
        except (TimeoutError, ShellDied, OSError):
            return None

    def _finish(self, shell: PtyShell, found: Sentinel, *, note: str | None) -> ToolOutput:
        text = self._render(shell)
        data = {"exit_code": found.exit_code, "cwd": found.cwd, "timed_out": note is not None}
        if found.exit_code != 0:
            note = _join(note, f"[exit code: {found.exit_code}]")
        return ToolOutput(output=_join(text, note), data=data)

    def _render(self, shell: PtyShell) -> str:
        text = shell.output.text(self.output_cap)
        text = text.replace(f"{shell.command_file}: line ", "bash: line ")
        return _OLD_SENTINEL.sub("\n", text).rstrip("\n")


def _join(text: str | None, note: str | None) -> str:
    if not note:
        return text or ""
    return f"{text}\n{note}" if text else note


async def _wait_foreground(shell: PtyShell, timeout: float) -> bool:
    """Poll until bash owns the terminal: the kernel offers no event for a pgrp change."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not shell.foreground_is_shell():
        if loop.time() >= deadline or not shell.alive:
            return False
        await asyncio.sleep(0.005)
    return True
