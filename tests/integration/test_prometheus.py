"""A real Prometheus scrapes a running server and answers queries about its queues."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from tests.blocking import BlockingHandler
from tests.conftest import require
from tests.helpers import ServerFactory, free_port


async def _query(session: aiohttp.ClientSession, prom: str, expr: str) -> list[dict[str, Any]]:
    async with session.get(f"{prom}/api/v1/query", params={"query": expr}) as r:
        if r.status != 200:
            return []
        body = await r.json()
        return list(body["data"]["result"])


async def test_prometheus_reads_queue_depth(
    tmp_path: Path, make_server: ServerFactory, blocking: BlockingHandler
) -> None:
    binary = shutil.which("prometheus")
    require(binary is not None, "prometheus is not installed (apt-get install prometheus)")
    assert binary is not None
    # Tokens configured: Prometheus scrapes with the scrape token (its credentials_file),
    # as an operator's config would (docs/config.md, "Metrics").
    scrape = tmp_path / "scrape-token"
    scrape.write_text("scrape-s3cret\n")
    scrape.chmod(0o600)
    async with make_server(
        init_workers=1, token="admin-s3cret", metrics_token_file=str(scrape)
    ) as srv:
        blocker = await srv.client.submit("blocking", {"block": ["init"]})
        await blocking.event(blocker, "init").wait()
        await srv.client.submit_batch([{"task": "blocking", "instance": {}}] * 3)
        target = urlsplit(srv.url).netloc
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            f"- job_name: prorl\n  static_configs: [{{targets: ['{target}']}}]\n"
            f"  authorization: {{credentials_file: '{scrape}'}}\n"
        )
        port = free_port()
        proc = await asyncio.create_subprocess_exec(
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        try:
            prom = f"http://127.0.0.1:{port}"
            expr = 'prorl_queue_depth{stage="init"}'
            async with aiohttp.ClientSession() as session, asyncio.timeout(90):
                result: list[dict[str, Any]] = []
                while not result:
                    # Prometheus has no push notification for a first sample: re-query.
                    await asyncio.sleep(0.25)
                    try:
                        result = await _query(session, prom, expr)
                    except aiohttp.ClientConnectionError:
                        assert proc.returncode is None, "prometheus exited"
                assert float(result[0]["value"][1]) == 3.0
                assert result[0]["metric"]["job"] == "prorl"
                active = await _query(session, prom, 'prorl_active_jobs{stage="init"}')
                assert active and float(active[0]["value"][1]) == 1.0
        finally:
            proc.terminate()
            await proc.wait()
        blocking.release(blocker)
