"""The processes a training run owns besides the learner: the vLLM engine and the server.

Each is an async context manager that starts its process, waits (bounded) until it
answers, and on exit ends it and everything it started, whatever ended the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

from prorl_async.vllm_cpu import EngineEnv, VllmProcess

__all__ = ["RunError", "engine", "run_in_engine_venv", "server"]

Say = Callable[[str], None]
_SERVER_START_S = 60.0
_ENGINE_START_S = 600.0


class RunError(RuntimeError):
    """A part of the run failed; the message names the part and where its log is."""


@asynccontextmanager
async def engine(
    env: EngineEnv, model_dir: Path, log_path: Path, cores: str | None, max_model_len: int
) -> AsyncIterator[VllmProcess]:
    """A vLLM engine serving ``model_dir`` (``cores``: ``VLLM_CPU_OMP_THREADS_BIND``, e.g.
    ``"0"`` to keep its decoding on core 0; ``None``: unbound)."""
    environ = {"VLLM_CPU_OMP_THREADS_BIND": cores} if cores is not None else {}
    proc = VllmProcess(
        env, model_dir, log_path=log_path, environ=environ, max_model_len=max_model_len
    )
    try:
        await asyncio.to_thread(proc.start, _ENGINE_START_S)
    except Exception as exc:
        raise RunError(f"the vLLM engine did not start ({exc}); its log: {log_path}") from exc
    try:
        yield proc
    finally:
        await asyncio.to_thread(proc.stop)


@asynccontextmanager
async def server(args: Sequence[str], state_dir: Path, log_path: Path) -> AsyncIterator[str]:
    """A ``prorl-async serve`` process on a free loopback port; yields its base URL."""
    port_file, log = _prepare(state_dir, log_path)
    argv = [sys.executable, "-m", "prorl_async.cli", "serve", "--host", "127.0.0.1"]
    argv += ["--port", "0", "--port-file", str(port_file), "--state-dir", str(state_dir)]
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    finally:
        os.close(log)
    try:
        port = await _port(proc, port_file, log_path)
        yield f"http://127.0.0.1:{port}"
    finally:
        await _end(proc)


async def run_in_engine_venv(
    env: EngineEnv, module: str, args: Sequence[str], log_path: Path, timeout_s: float, say: Say
) -> None:
    """``python -m module args`` in the engine's venv, to its end (bounded by ``timeout_s``);
    its stdout lines that start with the module's last name are said, everything goes to
    ``log_path``. Cancelled or timed out, it is ended with its process group."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    tag = module.rsplit(".", 1)[-1].split("_")[0]
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        proc = await asyncio.create_subprocess_exec(
            str(env.python),
            "-m",
            module,
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=log,
            env=env.process_env(),
            start_new_session=True,
        )
        try:
            async with asyncio.timeout(timeout_s):
                assert proc.stdout is not None
                async for raw in proc.stdout:
                    os.write(log, raw)
                    line = raw.decode(errors="replace").rstrip()
                    if line.startswith(tag):
                        say(line)
                code = await proc.wait()
        except TimeoutError:
            msg = f"{module} did not finish within {timeout_s:.0f} s; log: {log_path}"
            raise RunError(msg) from None
        finally:
            await _end(proc, grace_s=10.0)
    finally:
        os.close(log)
    if code != 0:
        raise RunError(f"{module} exited with {code}; its log: {log_path}")


def _prepare(state_dir: Path, log_path: Path) -> tuple[Path, int]:
    """The port file (none yet) and the log's descriptor (appended to)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    port_file = state_dir / "port"
    port_file.unlink(missing_ok=True)
    return port_file, os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


def _read_port(port_file: Path) -> int | None:
    try:
        text = port_file.read_text().strip()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() else None


async def _port(proc: asyncio.subprocess.Process, port_file: Path, log_path: Path) -> int:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _SERVER_START_S
    while loop.time() < deadline:
        if proc.returncode is not None:
            raise RunError(f"the server exited with {proc.returncode}; its log: {log_path}")
        port = _read_port(port_file)
        if port is not None:
            return port
        with contextlib.suppress(TimeoutError):  # a start-up poll with a deadline
            await asyncio.wait_for(proc.wait(), 0.1)
    raise RunError(f"the server did not listen within {_SERVER_START_S:.0f} s; log: {log_path}")


async def _end(proc: asyncio.subprocess.Process, grace_s: float = 30.0) -> None:
    """SIGTERM (the server releases every job and sandbox), SIGKILL after ``grace_s``."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), grace_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
