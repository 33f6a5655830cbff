"""kill -9 of a real server process with work in every stage, then a restart on its state dir."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest

from prorl_async.client import RolloutClient
from prorl_async.sandbox.keeper import SWEEP_S
from prorl_async.scripted_llm import ScriptedLLM
from prorl_async.scripted_llm.policies import tool_call
from tests.handlers.policies import require_bwrap, tool_responses
from tests.helpers import eventually, server_process
from tests.proctree import cmdline, descendants

T = 5.0  # seconds each in-flight sleep job spends in its stage (well beyond the kill)
SANDBOXES = 4


class SleepyShell:
    """TEST DOUBLE policy: runs ``command`` with bash once, then finishes."""

    def __init__(self) -> None:
        self.command = "sleep 300"

    def reply(self, conversation: str) -> str:
        if not tool_responses(conversation):
            return tool_call("bash", {"command": self.command, "timeout": 600})
        return tool_call("finish", {"answer": "done"})


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def _sleep(**stages: float) -> dict[str, Any]:
    return {"task": "sleep", "instance": stages}


async def _raw(session: aiohttp.ClientSession, url: str, job_id: str) -> bytes:
    async with session.get(f"{url}/jobs/{job_id}") as r:
        assert r.status == 200, (job_id, r.status)
        return await r.read()


async def _drain(client: RolloutClient, ids: list[str], wait: float = 60) -> dict[str, Any]:
    docs: dict[str, Any] = {}
    pending = list(ids)
    async with asyncio.timeout(wait):
        while pending:
            out = await client.poll(pending, wait=10)
            assert out["unknown"] == [], out["unknown"][:5]
            docs.update({d["job_id"]: d for d in out["done"]})
            pending = out["pending"]
    return docs


def _leftovers(state: Path) -> dict[str, list[str]]:
    """What the server's live sandboxes hold, from their records."""
    out: dict[str, list[str]] = {"paths": [], "cgroups": [], "locks": []}
    for rec in (state / "sandboxes").glob("*.json"):
        doc = msgspec.json.decode(rec.read_bytes())
        out["paths"] += doc["paths"]
        out["cgroups"] += [c for c in [doc.get("cgroup"), *doc.get("cgroups", [])] if c]
        out["locks"] += [doc["loopback"]]
    return out


async def _populate(client: RolloutClient, proc_pid: int) -> tuple[list[str], list[str]]:
    """200 finished jobs; then 256 in flight: 8 in INIT, 64 in RUN (4 sandboxes mid-command),
    16 in EVAL, 168 queued for INIT."""
    finished = await client.submit_batch([_sleep()] * 200)
    await _drain(client, finished)
    sandbox = {"prompt": "run it", "tools": ["bash"]}
    inflight = [await client.submit("sandbox", sandbox) for _ in range(SANDBOXES)]

    async def mid_command() -> bool:
        kids = descendants(proc_pid)
        return sum("sleep 300" in cmdline(p) for p in kids) >= SANDBOXES

    await eventually(mid_command, timeout=30)
    # EVAL first: they pass INIT and RUN before the RUN sleepers fill the RUN workers.
    jobs = [_sleep(eval_s=T)] * 16 + [_sleep(run_s=T)] * 60 + [_sleep(init_s=T)] * 8
    inflight += await client.submit_batch(jobs + [_sleep()] * 168)

    async def placed() -> bool:
        st = await client.status()
        active: dict[str, int] = st["active"]
        queued: int = st["queues"]["init"]
        return active == {"init": 8, "run": 64, "eval": 16} and queued == 168

    await eventually(placed, timeout=30)
    return finished, inflight


@pytest.mark.parametrize("mode", ["requeue", "fail"])
async def test_kill9_with_every_stage_busy_then_restart(tmp_path: Path, mode: str) -> None:
    require_bwrap()
    state = tmp_path / "state"
    policy = SleepyShell()
    async with ScriptedLLM(policy=policy) as llm, aiohttp.ClientSession() as http:
        async with server_process(tmp_path, {}, "--runtime", "bwrap") as (proc, url):
            async with RolloutClient(url) as client:
                await client.add_llm_server(llm.address)
                finished, inflight = await _populate(client, proc.pid)
                before = {i: await _raw(http, url, i) for i in finished}
                held = _leftovers(state)
                pids = descendants(proc.pid)
            proc.kill()
            await proc.wait()
        assert len(held["paths"]) == SANDBOXES and all(os.path.exists(p) for p in held["paths"])
        policy.command = "true"  # after the restart the sandbox episodes end at once
        args = ("--runtime", "bwrap", "--on-restart", mode)
        async with server_process(tmp_path, {}, *args) as (proc, url):
            # start-up cleanup already ran: nothing of the dead server remains but its
            # keeper, which ends by itself after its sweep (bounded).
            keepers = {p for p in pids if "sandbox/keeper.py" in cmdline(p)}
            alive = [(p, _state(p), cmdline(p)) for p in pids - keepers]
            assert [a for a in alive if a[1] not in ("gone", "Z", "X")] == []
            assert [
                p for k in ("paths", "cgroups", "locks") for p in held[k] if os.path.exists(p)
            ] == []
            assert list((state / "sandboxes").glob("*.json")) == []
            await eventually(
                lambda: all(_state(p) in ("gone", "Z", "X") for p in keepers),
                timeout=SWEEP_S + 5.0,
                what="the dead server's keeper ends after its sweep",
            )
            for job_id, body in before.items():
                assert await _raw(http, url, job_id) == body
            async with RolloutClient(url) as client:
                await client.add_llm_server(llm.address)
                docs = await _drain(client, inflight)
    assert set(docs) == set(inflight)
    assert {d["restarts"] for d in docs.values()} == {1}
    if mode == "requeue":
        assert {d["status"] for d in docs.values()} == {"done"}
    else:
        assert {d["status"] for d in docs.values()} == {"failed"}
        assert {d["error"]["type"] for d in docs.values()} == {"ServerRestart"}
