"""The project's side of the learner: owns its process and talks to it, no torch here.

:class:`Learner` starts ``python -m prorl_async.train_demo.learner`` with the engine venv's
Python (in a session of its own, stderr to a log file) and sends it one request at a time
(:mod:`.learner_protocol`). Every wait is bounded: an answer that does not come within the
call's ``timeout_s``, a learner that died, or one that refused the request raises
:class:`LearnerError` naming the op and ending with the learner's log tail.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, Self

import msgspec

from prorl_async.vllm_cpu.env import EngineEnv

__all__ = ["Learner", "LearnerError", "LearnerRefused"]

MODULE = "prorl_async.train_demo.learner"
# One answer is one line: the logprobs of a large batch run to megabytes.
_MAX_LINE = 256 * 1024 * 1024
_REAP_S = 5.0


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    raise NotImplementedError(f"cannot send a {type(obj).__name__} to the learner")


_encode = msgspec.json.Encoder(enc_hook=_enc_hook).encode
_decode = msgspec.json.Decoder(dict[str, Any]).decode


class LearnerError(RuntimeError):
    """The learner did not answer: it died, timed out, or was not running."""


class LearnerRefused(LearnerError):
    """The learner answered ``"ok": false``: the request was wrong or its op failed."""


class Learner:
    """The learner process, owned: an async context manager; ``aclose`` ends it (EOF on its
    stdin, then SIGTERM, then SIGKILL to its process group, each bounded by ``grace_s``).

    ``argv`` replaces the command (tests give a stand-in that needs no engine venv).
    """

    def __init__(
        self,
        *,
        log_path: Path,
        env: EngineEnv | None = None,
        argv: Sequence[str] | None = None,
        grace_s: float = 5.0,
    ) -> None:
        self.log_path, self.grace_s = log_path, grace_s
        self.env = EngineEnv() if env is None else env
        self.argv = list(argv) if argv is not None else [str(self.env.python), "-m", MODULE]
        self._proc: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()  # one request on the wire at a time
        self._next_id = 0
        self._closing = False
        self._closed = asyncio.Event()

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.returncode

    async def start(self) -> Self:
        """Start the process (its first ``init`` pays for importing torch: seconds)."""
        if self._proc is not None or self._closing:
            raise LearnerError("this learner was started already")
        with self._open_log() as log:
            self._proc = await asyncio.create_subprocess_exec(
                *self.argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                env=self.env.process_env(),
                start_new_session=True,
                limit=_MAX_LINE,
            )
        return self

    def _open_log(self) -> BinaryIO:
        if not Path(self.argv[0]).exists():
            raise LearnerError(
                f"no Python at {self.argv[0]}: run `prorl-async vllm-cpu setup` for the "
                "engine venv the learner runs in"
            )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        return open(self.log_path, "ab")

    async def call(self, op: str, timeout_s: float, **fields: Any) -> dict[str, Any]:
        """Send ``{"id", "op", **fields}``; the answer's fields (``id`` and ``ok`` removed).

        Raises :class:`LearnerRefused` for ``"ok": false`` and :class:`LearnerError` when no
        answer comes within ``timeout_s`` (waiting for an earlier call included) or the
        process is gone. A late answer to a call that timed out is skipped by its id.
        """
        if self._proc is None or self._closing:
            raise LearnerError(f"learner {op}: the learner is not running")
        self._next_id += 1
        rid = self._next_id
        line = _encode({**fields, "id": rid, "op": op}) + b"\n"
        try:
            async with asyncio.timeout(timeout_s), self._lock:
                reply = await self._exchange(op, rid, line)
        except TimeoutError:
            raise self._error(op, f"no answer within {timeout_s:g} s") from None
        if not reply.pop("ok", False):
            raise LearnerRefused(f"learner {op}: {reply.get('error', 'refused, no reason given')}")
        reply.pop("id", None)
        return reply

    async def _exchange(self, op: str, rid: int, line: bytes) -> dict[str, Any]:
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        if proc.returncode is not None or proc.stdin.is_closing():
            raise await self._died(op)
        try:
            proc.stdin.write(line)
            await proc.stdin.drain()
        # uvloop raises RuntimeError for a pipe it has seen close
        except (BrokenPipeError, ConnectionResetError, RuntimeError):
            raise await self._died(op) from None
        while True:
            try:
                raw = await proc.stdout.readline()
            except ValueError as exc:  # longer than _MAX_LINE
                raise self._error(op, f"an unreadable answer: {exc}") from None
            if not raw.endswith(b"\n"):
                raise await self._died(op)
            try:
                reply = _decode(raw)
            except msgspec.DecodeError as exc:
                what = f"an answer that is not JSON ({exc}): {raw[:200]!r}"
                raise self._error(op, what) from None
            if reply.get("id") == rid:
                return reply
            # The answer to a call that timed out: its caller is gone.

    async def _died(self, op: str) -> LearnerError:
        assert self._proc is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_REAP_S):
                await self._proc.wait()
        status = self._proc.returncode
        how = "is still running" if status is None else f"exited with status {status}"
        return self._error(op, f"the learner closed its output and {how}")

    def _error(self, op: str, what: str) -> LearnerError:
        tail = self.log_tail()
        return LearnerError(f"learner {op}: {what}; its log ({self.log_path}) ends:\n{tail}")

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:]) or "(empty)"

    # -- closing ------------------------------------------------------------------------------

    async def aclose(self) -> None:
        """End the process: EOF, then SIGTERM, then SIGKILL (idempotent, bounded). If the
        wait is cancelled, the group is killed and reaped before the cancellation goes on."""
        if self._closing:
            await self._closed.wait()
            return
        self._closing = True
        proc = self._proc
        try:
            if proc is None:
                return
            graceful = asyncio.ensure_future(self._graceful(proc))
            try:
                await asyncio.shield(graceful)
            finally:
                if not graceful.done():
                    graceful.cancel()
                    await asyncio.wait([graceful])
                await self._force(proc)
        finally:
            self._closed.set()

    async def _graceful(self, proc: asyncio.subprocess.Process) -> None:
        if proc.stdin is not None and not proc.stdin.is_closing():
            proc.stdin.close()  # EOF: the learner finishes its op, if any, and exits
        if await _exited(proc, self.grace_s):
            return
        _signal_group(proc, signal.SIGTERM)
        await _exited(proc, self.grace_s)

    async def _force(self, proc: asyncio.subprocess.Process) -> None:
        if proc.returncode is None:
            _signal_group(proc, signal.SIGKILL)
            await _exited(proc, _REAP_S)

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


async def _exited(proc: asyncio.subprocess.Process, timeout_s: float) -> bool:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await proc.wait()
    return proc.returncode is not None


def _signal_group(proc: asyncio.subprocess.Process, sig: int) -> None:
    """Signal the learner's session (its own process group: ``start_new_session``)."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
