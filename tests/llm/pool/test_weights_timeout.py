"""Bounded weight operations (issue 42): an engine stopped (SIGSTOP) in the middle of its
load gets no more than ``pool.weights_timeout_s``. The answer is 504 naming it, it leaves
rotation (its jobs fail over), the other engines serve the new version, and once continued
(SIGCONT) it is given that version before it serves again.

The stopped engine is the scripted engine (a TEST DOUBLE of vLLM's dev-mode weight routes)
run as a real process, its loads made to take ``LOAD_S`` so that the stop lands mid-load.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from prorl_async.llm.pool import BackendPool, PoolConfig
from prorl_async.llm.weights import WeightsError
from prorl_async.trainer import RolloutManager, WeightsFailed, WeightsTimeout
from prorl_async.trainer.loop import LoopLag
from tests.helpers import ServerFactory, eventually
from tests.llm.pool.conftest import StartLLM
from tests.llm.pool.test_weights import checkpoint
from tests.trainer.harness import mixed_prompts

TIMEOUT_S = 2.0  # pool.weights_timeout_s: small, so that the bound is a decision here
LOAD_S = 1.0  # how long the stoppable engine's load takes (under TIMEOUT_S: it can recover)
POOL: dict[str, Any] = {
    "weights_timeout_s": TIMEOUT_S,
    "probe_interval_s": 0.05,
    "probe_timeout_s": 0.5,
    "retry_backoff_s": 0.0,
}


class Stoppable:
    """The scripted engine as a process that a test stops and continues."""

    def __init__(self, proc: asyncio.subprocess.Process, address: str) -> None:
        self.proc, self.address = proc, address
        self.root = address.removesuffix("/v1")

    def stop(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def cont(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    async def weights(self) -> dict[str, Any]:
        """The double's own account: what it serves, whether a load is under way."""
        async with aiohttp.ClientSession() as s, s.get(f"{self.root}/scripted/weights") as r:
            doc: dict[str, Any] = await r.json()
            return doc

    async def loading(self, path: str) -> bool:
        return bool((await self.weights())["loading"] == path)


@contextlib.asynccontextmanager
async def stoppable(prefix: tuple[str, ...] = ()) -> AsyncIterator[Stoppable]:
    proc = await asyncio.create_subprocess_exec(
        *prefix,
        *(sys.executable, "-m", "prorl_async.scripted_llm", "--port", "0"),
        *("--load-s", str(LOAD_S)),
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        assert "listening on" in line, line
        yield Stoppable(proc, line.split()[-1])
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            await proc.wait()


@contextlib.asynccontextmanager
async def lag_probe() -> AsyncIterator[LoopLag]:
    """How late a 20 ms heartbeat on this loop (the server's) runs meanwhile."""
    lag = LoopLag(period_s=0.02)
    task = asyncio.create_task(lag.run())
    try:
        yield lag
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any], float]:
    """The status, the body, and how long the answer took."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    async with aiohttp.ClientSession() as s, s.post(url, json=body) as r:
        return r.status, await r.json(content_type=None), loop.time() - start


def _by_address(weights: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {w["address"]: w for w in weights}


async def test_an_engine_stopped_mid_load_answers_504_naming_it_and_comes_back_at_the_version(
    start_llm: StartLLM, make_server: ServerFactory, tmp_path: Path
) -> None:
    other = await start_llm()
    path = checkpoint(tmp_path)
    async with stoppable() as engine, make_server(runtime="local", pool=POOL) as srv:
        await srv.client.add_llm_server(engine.address, weight_version=1)
        await srv.client.add_llm_server(other.address, weight_version=1)
        async with lag_probe() as lag:
            body = {"version": 2, "path": path, "mode": "abort"}
            load = asyncio.create_task(_post(f"{srv.url}/weights/load", body))
            await eventually(lambda: engine.loading(path), what="the engine's load under way")
            engine.stop()
            status, problem, took = await load
            weights = _by_address(await srv.client.weights())
            # Jobs go on meanwhile, on the engine that answers, under the new weights.
            [job] = await srv.client.submit_batch(
                [{"task": "math", "instance": {"problem": "2+2?", "answer": "4"}}]
            )
            doc = await srv.client.result(job, wait=30)
            assert lag.max_ms < 100, f"the event loop was held {lag.max_ms} ms"
        assert status == 504 and took < TIMEOUT_S + 5, (status, took, problem)
        assert problem["title"] == "Gateway Timeout" and problem["timed_out"] == [engine.address]
        assert engine.address in problem["detail"] and "weights_timeout_s" in problem["detail"]
        assert problem["backends"][engine.address]["timed_out"] is True
        assert problem["backends"][other.address]["ok"] is True
        stopped, serving = weights[engine.address], weights[other.address]
        assert (serving["weight_version"], serving["healthy"], serving["paused"]) == (
            2,
            True,
            False,
        )
        assert (stopped["weight_version"], stopped["healthy"], stopped["paused"]) == (
            None,
            False,
            False,
        )
        assert stopped["resync"]["version"] == 2 and stopped["resync"]["path"] == path
        assert doc is not None and doc["status"] == "done", doc
        assert doc["weight_versions"] == [2]

        engine.cont()
        await eventually(
            lambda: _taken_back(srv.client.weights(), engine.address), timeout=LOAD_S + 15
        )
        state = await engine.weights()
        assert (state["version"], state["path"], state["paused"]) == ("2", path, False)
        assert (await srv.client.status())["backends"][0]["healthy"] is True


async def _taken_back(weights: Any, address: str) -> bool:
    mine = _by_address(await weights)[address]
    return bool(mine["healthy"] and mine["resync"] is None and mine["weight_version"] == 2)


async def test_a_call_waiting_for_the_stopped_engine_fails_over_to_the_new_version(
    start_llm: StartLLM, tmp_path: Path
) -> None:
    other = await start_llm()
    path = checkpoint(tmp_path)
    config = PoolConfig(**POOL)
    async with stoppable() as engine, BackendPool(config) as pool:
        await pool.register(engine.address, weight_version=1)
        await pool.register(other.address, weight_version=1)
        async with pool.lease() as lease:
            assert lease.address == engine.address  # the first registered, all else equal
            load = asyncio.create_task(pool.weights.load(2, path, "abort"))
            await eventually(lambda: engine.loading(path), what="the engine's load under way")
            engine.stop()
            call = asyncio.create_task(lease.generate([1, 2, 3], 5, {}))
            with pytest.raises(WeightsError) as info:
                await load
            gen = await call
        assert info.value.status == 504 and info.value.body["timed_out"] == [engine.address]
        assert (gen.backend, gen.weight_version) == (other.address, 2)
        assert lease.address == other.address


async def test_set_weights_raises_naming_the_engine_and_a_later_load_is_deferred_for_it(
    start_llm: StartLLM, make_server: ServerFactory, tmp_path: Path
) -> None:
    other = await start_llm()
    for name in ("v2", "v3"):
        (tmp_path / name).mkdir()
    first, second = checkpoint(tmp_path / "v2"), checkpoint(tmp_path / "v3")
    async with (
        stoppable() as engine,
        _managed(make_server, engine.address, other.address) as (srv, manager),
    ):
        set_weights = asyncio.create_task(manager.set_weights(version=2, path=first))
        await eventually(lambda: engine.loading(first), what="the engine's load under way")
        engine.stop()
        with pytest.raises(WeightsTimeout) as info:
            await set_weights
        assert info.value.engines == [engine.address] and engine.address in str(info.value)
        assert manager.metrics()["current_version"] == 2  # the other engine serves it
        # Out of rotation, the stopped engine is not waited for again: the load is recorded.
        answer = await srv.client.load_weights(3, second)
        assert answer["backends"][engine.address]["deferred"] is True
        assert answer["backends"][other.address]["ok"] is True
        engine.cont()
        await eventually(lambda: _taken_back_at(srv, engine.address, 3), timeout=LOAD_S + 15)
        state = await engine.weights()
        assert (state["version"], state["path"]) == ("3", second)


async def test_set_weights_raises_naming_an_engine_that_failed_its_load(
    start_llm: StartLLM, make_server: ServerFactory, tmp_path: Path
) -> None:
    """The engine's node does not see the checkpoint (a node-local disk): the server's
    check passes, the engine refuses the load (502). The trainer is told, not left to
    believe every engine serves the new version."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux) for a private mount namespace")
    other = await start_llm()
    shared = tmp_path / "shared"
    (shared / "v2").mkdir(parents=True)
    path = checkpoint(shared / "v2")
    unshare = ("unshare", "-m") if os.geteuid() == 0 else ("unshare", "-r", "-m")
    # The engine runs where an empty tmpfs hides the directory the checkpoint is in.
    hidden = (*unshare, "sh", "-c", 'mount -t tmpfs tmpfs "$0" && exec "$@"', str(shared))
    async with (
        stoppable(hidden) as engine,
        _managed(make_server, engine.address, other.address) as (srv, manager),
    ):
        with pytest.raises(WeightsFailed) as info:
            await manager.set_weights(version=2, path=path)
        assert not isinstance(info.value, WeightsTimeout)
        assert info.value.engines == [engine.address]
        assert "no such directory" in str(info.value) and engine.address in str(info.value)
        assert manager.metrics()["current_version"] == 2  # the other engine serves it
        versions = {
            a: w["weight_version"] for a, w in _by_address(await srv.client.weights()).items()
        }
        assert versions == {engine.address: 1, other.address: 2}
        assert not manager.metrics()["servers"][srv.url]["quarantined"]  # the server is fine


@contextlib.asynccontextmanager
async def _managed(
    make_server: ServerFactory, *engines: str
) -> AsyncIterator[tuple[Any, RolloutManager]]:
    """A server with ``engines`` registered at version 1, and a manager over it."""
    async with (
        make_server(runtime="local", pool=POOL) as srv,
        RolloutManager(
            servers=[srv.url],
            prompts=mixed_prompts(4),
            group_size=2,
            batch_groups=1,
            progress=False,
        ) as manager,
    ):
        for address in engines:
            await srv.client.add_llm_server(address, weight_version=1)
        yield srv, manager


async def _taken_back_at(srv: Any, address: str, version: int) -> bool:
    mine = _by_address(await srv.client.weights())[address]
    return bool(mine["healthy"] and mine["weight_version"] == version)


async def test_a_pause_the_stopped_engine_misses_is_504_and_it_returns_resumed_at_the_version(
    start_llm: StartLLM,
) -> None:
    other = await start_llm()
    async with stoppable() as engine, BackendPool(PoolConfig(**POOL)) as pool:
        await pool.register(engine.address, weight_version=1)
        await pool.register(other.address, weight_version=1)
        engine.stop()
        with pytest.raises(WeightsError) as info:
            await pool.weights.pause("abort")
        assert info.value.status == 504 and info.value.body["timed_out"] == [engine.address]
        assert "pause" in info.value.detail and other.weights.paused
        [lost] = [w for w in pool.weights.snapshot() if w["address"] == engine.address]
        assert (lost["healthy"], lost["resync"]["version"], lost["resync"]["paused"]) == (
            False,
            1,
            True,
        )
        answer = await pool.weights.resume(5)  # the lost engine is not waited for again
        assert answer["resumed"] == [engine.address, other.address]
        engine.cont()
        await eventually(lambda: _back(pool, engine.address), timeout=15)
        state = await engine.weights()
        assert (state["version"], state["paused"]) == ("5", False)


def _back(pool: BackendPool, address: str) -> bool:
    [mine] = [w for w in pool.weights.snapshot() if w["address"] == address]
    return bool(mine["healthy"] and mine["weight_version"] == 5 and not mine["paused"])
