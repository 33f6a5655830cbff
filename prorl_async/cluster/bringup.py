"""Wait for a deployment to be healthy, assign and register backends, write ``cluster.json``.

Reads what the node launchers announce in ``RUN_DIR/cluster.d`` (see
:mod:`prorl_async.cluster.node`). Fails at once, with the tail of the culprit's log,
when a process exits, a watched launcher step ends, or the start timeout passes.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import msgspec

from prorl_async.client import RolloutClient
from prorl_async.cluster.assign import assign
from prorl_async.cluster.spec import ClusterSpec, LLMEntry, ServerEntry, dump_spec
from prorl_async.util.procs import start_time

__all__ = ["BringUp", "StartupError", "bring_up", "log_tail", "token_from_env"]

_TAIL_LINES = 30


class StartupError(RuntimeError):
    """The deployment did not come up; the message says which process and shows its log."""


@dataclass(frozen=True, kw_only=True)
class BringUp:
    """What to wait for and how to register it."""

    run_dir: Path
    servers: int
    llms: int
    timeout_s: float = 600.0
    weight_version: int | str = 0
    api: str = "vllm"
    slurm_job_id: str = ""
    watch_pids: tuple[int, ...] = ()
    token: str | None = None


def log_tail(path: str | Path, lines: int = _TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file (or why it cannot be read)."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as exc:
        return f"(no log: {exc})"
    return "\n".join(text.splitlines()[-lines:])


async def bring_up(cfg: BringUp) -> ClusterSpec:
    """Wait until everything is healthy, then assign, register and write ``cluster.json``."""
    async with aiohttp.ClientSession() as session:
        servers, llms = await _wait_healthy(cfg, session)
        spec = ClusterSpec(
            servers=servers,
            llms=llms,
            assignment=assign(servers, llms),
            slurm_job_id=cfg.slurm_job_id,
        )
        await _register(cfg, spec, session)
    dump_spec(spec, cfg.run_dir / "cluster.json")
    return spec


async def _wait_healthy(
    cfg: BringUp, session: aiohttp.ClientSession
) -> tuple[list[ServerEntry], list[LLMEntry]]:
    deadline = time.monotonic() + cfg.timeout_s
    healthy: set[str] = set()
    while True:
        servers, llms = _announced(cfg.run_dir / "cluster.d")
        _check_alive(cfg)
        pending = [s.url + "/healthz" for s in servers] + [_health_url(m.address) for m in llms]
        healthy |= await _probe([u for u in pending if u not in healthy], session)
        if len(servers) == cfg.servers and len(llms) == cfg.llms and healthy >= set(pending):
            return servers, llms
        if time.monotonic() > deadline:
            raise StartupError(_timeout_report(cfg, servers, llms, healthy))
        # Other processes on other nodes: there is no event to await, so poll.
        await asyncio.sleep(0.2)


def _announced(directory: Path) -> tuple[list[ServerEntry], list[LLMEntry]]:
    servers: list[ServerEntry] = []
    llms: list[LLMEntry] = []
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else ():
        raw = path.read_bytes()
        if path.name.startswith("server-"):
            servers.append(msgspec.json.decode(raw, type=ServerEntry))
        else:
            llms.append(msgspec.json.decode(raw, type=LLMEntry))
    return servers, llms


def _check_alive(cfg: BringUp) -> None:
    directory = cfg.run_dir / "cluster.d"
    for path in sorted(directory.glob("*.failed")) if directory.is_dir() else ():
        info = msgspec.json.decode(path.read_bytes())
        raise StartupError(
            f"{info['name']} exited with status {info['returncode']} before the deployment "
            f"was up; last lines of {info['log']}:\n{log_tail(info['log'])}"
        )
    for pid in cfg.watch_pids:
        if start_time(pid) is None:  # gone (or a zombie)
            logs = sorted((cfg.run_dir / "logs").glob("node-*.log"))
            tails = "\n".join(f"--- {p}:\n{log_tail(p, 10)}" for p in logs)
            msg = f"launcher step (pid {pid}) ended before the deployment was up"
            raise StartupError(f"{msg}\n{tails}")


def _health_url(address: str) -> str:
    base = address.rstrip("/")
    return (base[: -len("/v1")] if base.endswith("/v1") else base) + "/health"


async def _probe(urls: Iterable[str], session: aiohttp.ClientSession) -> set[str]:
    urls = list(urls)
    ok = await asyncio.gather(*(_answers(u, session) for u in urls))
    return {u for u, good in zip(urls, ok, strict=True) if good}


async def _answers(url: str, session: aiohttp.ClientSession) -> bool:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as resp:
            return resp.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


def _timeout_report(
    cfg: BringUp, servers: list[ServerEntry], llms: list[LLMEntry], healthy: set[str]
) -> str:
    lines = [
        f"not up after {cfg.timeout_s:g} s: {len(servers)}/{cfg.servers} servers and "
        f"{len(llms)}/{cfg.llms} LLMs announced, {len(healthy)} healthy"
    ]
    for log in sorted((cfg.run_dir / "logs").glob("*.log")):
        lines.append(f"--- last lines of {log}:\n{log_tail(log, 10)}")
    return "\n".join(lines)


async def _register(cfg: BringUp, spec: ClusterSpec, session: aiohttp.ClientSession) -> None:
    async def one(url: str, addresses: list[str]) -> None:
        async with RolloutClient(url, token=cfg.token, session=session) as client:
            for address in addresses:
                await client.add_llm_server(address, weight_version=cfg.weight_version, api=cfg.api)

    await asyncio.gather(*(one(url, addrs) for url, addrs in spec.assignment.items()))


def token_from_env() -> str | None:
    """The rollout servers' token, from ``PRORL_TOKEN`` (never from a command line)."""
    return os.environ.get("PRORL_TOKEN") or None
