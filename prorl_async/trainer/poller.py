"""One loop per server reading this manager's results by cursor (``GET /results``), and
the ``/healthz`` probe of a quarantined server.

The server's result log is durable and read in ``seq`` order, so one long-poll per
server answers for every job of this manager's token there, however many are in
flight, and a read that fails loses nothing: the next one resumes from the same cursor.
The cursor starts at the server's last seq when the manager opens (``sync``), so only
jobs that end later arrive; results of jobs this manager does not hold (another
manager on the same token) are ignored by the dispatcher. What a cursor cannot show is a
job the server forgot (restarted with the memory store, or expired before it was
read): a ``POST /poll`` sweep of the ids in flight finds those, when the server's log
epoch changes, when the cursor is older than retention (410), and every ``SWEEP_S``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from prorl_async.client import GoneError
from prorl_async.trainer.retry import Backoff, transport_class
from prorl_async.trainer.servers import ServerState

__all__ = ["PollHandlers", "poll_loop", "sync"]

POLL_WAIT_S = 5.0
SWEEP_S = 60.0
_LIMIT = 1000


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


def sync(server: ServerState, status: dict[str, Any]) -> None:
    """Start reading after the last result ``server`` had (its ``/status``)."""
    server.cursor = int(status.get("last_seq") or 0)
    server.epoch = str(status.get("epoch") or "")
    server.swept = time.monotonic()


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
            if not server.submitted() and not server.quarantined:
                await server.dirty.wait()
            continue
        try:
            await _read(server, handlers)
        except Exception as exc:
            if transport_class(exc) is None:
                raise
            handlers.on_failure(server, exc)
            await asyncio.sleep(backoff.delay(server.failures, exc))
            continue
        await _cancel_orphans(server)


async def _read(server: ServerState, handlers: PollHandlers) -> None:
    """One long poll of the cursor (after a sweep, when one is due)."""
    if server.epoch is None:  # never reached at open: start from its present
        sync(server, await server.client.status())
    if time.monotonic() - server.swept > SWEEP_S:
        await _sweep(server, handlers)
    try:
        out = await _long_poll(server)
    except GoneError as exc:  # results past retention were never read: find what is lost
        server.cursor = max(exc.oldest_seq - 1, 0)
        await _sweep(server, handlers)
        return
    if out is None:
        return  # jobs to cancel came up: the loop cancels them, then reads again
    server.transport_ok()
    for result in out.get("results") or ():
        handlers.on_done(server, result)
    if out.get("epoch") != server.epoch:
        # A new log (a restart that kept nothing): its numbering starts over.
        server.epoch, server.cursor = out.get("epoch"), 0
        await _sweep(server, handlers)
    else:
        server.cursor = int(out["next"])


async def _long_poll(server: ServerState) -> dict[str, Any] | None:
    """One read of the cursor, abandoned (``None``; the cursor stays, nothing is lost) as
    soon as this manager gives up on a job there, so it is cancelled at once."""
    read = asyncio.ensure_future(
        server.client.results(server.cursor, limit=_LIMIT, wait=POLL_WAIT_S)
    )
    dirty: asyncio.Future[Any] | None = None
    try:
        while True:
            server.dirty.clear()
            dirty = asyncio.ensure_future(server.dirty.wait())
            await asyncio.wait({read, dirty}, return_when=asyncio.FIRST_COMPLETED)
            if read.done():
                out: dict[str, Any] = read.result()
                return out
            if server.orphans:
                return None
    finally:
        for task in (read, dirty):
            if task is not None and not task.done():
                task.cancel()
        await asyncio.wait([t for t in (read, dirty) if t is not None])


async def _sweep(server: ServerState, handlers: PollHandlers) -> None:
    """``POST /poll`` the ids in flight: results the cursor missed, and forgotten jobs."""
    server.swept = time.monotonic()
    ids = server.submitted()
    if not ids:
        return
    out = await server.client.poll(ids, wait=0)
    for result in out.get("done") or ():
        handlers.on_done(server, result)
    for job_id in out.get("unknown") or ():
        handlers.on_lost(server, job_id)


async def _cancel_orphans(server: ServerState) -> None:
    """Best effort: jobs this manager gave up on (lost answers, deadlines) stop running."""
    if not server.orphans:
        return
    ids, server.orphans = sorted(server.orphans), set()
    try:
        await server.client.cancel(ids)
    except Exception as exc:
        if transport_class(exc) is None:
            raise
        # not gone with the server: a restart requeues them, a 503 left them running
        server.orphans.update(ids)
    except asyncio.CancelledError:
        # the poll loop stopped mid-call (the manager closing): the request may never
        # have gone out, and close cancels whatever is still an orphan
        server.orphans.update(ids)
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
