"""The dashboard's live state: one JSON snapshot per viewer, built at most once per
``REFRESH_S`` however many dashboards poll it (ten open dashboards cost one build a
second), and the throughput history its chart draws."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any

import msgspec

from prorl_async.api.ui.listing import Row, Rows
from prorl_async.schemas import StatusResponse
from prorl_async.service import RolloutService
from prorl_async.service.browse import ResultBrowser
from prorl_async.tenancy import Tenant

__all__ = ["REFRESH_S", "Dashboard", "Throughput"]

REFRESH_S = 1.0
RECENT = 15
_FAILED = ("failed", "timed_out")
_encoder = msgspec.json.Encoder()
# The chart's drawing box (SVG user units).
CHART_W, CHART_H = 300, 60


class Throughput:
    """Jobs ended per tenant, sampled every ``interval_s`` for ``keep`` samples."""

    def __init__(self, svc: RolloutService, interval_s: float = 2.0, keep: int = 150) -> None:
        self.svc, self.interval_s = svc, interval_s
        self.samples: deque[tuple[float, dict[str, tuple[int, int]]]] = deque(maxlen=keep)

    def sample(self) -> None:
        ended = self.svc.tenants.ended
        counts = {name: (c["done"], sum(c[s] for s in _FAILED)) for name, c in list(ended.items())}
        self.samples.append((time.monotonic(), counts))

    async def run(self) -> None:
        """Sample until cancelled (owned by the app's cleanup context)."""
        while True:
            self.sample()
            await asyncio.sleep(self.interval_s)

    def rates(self, tenants: list[str]) -> tuple[list[float], list[float]]:
        """Per interval: jobs done per second and failed per second, of ``tenants``."""
        done: list[float] = []
        failed: list[float] = []
        points = list(self.samples)
        for (t0, a), (t1, b) in zip(points, points[1:], strict=False):
            dt = max(t1 - t0, 1e-9)
            done.append(sum(b.get(n, (0, 0))[0] - a.get(n, (0, 0))[0] for n in tenants) / dt)
            failed.append(sum(b.get(n, (0, 0))[1] - a.get(n, (0, 0))[1] for n in tenants) / dt)
        return done, failed


def polyline(values: list[float], top: float) -> str:
    """SVG ``points`` of ``values`` scaled into the chart box (newest at the right)."""
    if not values:
        return ""
    step = CHART_W / max(len(values) - 1, 1)
    scale = CHART_H / top if top > 0 else 0.0
    return " ".join(f"{i * step:.1f},{CHART_H - v * scale:.1f}" for i, v in enumerate(values))


class Dashboard:
    """Builds and caches each viewer's snapshot (``snapshot``)."""

    def __init__(self, svc: RolloutService, browser: ResultBrowser, rows: Rows) -> None:
        self.svc, self.browser, self.rows = svc, browser, rows
        self.throughput = Throughput(svc)
        self._cache: dict[str, tuple[float, bytes, dict[str, Any]]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self.builds = 0

    async def snapshot(self, viewer: Tenant) -> tuple[bytes, dict[str, Any]]:
        """The viewer's snapshot as JSON bytes and as a dict (for the first render)."""
        key = "*" if viewer.admin else viewer.name
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:  # ten pollers at once: one builds, nine reuse it
            cached = self._cache.get(key)
            if cached is not None and time.monotonic() - cached[0] < REFRESH_S:
                return cached[1], cached[2]
            doc = await self._build(viewer)
            body = _encoder.encode(doc)
            self._cache[key] = (time.monotonic(), body, doc)
            self.builds += 1
            return body, doc

    async def _build(self, viewer: Tenant) -> dict[str, Any]:
        status = self.svc.status(viewer)
        tenants = self.browser.visible_tenants(viewer)
        recent = await self.rows.rows(self.browser.recent(viewer, None, RECENT))
        done, failed = self.throughput.rates(tenants)
        top = max([*done, *failed, 1.0])
        return {
            "state": status.state,
            "stages": _stages(status),
            "budget": _budget(status),
            "engines": self._engines(status, viewer),
            "weights": self._last_load() if viewer.admin else None,
            "tenants": _tenants(status),
            "totals": _totals(status, viewer),
            "chart": {
                "done": polyline(done, top),
                "failed": polyline(failed, top),
                "top": round(top, 2),
                "minutes": round(len(done) * self.throughput.interval_s / 60, 1),
                "rate": round(done[-1], 1) if done else 0.0,
            },
            "recent": [_row(r) for r in recent],
        }

    def _engines(self, status: StatusResponse, viewer: Tenant) -> list[dict[str, Any]]:
        paused = {}
        weights = self.browser.weights() if viewer.admin else None
        if weights is not None:
            paused = {w["address"]: w["paused"] for w in weights.snapshot()}
        return [
            {
                "address": b.address,
                "healthy": "yes" if b.healthy else "NO",
                "inflight": b.inflight,
                "weight_version": _text(b.weight_version),
                "paused": ("yes" if paused.get(b.address) else "no") if viewer.admin else "",
            }
            for b in status.backends
        ]

    def _last_load(self) -> dict[str, Any] | None:
        weights = self.browser.weights()
        loads = [w for w in (weights.snapshot() if weights else []) if w["loaded_at"]]
        if not loads:
            return None
        last = max(loads, key=lambda w: w["loaded_at"])
        return {
            "version": _text(last["weight_version"]),
            "path": last["weights_path"] or "",
            "at": time.strftime("%H:%M:%S", time.localtime(last["loaded_at"])),
            "load_s": last["last_load_s"],
            "engines": sum(1 for w in loads if w["loaded_at"] == last["loaded_at"]) or 1,
        }


def _text(value: object) -> str:
    return "" if value is None else str(value)


def _stages(status: StatusResponse) -> list[dict[str, Any]]:
    return [
        {
            "name": stage,
            "queued": status.queues.get(stage, 0),
            "active": status.active.get(stage, 0),
            "workers": status.workers.get(stage, 0),
            "busy": status.pools[stage].busy if stage in status.pools else 0,
        }
        for stage in ("init", "run", "eval")
    ]


def _budget(status: StatusResponse) -> dict[str, Any] | None:
    b = status.sandbox_budget
    if b is None:
        return None
    return {"max": _text(b.max), "live": b.live, "waiting": b.waiting, "peak": b.peak}


def _tenants(status: StatusResponse) -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            "inflight": t.inflight,
            "quota": _text(t.max_inflight) or "none",
            "done": t.jobs.get("done", 0),
            "failed": sum(t.jobs.get(s, 0) for s in _FAILED),
        }
        for name, t in sorted(status.tenants.items())
    ]


def _totals(status: StatusResponse, viewer: Tenant) -> dict[str, int]:
    ended: dict[str, int] = {}
    for name, t in status.tenants.items():
        if viewer.admin or name == viewer.name:
            for s, n in t.jobs.items():
                ended[s] = ended.get(s, 0) + n
    inflight = sum(t.inflight for t in status.tenants.values())
    failed = sum(ended.get(s, 0) for s in _FAILED)
    return {"done": ended.get("done", 0), "failed": failed, "inflight": inflight}


def _row(r: Row) -> dict[str, Any]:
    return {
        "job_id": r.job_id,
        "tenant": r.tenant,
        "task": r.task,
        "status": r.status,
        "reward": "" if r.reward is None else f"{r.reward:g}",
        "turns": r.turns,
        "duration": f"{r.duration_s:.2f} s",
    }
