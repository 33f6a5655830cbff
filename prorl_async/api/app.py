"""The aiohttp application and a ``run_server`` context manager for it."""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web

from prorl_async.api.access import add_routes
from prorl_async.api.connections import ConnectionGuard, clamp_connections
from prorl_async.api.events import event_routes, register_events
from prorl_async.api.problems import MAX_BODY
from prorl_async.api.routes import SERVICE, routes
from prorl_async.api.ui import register_ui, ui_routes
from prorl_async.api.weights import weight_routes
from prorl_async.config import ServerConfig
from prorl_async.core.handler import HandlerRegistry
from prorl_async.service import RolloutService

__all__ = ["CONNECTIONS", "build_app", "run_server"]

log = logging.getLogger(__name__)

CONNECTIONS = web.AppKey("connections", ConnectionGuard)


def build_app(config: ServerConfig, registry: HandlerRegistry | None = None) -> web.Application:
    """The web application; app-wide resources live in one cleanup context."""
    # No middlewares: every route is guarded on its own (api/access.py says why).
    app = web.Application(client_max_size=config.max_body_bytes)
    app[MAX_BODY] = config.max_body_bytes
    service = RolloutService(config, registry)
    app[SERVICE] = service
    app[CONNECTIONS] = ConnectionGuard(
        max_connections=clamp_connections(config.max_connections),
        read_timeout_s=config.read_timeout_s,
        keepalive_timeout=config.keepalive_s,
        # Unread bodies are drained this long before close, no longer than a read may take.
        lingering_time=min(10.0, config.read_timeout_s),
        access_log=None,
    )
    # /results, /events and /jobs/{job_id}/callback are event_routes.
    tables = (routes, weight_routes, event_routes)
    # The web pages (/ui/) take a login cookie, not a bearer token.
    add_routes(
        app, service.tenants, tables, scrape_token=config.metrics_token, session_tables=[ui_routes]
    )
    register_events(app)
    app.cleanup_ctx.append(_service_ctx)
    register_ui(app, service)  # after the service's context: its sampler stops first
    return app


async def _service_ctx(app: web.Application) -> AsyncIterator[None]:
    async with app[SERVICE].running():
        yield


def _bind(host: str, port: int) -> socket.socket:
    # host may be an IPv4/IPv6 literal or a name (a Slurm NodeAddr can be either).
    family, *_, addr = socket.getaddrinfo(
        host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


@asynccontextmanager
async def run_server(
    config: ServerConfig, registry: HandlerRegistry | None = None
) -> AsyncIterator[tuple[web.Application, str]]:
    """Serve on ``config.host:config.port`` (port 0 picks a free one); yields (app, base URL).

    On exit: stop intake, cancel and release every job, close the listener.
    """
    app = build_app(config, registry)
    # A client that goes away mid-poll must cancel its handler so no waiter is left.
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    try:
        sock = _bind(config.host, config.port)
        try:
            listener = await _listen(runner, sock)
        except BaseException:
            sock.close()
            raise
        try:
            host, port = sock.getsockname()[:2]
            url_host = f"[{host}]" if ":" in host else host
            url = f"http://{url_host}:{port}"
            app[SERVICE].announce(url)
            yield app, url
        finally:
            listener.close()  # stop intake; the runner then closes the connections
    finally:
        await _cleanup(runner)


async def _cleanup(runner: web.AppRunner) -> None:
    # Each cleanup context re-raises a cancellation of the task running it; aiohttp
    # gathers several into one CleanupError, which must stay a cancellation.
    try:
        await runner.cleanup()
    except web.CleanupError as exc:
        errors = exc.args[1] if len(exc.args) > 1 else []
        if errors and all(isinstance(e, asyncio.CancelledError) for e in errors):
            raise asyncio.CancelledError from exc
        raise


async def _listen(runner: web.AppRunner, sock: socket.socket) -> asyncio.Server:
    # Our own listener rather than a web.SockSite, so each connection gets a guarded handler.
    assert runner.server is not None
    factory = functools.partial(runner.app[CONNECTIONS].connect, runner.server)
    return await asyncio.get_running_loop().create_server(factory, sock=sock, backlog=1024)
