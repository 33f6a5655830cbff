"""Faults of the machine under a real server process: its state dir's disk fills up (a
small tmpfs in a private mount namespace), its job-store writer stops (SIGSTOP) or dies
(SIGKILL). Each answer is bounded and clear, and nothing acknowledged is lost."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import re
import shutil
import signal
import sqlite3
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.helpers import ServedProcess, eventually, served
from tests.proctree import cmdline, descendants

COMMIT_TIMEOUT_S = 2.0
# The bound on an answer during a fault: the timeout plus 5 s.
BOUND_S = COMMIT_TIMEOUT_S + 5.0
PAD = "x" * 16_384  # metadata that makes each accepted row fill WAL pages


def _serve(
    state: Path, *args: str, prefix: tuple[str, ...] = ()
) -> contextlib.AbstractAsyncContextManager[ServedProcess]:
    return served(state, "--commit-timeout-s", str(COMMIT_TIMEOUT_S), *args, prefix=prefix)


def _writer_pid(server: ServedProcess) -> int:
    found = [p for p in descendants(server.proc.pid) if "_commit.py" in cmdline(p)]
    assert len(found) == 1, [cmdline(p) for p in descendants(server.proc.pid)]
    return found[0]


def _sleep_job(job_id: str, **stages: float) -> dict[str, Any]:
    return {"task": "sleep", "instance": stages, "job_id": job_id, "metadata": {"pad": PAD}}


async def _submit(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any]
) -> tuple[int, dict[str, Any], dict[str, str]]:
    async with asyncio.timeout(BOUND_S):  # the bound: an answer, never a wait
        async with http.post(f"{url}/process", json=body) as r:
            return r.status, await r.json(content_type=None), dict(r.headers)


async def _get(http: aiohttp.ClientSession, url: str, path: str) -> tuple[int, Any]:
    async with asyncio.timeout(BOUND_S):
        async with http.get(url + path) as r:
            if r.content_type == "text/plain":
                return r.status, await r.text()
            return r.status, await r.json(content_type=None)


def _metric(text: str, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", text, flags=re.M)
    assert found, f"{name} not in /metrics"
    return float(found.group(1))


async def _drain(http: aiohttp.ClientSession, url: str, ids: list[str]) -> dict[str, Any]:
    """Every result of ``ids`` (each must be known), by long-polls (bounded)."""
    docs: dict[str, Any] = {}
    pending = list(ids)
    async with asyncio.timeout(60):
        while pending:
            async with http.post(f"{url}/poll", json={"job_ids": pending, "wait": 5}) as r:
                assert r.status == 200, await r.text()
                out = await r.json()
            assert out["unknown"] == [], out["unknown"]
            docs.update({d["job_id"]: d for d in out["done"]})
            pending = out["pending"]
    return docs


def _integrity(db: Path) -> str:
    assert db.exists(), db
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])


# -- a small disk in a private mount namespace ---------------------------------------------


@dataclass
class _Disk:
    holder: asyncio.subprocess.Process
    inside: Path  # the state dir as the server sees it
    outside: Path  # the same, reached from this process through /proc/<holder>/root

    def enter(self) -> tuple[str, ...]:
        """The prefix that runs a command in the holder's mount namespace."""
        pid = str(self.holder.pid)
        if os.geteuid() == 0:
            return ("nsenter", "-t", pid, "-m")
        return ("nsenter", "-t", pid, "-U", "-m", "--preserve-credentials")

    def fill(self) -> int:
        """Take every free byte of the disk with a file; returns its size."""
        chunk = b"\0" * (1 << 20)
        size = 0
        with open(self.outside / "filler", "wb", buffering=0) as f:
            try:
                while True:
                    size += f.write(chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
        with contextlib.suppress(OSError):  # the last partial block, too
            with open(self.outside / "filler2", "wb", buffering=0) as f:
                for _ in range(1 << 12):
                    size += f.write(b"\0" * 4096)
        return size

    def free(self) -> None:
        for name in ("filler", "filler2"):
            with contextlib.suppress(FileNotFoundError):
                (self.outside / name).unlink()


@contextlib.asynccontextmanager
async def _small_disk(tmp_path: Path, megabytes: int = 16) -> AsyncIterator[_Disk]:
    """A ``megabytes`` tmpfs mounted on ``tmp_path/state`` in a mount namespace of its own,
    held by a ``sleep`` (a killed server does not take the disk with it)."""
    if shutil.which("unshare") is None or shutil.which("nsenter") is None:
        pytest.skip("needs unshare and nsenter (util-linux) for a private mount namespace")
    state = tmp_path / "state"
    state.mkdir()
    unshare = ("unshare", "-m") if os.geteuid() == 0 else ("unshare", "-r", "-m")
    script = f'mount -t tmpfs -o size={megabytes}m tmpfs "$0" && echo mounted && exec sleep 3600'
    holder = await asyncio.create_subprocess_exec(
        *unshare,
        "sh",
        "-c",
        script,
        str(state),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stderr is not None
        async with asyncio.timeout(30):
            said = await holder.stdout.readline()
        if said.strip() != b"mounted":
            await holder.wait()
            why = (await holder.stderr.read()).decode().strip()
            pytest.skip(f"cannot mount a tmpfs in a private mount namespace here: {why}")
        yield _Disk(holder, state, Path(f"/proc/{holder.pid}/root") / state.relative_to("/"))
    finally:
        if holder.returncode is None:
            holder.kill()
        await holder.wait()


# -- the tests -------------------------------------------------------------------------------


async def test_a_full_disk_answers_507_keeps_every_acknowledged_job_and_recovers(
    tmp_path: Path,
) -> None:
    async with _small_disk(tmp_path) as disk, aiohttp.ClientSession() as http:
        async with _serve(disk.inside, prefix=disk.enter()) as server:
            url = server.url
            early = [f"early-{i}" for i in range(3)]
            for job_id in early:
                assert (await _submit(http, url, _sleep_job(job_id)))[0] == 202
            await _drain(http, url, early)
            # In flight across the fault: they end while the disk is full.
            running = [f"running-{i}" for i in range(4)]
            for job_id in running:
                assert (await _submit(http, url, _sleep_job(job_id, run_s=2.0)))[0] == 202
            acked = early + running
            disk.fill()
            answer: tuple[int, dict[str, Any], dict[str, str]] | None = None
            for i in range(400):  # until a commit needs a page the disk no longer has
                status, body, headers = await _submit(http, url, _sleep_job(f"late-{i}"))
                if status == 202:
                    acked.append(body["job_id"])
                    continue
                answer = (status, body, headers)
                break
            assert answer is not None, "no submit was refused on a full disk"
            status, body, headers = answer
            assert status == 507, body
            assert int(headers["Retry-After"]) >= 1
            assert str(disk.inside) in body["detail"] and "free" in body["detail"], body
            assert body["cause"] == "storage"
            # Refused at once from now on, and nothing was created for the refused one.
            status, body, _ = await _submit(http, url, _sleep_job("refused"))
            assert status == 507, body
            # Reads of committed jobs go on.
            for job_id in early:
                status, doc = await _get(http, url, f"/jobs/{job_id}")
                assert status == 200 and doc["status"] == "done", doc
            status, health = await _get(http, url, "/healthz")
            assert status == 503 and "cannot write" in health["detail"], health

            async def running_ended() -> bool:
                return bool((await _get(http, url, "/status"))[1]["jobs"]["done"] >= len(acked))

            await eventually(running_ended, timeout=30, what="the running jobs to end")
            _, metrics = await _get(http, url, "/metrics")
            assert _metric(metrics, "prorl_store_unavailable") == 1.0
            assert _metric(metrics, "prorl_store_errors_total") >= 1.0
            assert _metric(metrics, "prorl_store_free_bytes") < 1 << 20
            # The loop served throughout: it never waited for the disk.
            lag = _metric(metrics, "prorl_loop_lag_seconds")
            assert lag < COMMIT_TIMEOUT_S

            disk.free()

            async def healthy() -> bool:
                return (await _get(http, url, "/healthz"))[0] == 200

            await eventually(healthy, timeout=30, what="/healthz 200 after space was freed")
            assert (await _submit(http, url, _sleep_job("refused")))[0] == 202  # created now
            docs = await _drain(http, url, [*acked, "refused"])
            assert {d["status"] for d in docs.values()} == {"done"}
            _, metrics = await _get(http, url, "/metrics")
            assert _metric(metrics, "prorl_store_unavailable") == 0.0
            server.proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(60):
                assert await server.proc.wait() == 0
        assert _integrity(disk.outside / "jobs.sqlite3") == "ok"


async def test_kill_9_on_a_full_disk_loses_nothing_acknowledged(tmp_path: Path) -> None:
    async with _small_disk(tmp_path) as disk, aiohttp.ClientSession() as http:
        acked: list[str] = []
        async with _serve(disk.inside, prefix=disk.enter()) as server:
            url = server.url
            writer = _writer_pid(server)
            for i in range(3):
                status, body, _ = await _submit(http, url, _sleep_job(f"running-{i}", run_s=1))
                assert status == 202
                acked.append(body["job_id"])
            disk.fill()
            for i in range(400):
                status, body, _ = await _submit(http, url, _sleep_job(f"late-{i}"))
                if status != 202:
                    break
                acked.append(body["job_id"])
            assert status == 507, body

            async def ended() -> bool:
                return bool((await _get(http, url, "/status"))[1]["jobs"]["done"] >= len(acked))

            await eventually(ended, timeout=30, what="the jobs to end (results held)")
            server.proc.kill()
            await server.proc.wait()
            # The writer reads the end of its input, tries once more, and exits.
            await eventually(lambda: not os.path.exists(f"/proc/{writer}"), timeout=30)
        assert _integrity(disk.outside / "jobs.sqlite3") == "ok"
        disk.free()
        async with _serve(disk.inside, prefix=disk.enter()) as server:
            docs = await _drain(http, server.url, acked)
            assert {d["status"] for d in docs.values()} == {"done"}, docs
        assert _integrity(disk.outside / "jobs.sqlite3") == "ok"


async def test_a_stopped_writer_is_answered_503_within_the_bound_and_loses_nothing(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    async with aiohttp.ClientSession() as http:
        async with _serve(state) as server:
            url = server.url
            writer = _writer_pid(server)
            acked = [f"before-{i}" for i in range(5)]
            for job_id in acked:
                assert (await _submit(http, url, _sleep_job(job_id)))[0] == 202
            os.kill(writer, signal.SIGSTOP)
            try:
                # Waits for its commit, at most commit_timeout_s, then is taken back.
                status, body, headers = await _submit(http, url, _sleep_job("during"))
                assert status == 503, body
                assert body["cause"] == "writer" and f"process {writer}" in body["detail"]
                assert int(headers["Retry-After"]) >= 1
                # From now on refused at once; /healthz names the writer.
                status, body, _ = await _submit(http, url, _sleep_job("during-2"))
                assert status == 503 and f"process {writer}" in body["detail"], body
                status, health = await _get(http, url, "/healthz")
                assert status == 503 and "writer" in health["detail"], health
                # Reads of committed jobs go on.
                assert (await _get(http, url, "/jobs/before-0"))[0] == 200
                _, metrics = await _get(http, url, "/metrics")
                assert _metric(metrics, "prorl_store_unavailable") == 1.0
                lag = _metric(metrics, "prorl_loop_lag_seconds")
                assert lag < COMMIT_TIMEOUT_S

                # Logged once when it began, not at every refused submit.
                def said() -> list[str]:
                    return [line for line in server.lines if "job store unavailable" in line]

                await eventually(lambda: bool(said()), timeout=10, what="the stall logged")
                for i in range(3):
                    assert (await _submit(http, url, _sleep_job(f"during-{i + 3}")))[0] == 503
                assert len(said()) == 1, said()
            finally:
                os.kill(writer, signal.SIGCONT)

            async def healthy() -> bool:
                return (await _get(http, url, "/healthz"))[0] == 200

            await eventually(healthy, timeout=30, what="/healthz 200 once the writer answers")
            # The refused submits created nothing: their ids are free again.
            assert (await _get(http, url, "/jobs/during"))[0] == 404
            for job_id in ("during", "during-2"):
                status, body, _ = await _submit(http, url, _sleep_job(job_id))
                assert status == 202 and body["status"] == "queued", body
                acked.append(job_id)
            await _drain(http, url, acked)
            server.proc.kill()  # kill -9: what was acknowledged is on disk
        async with _serve(state) as server:
            docs = await _drain(http, server.url, acked)
            assert sorted(docs) == sorted(acked)
            assert {d["status"] for d in docs.values()} == {"done"}
        assert _integrity(state / "jobs.sqlite3") == "ok"


async def test_a_dead_writer_stops_the_server_with_a_clear_message(tmp_path: Path) -> None:
    state = tmp_path / "state"
    async with aiohttp.ClientSession() as http:
        async with _serve(state) as server:
            acked = [f"before-{i}" for i in range(3)]
            for job_id in acked:
                assert (await _submit(http, server.url, _sleep_job(job_id, run_s=60)))[0] == 202
            os.kill(_writer_pid(server), signal.SIGKILL)
            async with asyncio.timeout(60):
                code = await server.proc.wait()
            assert server.reader is not None
            await server.reader
            assert code == 1, server.lines[-10:]
            said = "".join(server.lines)
            assert "writer process" in said and "requeues" in said, said[-2000:]
        # The restart runs what was not finished.
        async with _serve(state) as server:
            async with http.get(f"{server.url}/status") as r:
                assert (await r.json())["records"] == len(acked)
