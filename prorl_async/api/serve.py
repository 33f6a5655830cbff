"""Running the server process: uvloop, signals, orderly shutdown."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
from pathlib import Path
from urllib.parse import urlsplit

import uvloop

from prorl_async.api.app import run_server
from prorl_async.api.connections import raise_nofile_limit
from prorl_async.config import ServerConfig
from prorl_async.store import StateDirBusy, StoreError

__all__ = ["serve", "serve_forever", "write_port_file"]

log = logging.getLogger("prorl_async")


async def serve_forever(config: ServerConfig, ready: asyncio.Event | None = None) -> None:
    """Serve until SIGTERM/SIGINT, then stop intake, cancel and release every job, return."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals = (signal.SIGTERM, signal.SIGINT)
    for sig in signals:
        # The handler only sets a flag; shutdown runs in order below.
        loop.add_signal_handler(sig, stop.set)
    try:
        async with run_server(config) as (_, url):
            log.info("prorl-async listening on %s (state dir %s)", url, config.state_dir)
            if config.port_file is not None:
                write_port_file(config.port_file, urlsplit(url).port or 0)
            if ready is not None:
                ready.set()
            await stop.wait()
            log.info("signal received: stopping")
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
    log.info("stopped cleanly")


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
    _tune_gc()
    # Connections, sandboxes, PTYs and kernels all take descriptors: 1,024 is not enough.
    log.info("open-file limit: %d", raise_nofile_limit())
    try:
        uvloop.run(serve_forever(config))
    except (StateDirBusy, StoreError) as exc:
        log.error("refusing to start: %s", exc)
        return 2
    return 0


def _tune_gc() -> None:
    # Thousands of live job records make full collections the main source of tail
    # latency; collect young objects less often and keep start-up objects out of it.
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
