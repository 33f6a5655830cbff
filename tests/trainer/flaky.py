"""TEST DOUBLE: an HTTP proxy in front of a rollout server that injects transport failures.

A seeded fraction of requests is answered ``503`` with ``Retry-After: 0`` before reaching the
server, and another fraction is forwarded and then has its connection dropped with no
answer (the server did the work; the client cannot know), as a flaky network would.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
from aiohttp import web


class FlakyProxy:
    def __init__(self, target: str, error_rate: float, drop_rate: float, seed: int = 0) -> None:
        self.target = target.rstrip("/")
        self.error_rate, self.drop_rate = error_rate, drop_rate
        self.rng = random.Random(seed)
        self.injected: Counter[str] = Counter()
        self.url = ""
        self.session: aiohttp.ClientSession | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        x = self.rng.random()
        if x < self.error_rate and request.path != "/healthz":
            self.injected["503"] += 1
            return web.json_response(
                {"type": "about:blank", "title": "injected", "status": 503, "detail": "flaky"},
                status=503,
                headers={"Retry-After": "0"},
            )
        body = await request.read()
        assert self.session is not None
        session = self.session
        headers = {k: v for k, v in request.headers.items() if k.lower() != "host"}
        async with session.request(
            request.method, self.target + request.path_qs, data=body, headers=headers
        ) as resp:
            payload = await resp.read()
            status, ctype = resp.status, resp.headers.get("Content-Type", "application/json")
        if x < self.error_rate + self.drop_rate:
            self.injected["drop"] += 1
            assert request.transport is not None
            request.transport.abort()
            raise web.HTTPServiceUnavailable()  # never reaches the client: the socket is gone
        return web.Response(body=payload, status=status, headers={"Content-Type": ctype})


@asynccontextmanager
async def flaky_proxy(
    target: str, error_rate: float, drop_rate: float, seed: int = 0
) -> AsyncIterator[FlakyProxy]:
    proxy = FlakyProxy(target, error_rate, drop_rate, seed)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", proxy.handle)
    async with aiohttp.ClientSession() as session:
        proxy.session = session
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        proxy.url = f"http://127.0.0.1:{port}"
        try:
            yield proxy
        finally:
            await runner.cleanup()
