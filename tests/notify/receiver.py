"""TEST DOUBLE: an HTTP receiver of callbacks that records what it gets and answers as told."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web

from prorl_async.notify import SIGNATURE_HEADER, verify


class Receiver:
    def __init__(self, secret: bytes) -> None:
        self.secret = secret
        self.status = 200
        self.posts: list[tuple[str, bytes, bool, int]] = []  # job id, body, signed, answered

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        signed = verify(self.secret, body, request.headers.get(SIGNATURE_HEADER, ""))
        self.posts.append((request.headers["X-Prorl-Job-Id"], body, signed, self.status))
        return web.Response(status=self.status)

    def delivered(self) -> dict[str, bytes]:
        """Job id -> body of the deliveries answered 2xx."""
        return {job: body for job, body, _, status in self.posts if status < 300}


@asynccontextmanager
async def receiver(secret: bytes, port: int = 0) -> AsyncIterator[tuple[Receiver, int]]:
    rec = Receiver(secret)
    app = web.Application()
    app.router.add_post("/hook", rec.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, reuse_address=True)
    await site.start()
    bound: int = runner.addresses[0][1]
    try:
        yield rec, bound
    finally:
        await runner.cleanup()
