"""Never hang: per-sample deadlines, the stall report, and cancelling jobs on servers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from prorl_async.trainer.retry import transport_class

if TYPE_CHECKING:
    from prorl_async.trainer.dispatch import Dispatcher
    from prorl_async.trainer.registry import GroupState, Registry
    from prorl_async.trainer.servers import ServerPool

__all__ = ["cancel_on_servers", "expired_groups", "stall_report"]


def expired_groups(reg: Registry, deadline_s: float, now: float) -> list[GroupState]:
    """Groups with a sample submitted more than ``deadline_s`` ago and still unanswered."""
    late = {
        s.group.uid: s.group
        for s in reg.by_job.values()
        if s.submitted_at and now - s.submitted_at > deadline_s
    }
    return list(late.values())


def stall_report(
    dispatcher: Dispatcher, stall_timeout_s: float, loop_lag_ms: dict[str, float]
) -> dict[str, Any]:
    """What the manager waits for: which servers, which samples (oldest first)."""
    now = time.monotonic()
    servers = {
        s.url: {"inflight": len(s.inflight), "quarantined": s.quarantined, "errors": s.stats.errors}
        for s in dispatcher.pool
    }
    samples = dispatcher.reg.diagnosis(now)
    down = [u for u, s in servers.items() if s["quarantined"]]
    running = dispatcher.pool.inflight
    message = (
        f"no rollout result for {stall_timeout_s:.0f} s: {len(dispatcher.ready)} of "
        f"{dispatcher.cfg.batch_groups} groups ready; waiting for {running} samples on servers "
        f"and {len(dispatcher.reg.pending)} without a server yet, "
        f"{len(dispatcher.reg.groups)} groups running, {len(dispatcher.resubmit)} to regenerate"
        + (f"; quarantined servers: {', '.join(down)}" if down else "")
        + (f"; oldest sample {samples[0]['job_id']} on {samples[0]['server']}" if samples else "")
    )
    return {"message": message, "servers": servers, "samples": samples, "loop_lag_ms": loop_lag_ms}


async def cancel_on_servers(
    pool: ServerPool, ids: Mapping[str, str | None]
) -> list[dict[str, Any]]:
    """``POST /cancel`` the jobs on their servers; returns their (cancelled) result documents."""
    by_server: dict[str, list[str]] = {}
    for job_id, url in ids.items():
        if url is not None:
            by_server.setdefault(url, []).append(job_id)
    found = await asyncio.gather(
        *(_cancel(pool.servers[u], jobs) for u, jobs in by_server.items() if u in pool.servers)
    )
    return [r for results in found for r in results]


async def _cancel(server: Any, job_ids: list[str]) -> list[dict[str, Any]]:
    try:
        await server.client.cancel(job_ids)
        out = await server.client.poll(job_ids, wait=0)
    except Exception as exc:
        if transport_class(exc) is None:
            raise
        # its poll loop cancels them later: a restart requeues them, a 503 left them running
        server.orphans.update(job_ids)
        return []
    except asyncio.CancelledError:  # cut short (the manager closing): close cancels orphans
        server.orphans.update(job_ids)
        raise
    return list(out.get("done") or [])
