"""The SQLite job store through real servers: submit bursts, retention, locks, bad files."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import sys
from pathlib import Path

import aiohttp
import msgspec

from prorl_async.client import RolloutClient
from prorl_async.store.sqlite import SqliteJobStore
from tests.blocking import BlockingHandler
from tests.helpers import ServerFactory, eventually, server_process

SLEEP0 = {"task": "sleep", "instance": {}}


async def _serve_fails(tmp_path: Path, *args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "prorl_async.cli",
        "serve",
        "--port",
        "0",
        "--state-dir",
        str(tmp_path / "state"),
        *args,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(30):
        _, err = await proc.communicate()
    return proc.returncode or 0, err.decode()


async def _submitter(
    session: aiohttp.ClientSession, url: str, acked: list[str], stop: asyncio.Event
) -> None:
    while not stop.is_set():
        try:
            async with session.post(f"{url}/process", json=SLEEP0) as r:
                if r.status == 202:
                    acked.append((await r.json())["job_id"])
        except (aiohttp.ClientError, ConnectionError):
            return  # the server is gone


async def test_every_acknowledged_submit_survives_kill9(tmp_path: Path) -> None:
    acked: list[str] = []
    stop = asyncio.Event()
    async with server_process(tmp_path, {}) as (proc, url), aiohttp.ClientSession() as s:
        workers = [asyncio.create_task(_submitter(s, url, acked, stop)) for _ in range(16)]
        await eventually(lambda: len(acked) >= 400, timeout=60)
        proc.kill()  # mid-burst: submits are in every phase of their request
        await proc.wait()
        stop.set()
        await asyncio.gather(*workers)
    async with server_process(tmp_path, {}) as (_, url), RolloutClient(url) as client:
        out = await client.poll(acked, wait=0)
        assert out["unknown"] == []
        assert len(out["done"]) + len(out["pending"]) == len(acked)


async def test_results_idempotency_and_tombstones_survive_sigterm_restart(
    tmp_path: Path,
) -> None:
    async with server_process(tmp_path, {}) as (proc, url), RolloutClient(url) as client:
        done = await client.submit("sleep", {}, job_id="keep-done")
        assert (await client.result(done, wait=10) or {})["status"] == "done"
        await client.submit("sleep", {"run_s": 600}, job_id="was-cancelled")
        await client.cancel("was-cancelled")
        await client.submit("sleep", {"run_s": 0.5}, job_id="was-running")
        proc.send_signal(signal.SIGTERM)  # graceful: running jobs stay unfinished on disk
        assert await proc.wait() == 0
    async with server_process(tmp_path, {}) as (_, url), RolloutClient(url) as client:
        assert await client.submit("sleep", {}, job_id="keep-done") == "keep-done"
        assert (await client.result("keep-done") or {})["restarts"] == 0
        assert (await client.result("was-cancelled") or {})["status"] == "cancelled"
        await client.submit("sleep", {}, job_id="was-cancelled")  # stays cancelled
        assert (await client.result("was-cancelled") or {})["status"] == "cancelled"
        again = await client.result("was-running", wait=20) or {}
        assert again["status"] == "done" and again["restarts"] == 1
        st = await client.status()
        assert st["store"]["kind"] == "sqlite" and st["store"]["rows"] == 3
        assert st["store"]["bytes"] > 0


async def test_an_answer_that_a_job_ended_waits_for_its_commit(
    make_server: ServerFactory, blocking: BlockingHandler, tmp_path: Path
) -> None:
    """A cancel's answer, and a result served by /poll or GET /jobs/{id}, come only once the
    job's end is committed: a kill -9 after the answer cannot requeue a job its client was
    told is cancelled, nor rerun one whose result it already read. The writer process is
    stopped (SIGSTOP) while both jobs end, so nothing can commit until it is continued."""
    async with make_server() as srv:
        store, client = srv.service.store, srv.client
        for job_id in ("to-cancel", "to-finish"):
            await client.submit("blocking", {"block": ["run"]}, job_id=job_id)
        async with asyncio.timeout(30):
            await blocking.event("to-cancel", "run").wait()
            await blocking.event("to-finish", "run").wait()
        assert isinstance(store, SqliteJobStore)
        writer = store._writer
        assert writer is not None
        os.kill(writer.pid, signal.SIGSTOP)
        try:
            cancel = asyncio.create_task(client.cancel("to-cancel"))
            blocking.release("to-finish")
            ended = {"to-cancel": "cancelled", "to-finish": "done"}
            await eventually(lambda: all(store.status(j) == s for j, s in ended.items()), 30)
            poll = asyncio.create_task(client.poll(["to-finish"], wait=0))
            get = asyncio.create_task(client.result("to-finish"))
            # Both jobs ended in memory; no answer may leave before the writer commits.
            answered, _ = await asyncio.wait({cancel, poll, get}, timeout=1.0)
            assert not answered, [t.result() for t in answered]
        finally:
            os.kill(writer.pid, signal.SIGCONT)
        async with asyncio.timeout(30):
            assert (await cancel)["cancelled"] == ["to-cancel"]
            assert [d["job_id"] for d in (await poll)["done"]] == ["to-finish"]
            assert ((await get) or {})["status"] == "done"
        with sqlite3.connect(tmp_path / "state" / "jobs.sqlite3") as conn:
            rows = dict(conn.execute("SELECT id, status FROM jobs").fetchall())
        assert rows == ended


async def test_retention_deletes_rows_and_the_file_stays_bounded(
    make_server: ServerFactory, tmp_path: Path
) -> None:
    db = tmp_path / "state" / "jobs.sqlite3"
    sizes: list[int] = []
    async with make_server(retention_s=0.3, max_batch=5000) as srv:
        for _ in range(10):  # 50,000 jobs in batches; results expire 0.3 s after finishing
            await srv.client.submit_batch([SLEEP0] * 5000)
            await eventually(lambda: srv.service.store.unfinished_count() == 0, timeout=60)
            sizes.append(srv.service.store.stats().bytes)
        await eventually(lambda: len(srv.service.store) == 0, timeout=10)
        await srv.service.store.sync()
        with sqlite3.connect(db) as conn:
            assert conn.execute("SELECT count(*) FROM jobs").fetchone() == (0,)
        metrics = await _text(f"{srv.url}/metrics")
        assert "prorl_store_rows 0.0" in metrics and "prorl_store_bytes " in metrics
    # Freed pages are reused: the last batches do not grow the file past the early ones.
    assert max(sizes[5:]) <= 1.5 * max(sizes[:5]), sizes


async def _text(url: str) -> str:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return await r.text()


async def test_memory_store_keeps_nothing_across_restart(tmp_path: Path) -> None:
    async with server_process(tmp_path, {}, "--store", "memory") as (proc, url):
        async with RolloutClient(url) as client:
            job_id = await client.submit("sleep", {})
            await client.result(job_id, wait=10)
            assert (await client.status())["store"]["kind"] == "memory"
    async with server_process(tmp_path, {}, "--store", "memory") as (_, url):
        async with RolloutClient(url) as client:
            assert (await client.poll([job_id]))["unknown"] == [job_id]
    assert not (tmp_path / "state" / "jobs.sqlite3").exists()


async def test_second_server_on_a_state_dir_refuses(tmp_path: Path) -> None:
    async with server_process(tmp_path, {}) as (proc, url):
        code, err = await _serve_fails(tmp_path)
        assert code == 2
        assert f"pid {proc.pid}" in err and url in err and "in use" in err
        async with RolloutClient(url) as client:  # the first one is untouched
            assert (await client.status())["state"] == "running"


async def test_corrupt_database_refuses_then_reset_state_sets_it_aside(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    db = state / "jobs.sqlite3"
    garbage = b"this is not a database" * 300
    db.write_bytes(garbage)
    code, err = await _serve_fails(tmp_path)
    assert code == 2 and str(db) in err and "--reset-state" in err
    assert db.read_bytes() == garbage  # never deleted or rewritten
    async with server_process(tmp_path, {}, "--reset-state") as (_, url):
        async with RolloutClient(url) as client:
            await client.result(await client.submit("sleep", {}), wait=10)
    aside = [p for p in state.iterdir() if p.name.startswith("jobs.sqlite3.")]
    assert [p.read_bytes() for p in aside if not p.name.endswith(("-wal", "-shm"))] == [garbage]


async def test_result_cache_is_bounded_and_misses_read_the_file(make_server: ServerFactory) -> None:
    big = {"task": "sleep", "instance": {"result_tokens": 4096}}  # ~70 KB result documents
    async with make_server(result_cache_bytes=200_000) as srv:
        ids = await srv.client.submit_batch([big] * 12)
        async with aiohttp.ClientSession() as s:
            first = {}
            for job_id in ids:
                async with s.get(f"{srv.url}/jobs/{job_id}?wait=20") as r:
                    assert r.status == 200
                    first[job_id] = await r.read()
            st = (await srv.client.status())["store"]
            assert 0 < st["cache_bytes"] <= 200_000 < sum(len(b) for b in first.values())
            for job_id in ids:  # the early ones were evicted: read back from the file
                async with s.get(f"{srv.url}/jobs/{job_id}") as r:
                    assert await r.read() == first[job_id]
        assert len(msgspec.json.decode(first[ids[0]])["prompt_ids"]) == 2048
