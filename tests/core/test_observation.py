"""/status, /metrics, /healthz and /openapi.json."""

from __future__ import annotations

import aiohttp

from tests.blocking import BlockingHandler
from tests.helpers import ServerFactory, eventually

API_ROUTES = {
    "/process",
    "/process/batch",
    "/jobs/{job_id}",
    "/poll",
    "/cancel",
    "/add_llm_server",
    "/remove_llm_server",
    "/clear_llm_server",
    "/start",
    "/stop",
    "/status",
    "/workers",
    "/metrics",
    "/healthz",
    "/openapi.json",
    "/results",
    "/events",
    "/jobs/{job_id}/callback",
    "/weights",
    "/weights/pause",
    "/weights/resume",
    "/weights/load",
}


async def _get(url: str) -> tuple[int, str, dict[str, str]]:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return r.status, await r.text(), dict(r.headers)


async def test_status_shape(make_server: ServerFactory) -> None:
    async with make_server(init_workers=3, run_workers=5, eval_workers=2) as srv:
        st = await srv.client.status()
        assert set(st) >= {
            "state",
            "queues",
            "active",
            "workers",
            "jobs",
            "sandboxes",
            "poll_waiters",
            "backends",
        }
        assert st["state"] == "running"
        assert st["workers"] == {"init": 3, "run": 5, "eval": 2}
        assert st["queues"] == st["active"] == {"init": 0, "run": 0, "eval": 0}
        assert st["jobs"] == {"done": 0, "failed": 0, "cancelled": 0, "timed_out": 0}
        assert st["sandboxes"] == 0 and st["poll_waiters"] == 0 and st["backends"] == []


async def test_metrics_live_gauges_and_counters(
    make_server: ServerFactory, blocking: BlockingHandler
) -> None:
    async with make_server(init_workers=1) as srv:
        first = await srv.client.submit("blocking", {"block": ["init"]})
        await blocking.event(first, "init").wait()
        await srv.client.submit_batch([{"task": "blocking", "instance": {}}] * 3)
        await srv.client.submit("sleep", {"fail_in": "run"}, job_id="f1")
        status, text, headers = await _get(f"{srv.url}/metrics")
        assert status == 200 and headers["Content-Type"].startswith("text/plain")
        assert 'prorl_queue_depth{stage="init"} 4.0' in text
        assert 'prorl_active_jobs{stage="init"} 1.0' in text
        for name in (
            "prorl_jobs_total",
            "prorl_stage_seconds_bucket",
            "prorl_tool_seconds",
            "prorl_sandboxes 0.0",
            "prorl_poll_waiters 0.0",
            "prorl_backend_inflight",
        ):
            assert name in text
        blocking.release(first)
        await eventually(lambda: srv.service.store.unfinished_count() == 0)
        _, text, _ = await _get(f"{srv.url}/metrics")
        assert 'prorl_jobs_total{status="done"} 4.0' in text
        assert 'prorl_jobs_total{status="failed"} 1.0' in text
        assert 'prorl_stage_seconds_count{stage="init"} 5.0' in text


async def test_healthz_and_openapi(make_server: ServerFactory) -> None:
    async with make_server() as srv:
        status, _, _ = await _get(f"{srv.url}/healthz")
        assert status == 200
        async with aiohttp.ClientSession() as s, s.get(f"{srv.url}/openapi.json") as r:
            doc = await r.json()
        assert doc["openapi"].startswith("3.")
        assert set(doc["paths"]) == API_ROUTES
        schemas = doc["components"]["schemas"]
        assert set(schemas["ProcessRequest"]["properties"]) >= {
            "task",
            "instance",
            "sampling_params",
            "job_id",
            "timeout_s",
            "metadata",
        }
        assert schemas["ProcessRequest"]["required"] == ["task"]
        assert "response_logprobs" in schemas["ResultDoc"]["properties"]
        # every $ref resolves
        refs = _refs(doc)
        assert refs and all(r.split("/")[-1] in schemas for r in refs)


def _refs(node: object) -> list[str]:
    if isinstance(node, dict):
        out = [node["$ref"]] if "$ref" in node else []
        for v in node.values():
            out += _refs(v)
        return out
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []
