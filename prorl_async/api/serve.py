"""Running the server process: uvloop, signals, orderly shutdown."""

from __future__ import annotations

import asyncio
import errno
import gc
import logging
import os
import signal
import sys
from pathlib import Path
from urllib.parse import urlsplit

import uvloop

from prorl_async.api.app import run_server
from prorl_async.api.connections import raise_nofile_limit
from prorl_async.api.routes import SERVICE
from prorl_async.config import ServerConfig
from prorl_async.store import StateDirBusy, StoreError

__all__ = ["bind_problem", "serve", "serve_forever", "write_port_file"]

log = logging.getLogger("prorl_async")


async def serve_forever(config: ServerConfig, ready: asyncio.Event | None = None) -> int:
    """Serve until SIGTERM/SIGINT, then stop intake, cancel and release every job; returns
    the exit code: 0, or 1 if the job store's writer process was lost (it stops the
    server: a restart requeues what was not committed)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals = (signal.SIGTERM, signal.SIGINT)
    for sig in signals:
        # The handler only sets a flag; shutdown runs in order below.
        loop.add_signal_handler(sig, stop.set)
    try:
        async with run_server(config) as (app, url):
            log.info("prorl-async listening on %s (state dir %s)", url, config.state_dir)
            if config.port_file is not None:
                write_port_file(config.port_file, urlsplit(url).port or 0)
            if ready is not None:
                ready.set()
            lost = app[SERVICE].lost
            waits = {asyncio.ensure_future(stop.wait()), asyncio.ensure_future(lost.wait())}
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
            if lost.is_set():
                log.error("stopping: %s", app[SERVICE].lost_reason)
            else:
                log.info("signal received: stopping")
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
    log.info("stopped cleanly")
    return 1 if lost.is_set() else 0


def write_port_file(path: str, port: int) -> None:
    """Write ``port`` to ``path`` atomically: a reader sees the whole number or no file."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(f"{port}\n")
    os.replace(tmp, target)


def serve(config: ServerConfig) -> int:
    """Blocking entry point for ``prorl-async serve``; returns the exit code."""
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    _tune_interpreter()
    # Connections, sandboxes, PTYs and kernels all take descriptors: 1,024 is not enough.
    log.info("open-file limit: %d", raise_nofile_limit())
    try:
        code = uvloop.run(serve_forever(config))
    except (StateDirBusy, StoreError) as exc:
        log.error("refusing to start: %s", exc)
        return 2
    except OSError as exc:
        if exc.errno not in (errno.EADDRINUSE, errno.EADDRNOTAVAIL):
            raise
        sys.stderr.write(f"prorl-async serve: {bind_problem(config.host, config.port, exc)}\n")
        return 2
    return code


def bind_problem(host: str, port: int, exc: OSError) -> str:
    """One line: why ``host:port`` cannot be bound, and what to do instead."""
    if exc.errno == errno.EADDRINUSE:
        return (
            f"port {port} on {host} is already in use (another server?): stop it, or choose "
            f"another port with --port {port + 1 if port < 65535 else 8400}, or --port 0 for a "
            "free one (--port-file FILE tells you which)"
        )
    return f"cannot bind {host}:{port} ({exc.strerror}): give --host an address of this machine"


_SWITCH_INTERVAL_S = 0.0005


def _tune_interpreter() -> None:
    # Thousands of live job records make full collections the main source of tail
    # latency; collect young objects less often and keep start-up objects out of it.
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    # Worker threads (the job store's reads of results from its file, other
    # ``asyncio.to_thread`` calls) take the interpreter lock back after each blocking
    # call; with the loop busy each wait is a whole switch interval (5 ms by default),
    # and a long-poll waits for that read. (The writer is a process: not among them.)
    sys.setswitchinterval(_SWITCH_INTERVAL_S)
