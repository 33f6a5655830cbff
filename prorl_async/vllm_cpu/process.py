"""One vLLM server process on CPU, owned: started in its own session, stopped with its group.

Synchronous on purpose (a test session's fixture or the CLI owns it, not an event loop);
from async code call its methods with ``asyncio.to_thread``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Self

from prorl_async.util.procs import descendants
from prorl_async.vllm_cpu.env import (
    DEFAULT_IDLE_SPIN_S,
    IDLE_SPIN_VAR,
    SERVED_MODEL,
    EngineEnv,
)
from prorl_async.vllm_cpu.scripts import ENV_VAR

__all__ = ["VllmProcess", "VllmStartError", "bound_cores", "free_port", "pin_engine"]

SCRIPTING = "prorl_async.vllm_cpu.scripting:ScriptedReplies"


BIND_VAR = "VLLM_CPU_OMP_THREADS_BIND"
# vLLM's engine processes name themselves VLLM::EngineCore and VLLM::Worker (comm is cut
# at 15 characters).
ENGINE_COMM_PREFIX = "VLLM::"


def bound_cores(spec: str | None) -> set[int] | None:
    """The cores a single-rank ``VLLM_CPU_OMP_THREADS_BIND`` names (``"0"``, ``"0-3"``,
    ``"0,2-3"``); None for ``auto``, ``nobind``, several ranks (``"0-1|2-3"``) or unset."""
    if not spec or spec in ("auto", "nobind") or "|" in spec:
        return None
    cores: set[int] = set()
    for part in spec.split(","):
        first, _, last = part.partition("-")
        if not first.strip().isdigit() or (last and not last.strip().isdigit()):
            raise ValueError(f"{BIND_VAR}={spec!r}: not a list of cores like 0,2-3")
        cores.update(range(int(first), int(last or first) + 1))
    return cores


def pin_engine(root: int, cores: set[int]) -> int:
    """Bind every thread of the ``VLLM::`` processes under ``root`` to ``cores``; the
    threads pinned.

    vLLM binds only its worker's OpenMP threads. The engine-core process, which schedules
    each step and busy-waits for the worker's answer (its shared-memory queue spins after
    each read: a second with vLLM's own setting, see :mod:`.launch`), floats over every
    core and takes time from whatever else runs there (train-demo, 20 async steps: the
    learner's time 30 s with it floating, 24 s with it on the worker's core). The two
    hand work to each other in turn, so one core holds both at no cost to decoding (384
    requests took 1.4-1.5 s either way).
    """
    pinned = 0
    for pid in descendants(root):
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            if not comm.startswith(ENGINE_COMM_PREFIX):
                continue
            threads = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue  # ended meanwhile
        for tid in threads:
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                os.sched_setaffinity(int(tid), cores)
                pinned += 1
    return pinned


class VllmStartError(RuntimeError):
    """The engine did not come up; the message holds the end of its log."""


def free_port() -> int:
    """A TCP port free on loopback now (vLLM takes no ``--port 0``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class VllmProcess:
    """vLLM's OpenAI server (``vllm.entrypoints.openai.api_server``) for ``model_dir`` on
    loopback, started through :mod:`.launch`, which bounds its idle spin (``idle_spin_s``,
    default 0.02 s; None keeps vLLM's 1 s).

    Flags: ``--dtype float32 --enforce-eager`` (no torch.compile at every start),
    ``--max-model-len`` (2048), the scripting logits processor, dev mode (``/pause``,
    ``/resume``, ``/collective_rpc``). Its output goes to ``log_path``. Its temporary files
    (vLLM's ZMQ sockets and ``vllm_dist_*`` rendezvous files, which a killed engine never
    removes) go to a directory of its own, ``tmp_dir`` (None when not running), removed by ``stop``.
    """

    def __init__(
        self,
        env: EngineEnv,
        model_dir: Path,
        *,
        log_path: Path,
        port: int | None = None,
        scripts: Path | None = None,
        max_model_len: int = 2048,
        served_name: str = SERVED_MODEL,
        extra_args: tuple[str, ...] = (),
        environ: dict[str, str] | None = None,
        idle_spin_s: float | None = DEFAULT_IDLE_SPIN_S,
    ) -> None:
        self.env, self.model_dir, self.log_path = env, model_dir, log_path
        # Extra environment, e.g. ``VLLM_CPU_OMP_THREADS_BIND="0"`` to keep it on core 0.
        self.environ = dict(environ or {})
        self.port = port or free_port()
        self.scripts = scripts
        self.max_model_len, self.served_name = max_model_len, served_name
        self.extra_args = extra_args
        if idle_spin_s is not None and not idle_spin_s >= 0:
            raise ValueError(f"idle_spin_s must be >= 0 seconds or None, not {idle_spin_s!r}")
        self.idle_spin_s = idle_spin_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.tmp_dir: Path | None = None

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def address(self) -> str:
        """The OpenAI-style base URL to register with the server."""
        return f"{self.root}/v1"

    def argv(self) -> list[str]:
        return [
            str(self.env.python),
            "-m",
            "prorl_async.vllm_cpu.launch",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            self.served_name,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--max-model-len",
            str(self.max_model_len),
            "--dtype",
            "float32",
            "--enforce-eager",
            # Whole prefills only: vllm-cpu 0.32.0 rewinds the random generator of a seeded
            # request whose prefill was split across steps, and a CPU generator has no
            # offset ("CPU Generator does not use offset"): the engine core died when a
            # burst of seeded requests overflowed one step's token budget.
            "--no-enable-chunked-prefill",
            "--max-num-batched-tokens",
            str(self.max_model_len),
            "--logits-processors",
            SCRIPTING,
            # A log line per request: a rollout run makes thousands a minute (~1 MB of log
            # every two minutes, and ~3% of the API server's CPU).
            "--disable-uvicorn-access-log",
            *self.extra_args,
        ]

    def start(self, ready_timeout_s: float = 300.0) -> Self:
        """Start the engine and wait until ``/health`` answers (or it exits, or the bound)."""
        if self.proc is not None:
            raise RuntimeError("this engine was started already")
        cores = bound_cores(self.environ.get(BIND_VAR))
        extra = {ENV_VAR: str(self.scripts)} if self.scripts is not None else {}
        extra[IDLE_SPIN_VAR] = "vllm" if self.idle_spin_s is None else repr(self.idle_spin_s)
        extra.update(self.environ)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp_dir = Path(tempfile.mkdtemp(prefix="prorl-vllm-"))
        extra["TMPDIR"] = str(self.tmp_dir)  # vLLM's sockets and rendezvous files
        try:
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(
                    self.argv(),
                    env=self.env.process_env(**extra),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
        except BaseException:
            self._remove_tmp()
            raise
        try:
            self._wait_ready(ready_timeout_s)
            if cores is not None:
                pin_engine(self.proc.pid, cores)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise VllmStartError(f"vLLM exited with {self.proc.returncode}:\n{self.log_tail()}")
            if self.healthy(timeout_s=2.0):
                return
            time.sleep(0.5)  # a start-up poll with a deadline, not synchronisation
        raise VllmStartError(f"vLLM not healthy after {timeout_s:.0f} s:\n{self.log_tail()}")

    def healthy(self, timeout_s: float = 2.0) -> bool:
        try:
            with urllib.request.urlopen(f"{self.root}/health", timeout=timeout_s) as resp:
                return int(resp.status) == 200
        except (OSError, urllib.error.URLError):
            return False

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the engine's whole process group (the API server and its engine)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM the group, SIGKILL it after ``grace_s``, reap, remove ``tmp_dir``.
        Idempotent."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            self.signal(signal.SIGCONT)  # a stopped group cannot act on SIGTERM
            self.signal(signal.SIGTERM)
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        # The API server may have exited before its children: kill what is left.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        self.proc = None
        self._remove_tmp()

    def _remove_tmp(self) -> None:
        if self.tmp_dir is not None:
            shutil.rmtree(self.tmp_dir, ignore_errors=True)
            self.tmp_dir = None

    def __enter__(self) -> Self:
        return self.start() if self.proc is None else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
