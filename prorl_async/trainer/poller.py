"""One long-poll ``POST /poll`` loop per server, and the ``/healthz`` probe of a quarantined one."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from prorl_async.trainer.retry import Backoff, transport_class
from prorl_async.trainer.servers import ServerState

__all__ = ["PollHandlers", "poll_loop"]

POLL_WAIT_S = 5.0


class PollHandlers:
    """What the loop calls back into (the manager)."""

    def __init__(
        self,
        on_done: Callable[[ServerState, dict[str, Any]], None],
        on_lost: Callable[[ServerState, str], None],
        on_failure: Callable[[ServerState, BaseException], None],
        on_recovered: Callable[[ServerState], Any],
    ) -> None:
        self.on_done, self.on_lost = on_done, on_lost
        self.on_failure, self.on_recovered = on_failure, on_recovered


async def poll_loop(server: ServerState, handlers: PollHandlers, backoff: Backoff) -> None:
    """Collect this manager's results from ``server`` until cancelled."""
    while True:
        if server.quarantined:
            await _probe(server, backoff)
            await handlers.on_recovered(server)
            continue
        if not server.submitted():
            await _cancel_orphans(server)
            server.dirty.clear()
            if not server.submitted():
                await server.dirty.wait()
            continue
        try:
            out = await _poll_once(server)
        except Exception as exc:
            if transport_class(exc) is None:
                raise
            handlers.on_failure(server, exc)
            await asyncio.sleep(backoff.delay(server.failures, exc))
            continue
        if out is not None:
            server.transport_ok()
            _deliver(server, out, handlers)
        await _cancel_orphans(server)


def _deliver(server: ServerState, out: dict[str, Any], handlers: PollHandlers) -> None:
    for result in out.get("done") or ():
        handlers.on_done(server, result)
    for job_id in out.get("unknown") or ():
        handlers.on_lost(server, job_id)


async def _poll_once(server: ServerState) -> dict[str, Any] | None:
    """One long poll, abandoned (``None``) as soon as a new job lands on the server."""
    server.dirty.clear()
    ids = server.submitted()
    poll = asyncio.ensure_future(server.client.poll(ids, wait=POLL_WAIT_S))
    dirty = asyncio.ensure_future(server.dirty.wait())
    try:
        await asyncio.wait({poll, dirty}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (poll, dirty):
            if not task.done():
                task.cancel()
        await asyncio.wait({poll, dirty})
    if poll.cancelled():
        return None
    return poll.result()


async def _cancel_orphans(server: ServerState) -> None:
    """Best effort: jobs this manager gave up on (lost answers, deadlines) stop running."""
    if not server.orphans:
        return
    ids, server.orphans = sorted(server.orphans), set()
    try:
        await server.client.cancel(ids)
    except Exception as exc:
        # a server that cannot be reached has dropped (or will drop) them anyway
        if transport_class(exc) is None:
            raise


async def _probe(server: ServerState, backoff: Backoff) -> None:
    """Wait until ``/healthz`` answers again."""
    tries = 0
    while True:
        tries += 1
        await asyncio.sleep(backoff.delay(tries))
        try:
            await server.client.healthz()
        except Exception as exc:
            if transport_class(exc) is None:
                raise
            continue
        return
