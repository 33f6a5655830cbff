"""One node's share of a deployment: start N rollout servers or N LLM servers, own them.

Run once per node and role by the Slurm launcher (``srun --overlap``); see
``deploy/slurm/README.md``. Each child gets its own log file (and, for a rollout server,
its own node-local state directory), runs in its own session so its whole process tree
can be signalled, and is announced in ``RUN_DIR/cluster.d/NAME.json`` once its address
is known. A child that exits on its own leaves ``NAME.failed`` next to it. On SIGTERM or
SIGINT every child gets SIGTERM, then SIGKILL after the grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from prorl_async.util.resource import AsyncResource

__all__ = [
    "Child",
    "NodeChildren",
    "free_ports",
    "llm_children",
    "node_gpus",
    "server_children",
    "split_gpus",
]

_encoder = msgspec.json.Encoder()


@dataclass(frozen=True)
class Child:
    """One process to run: its name, argv, log file and what to announce."""

    name: str
    argv: list[str]
    log: Path
    node: str
    env: Mapping[str, str] = field(default_factory=dict)
    # A rollout server: the URL is known once it writes this file.
    port_file: Path | None = None
    state_dir: Path | None = None
    host: str = ""
    # An LLM: its address is known before it starts.
    address: str | None = None


def server_children(
    *, node: str, addr: str, count: int, run_dir: Path, state_root: Path, extra_args: str
) -> list[Child]:
    """``count`` rollout servers on ``addr``, port 0, each with its own state dir."""
    out = []
    for i in range(count):
        name = f"server-{node}-{i}"
        port_file = run_dir / "cluster.d" / f"{name}.port"
        argv = [
            sys.executable,
            "-m",
            "prorl_async.cli",
            "serve",
            "--host",
            addr,
            "--port",
            "0",
            "--port-file",
            str(port_file),
            "--state-dir",
            str(state_root / name),
            *shlex.split(extra_args),
        ]
        out.append(
            Child(
                name,
                argv,
                run_dir / "logs" / f"{name}.log",
                node,
                port_file=port_file,
                state_dir=state_root / name,
                host=addr,
            )
        )
    return out


def llm_children(
    *, node: str, addr: str, count: int, run_dir: Path, template: str, gpus: list[str]
) -> list[Child]:
    """``count`` LLM servers from ``template`` ({host} {port} {gpu}), each on a free port."""
    ports = free_ports(addr, count)
    shares = split_gpus(gpus, count)
    out = []
    for i, (port, share) in enumerate(zip(ports, shares, strict=True)):
        name = f"llm-{node}-{i}"
        gpu = ",".join(share)
        try:
            argv = shlex.split(template.format(host=addr, port=port, gpu=gpu))
        except (KeyError, IndexError, ValueError) as exc:
            hint = "placeholders are {host} {port} {gpu}"
            raise ValueError(f"PRORL_LLM_CMD {template!r}: {exc!r} ({hint})") from exc
        env = {"CUDA_VISIBLE_DEVICES": gpu} if share else {}
        address = f"http://{_url_host(addr)}:{port}/v1"
        out.append(
            Child(name, argv, run_dir / "logs" / f"{name}.log", node, env=env, address=address)
        )
    return out


def node_gpus(env: Mapping[str, str]) -> list[str]:
    """This step's GPUs: ``CUDA_VISIBLE_DEVICES`` as Slurm set it, else every GPU
    ``nvidia-smi -L`` lists, else none."""
    if "CUDA_VISIBLE_DEVICES" in env:
        return [g.strip() for g in env["CUDA_VISIBLE_DEVICES"].split(",") if g.strip()]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    lines = [line for line in done.stdout.splitlines() if line.startswith("GPU ")]
    return [str(i) for i in range(len(lines))] if done.returncode == 0 else []


def split_gpus(gpus: list[str], count: int) -> list[list[str]]:
    """Give each of ``count`` processes its own GPUs (round robin when there are fewer)."""
    if not gpus:
        return [[] for _ in range(count)]
    if len(gpus) < count:
        return [[gpus[i % len(gpus)]] for i in range(count)]
    per = len(gpus) // count
    return [gpus[i * per : (i + 1) * per] for i in range(count)]


def free_ports(addr: str, count: int) -> list[int]:
    """``count`` distinct ports free on ``addr`` now (held together so they differ)."""
    family = socket.getaddrinfo(addr.strip("[]"), 0, type=socket.SOCK_STREAM)[0][0]
    with contextlib.ExitStack() as stack:
        socks = [
            stack.enter_context(socket.socket(family, socket.SOCK_STREAM)) for _ in range(count)
        ]
        for s in socks:
            s.bind((addr.strip("[]"), 0))
        return [int(s.getsockname()[1]) for s in socks]


def _url_host(addr: str) -> str:
    return f"[{addr}]" if ":" in addr and not addr.startswith("[") else addr


class NodeChildren(AsyncResource):
    """Starts the children, announces them, records failures; ``aclose`` stops them all."""

    def __init__(self, children: list[Child], run_dir: Path, grace_s: float) -> None:
        self._children = children
        self._dir = run_dir / "cluster.d"
        self._grace = grace_s
        self._procs: dict[str, asyncio.subprocess.Process] = {}
        self._closing = False

    @property
    def names(self) -> list[str]:
        return [c.name for c in self._children]

    async def start(self) -> None:
        self._dir.mkdir(parents=True, exist_ok=True)
        for child in self._children:
            child.log.parent.mkdir(parents=True, exist_ok=True)
            if child.state_dir is not None:
                child.state_dir.mkdir(parents=True, exist_ok=True)
            self._procs[child.name] = await self._spawn(child)
            if child.address is not None:
                self._announce(child, {"address": child.address, "node": child.node})

    async def _spawn(self, child: Child) -> asyncio.subprocess.Process:
        # a small local file, opened once per child at start-up
        with open(child.log, "ab") as log:  # noqa: ASYNC230
            try:
                return await asyncio.create_subprocess_exec(
                    *child.argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    env={**os.environ, **child.env},
                    start_new_session=True,
                )
            except OSError as exc:
                log.write(f"cannot start {child.argv[0]!r}: {exc}\n".encode())
                raise ValueError(f"{child.name}: cannot start {child.argv[0]!r}: {exc}") from exc

    def _announce(self, child: Child, entry: dict[str, str]) -> None:
        _write_atomic(self._dir / f"{child.name}.json", _encoder.encode(entry))

    async def run(self) -> int:
        """Watch until every child has exited; 1 if any exited on its own, else 0."""
        results = await asyncio.gather(*(self._watch(c) for c in self._children))
        return 0 if all(results) else 1

    async def _watch(self, child: Child) -> bool:
        proc = self._procs[child.name]
        if child.port_file is not None:
            await self._announce_server(child, proc)
        code = await proc.wait()
        if self._closing:
            return True
        failure = {"name": child.name, "returncode": code, "log": str(child.log)}
        _write_atomic(self._dir / f"{child.name}.failed", _encoder.encode(failure))
        return False

    async def _announce_server(self, child: Child, proc: asyncio.subprocess.Process) -> None:
        assert child.port_file is not None
        # No event to await from another process: poll its port file while it lives
        # (returncode is set by the loop's child watcher as soon as it exits).
        while proc.returncode is None and not child.port_file.exists():  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        if proc.returncode is None:
            port = int(child.port_file.read_text())
            url = f"http://{_url_host(child.host)}:{port}"
            self._announce(child, {"url": url, "node": child.node})

    async def aclose(self) -> None:
        if self._closing:
            return
        self._closing = True
        live = [p for p in self._procs.values() if p.returncode is None]
        for proc in live:
            _killpg(proc.pid, signal.SIGTERM)
        try:
            async with asyncio.timeout(self._grace):
                await asyncio.gather(*(p.wait() for p in live))
        except TimeoutError:
            pass
        finally:
            for proc in self._procs.values():
                # the leader may be gone while the rest of its session lives on
                _killpg(proc.pid, signal.SIGKILL)
            await asyncio.gather(*(p.wait() for p in live))


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
