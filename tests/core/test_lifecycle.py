"""The server as a real process: plugins from entry points, SIGTERM, config."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from prorl_async.client import RolloutClient
from prorl_async.config import ConfigError, load_config
from prorl_async.service.rollout import _new_job_id
from tests.helpers import ServedProcess, served, server_process
from tests.proctree import descendants

PLUGIN = '''
import asyncio
from prorl_async.core.handler import AgentHandler


class HoldHandler(AgentHandler):
    """Task ``hold``: RUN starts a child process, holds it, waits ``run_s``."""

    name = "hold"

    async def run(self, job):
        proc = await asyncio.create_subprocess_exec("sleep", "600")
        await job.hold(_Reaped(proc))
        await asyncio.sleep(job.instance.get("run_s", 0))

    async def eval(self, job):
        job.reward = 7.0


class _Reaped:
    def __init__(self, proc):
        self.proc = proc

    async def __aenter__(self):
        return self.proc

    async def __aexit__(self, *exc):
        if self.proc.returncode is None:
            self.proc.kill()
        await asyncio.shield(self.proc.wait())
'''


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Install a tiny separately packaged handler, as a third party would."""
    root = tmp_path_factory.mktemp("plugin")
    src = root / "src"
    (src / "hold_plugin").mkdir(parents=True)
    (src / "hold_plugin" / "__init__.py").write_text(PLUGIN)
    (src / "pyproject.toml").write_text(
        textwrap.dedent("""
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "hold-plugin"
        version = "0.1"
        [project.entry-points."prorl_async.handlers"]
        hold = "hold_plugin:HoldHandler"
        [tool.setuptools]
        packages = ["hold_plugin"]
    """)
    )
    site = root / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(site),
            str(src),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return site


async def test_entry_point_plugin_and_sigterm_with_200_jobs(
    tmp_path: Path, plugin_site: Path
) -> None:
    env = {"PYTHONPATH": f"{plugin_site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env = {**os.environ, **env}
    async with served(tmp_path / "state", "--run-workers", "64", env=env) as server:
        proc, url, started = server.proc, server.url, len(server.lines)
        async with RolloutClient(url) as client:
            first = await client.submit("hold", {"run_s": 0})
            res = await client.result(first, wait=20)
            assert res is not None and res["status"] == "done" and res["reward"] == 7.0
            jobs = [{"task": "hold", "instance": {"run_s": 600}} for _ in range(40)]
            jobs += [{"task": "sleep", "instance": {"run_s": 600}} for _ in range(160)]
            ids = await client.submit_batch(jobs)
            assert len(ids) == 200
            # 40 plugin jobs hold a child each; wait until they are all running
            async with asyncio.timeout(30):
                while len(descendants(proc.pid)) < 40:
                    await client.status()
            children = descendants(proc.pid)
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            code = await proc.wait()
            rest = await _log_after(server, started)
        assert code == 0, rest
        assert "Traceback" not in rest and "Warning" not in rest and "was destroyed" not in rest
        assert "stopped cleanly" in rest
        alive = [p for p in children if _not_zombie(p)]
        assert alive == []


async def _log_after(server: ServedProcess, start: int) -> str:
    """The server's log from line ``start`` to its end (the process has exited)."""
    assert server.reader is not None
    await server.reader
    return "".join(server.lines[start:])


def _not_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


async def test_sigint_exits_zero(tmp_path: Path) -> None:
    async with server_process(tmp_path, {}) as (proc, url):
        async with RolloutClient(url) as client:
            await client.submit_batch([{"task": "sleep", "instance": {"run_s": 60}}] * 10)
        proc.send_signal(signal.SIGINT)
        async with asyncio.timeout(30):
            assert await proc.wait() == 0


async def test_bad_config_exits_2(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "prorl_async.cli",
        "serve",
        "--run-workers",
        "0",
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await proc.communicate()
    assert proc.returncode == 2 and b"run_workers" in err


def test_config_precedence(tmp_path: Path) -> None:
    toml = tmp_path / "c.toml"
    toml.write_text('run_workers = 3\ninit_workers = 5\nport = 9000\ntoken = "t"\n')
    env = {"PRORL_RUN_WORKERS": "7", "PRORL_RETENTION_S": "12.5", "UNRELATED": "x"}
    cfg = load_config(path=str(toml), env=env, overrides={"port": 9100, "host": None})
    assert cfg.init_workers == 5  # file
    assert cfg.run_workers == 7  # env beats file
    assert cfg.retention_s == 12.5
    assert cfg.port == 9100  # flag beats file
    assert cfg.host == "127.0.0.1"  # default
    assert cfg.token == "t"
    assert cfg.sandbox_start == "eager"  # default: sandboxes start in INIT, as always
    env = {"PRORL_SANDBOX_START": "on_first_use"}
    assert load_config(env=env).sandbox_start == "on_first_use"


@pytest.mark.parametrize(
    ("content", "env", "needle"),
    [
        ("run_workers = 'many'\n", {}, "run_workers"),
        ("bogus_key = 1\n", {}, "bogus_key"),
        ("", {"PRORL_EVAL_WORKERS": "x"}, "eval_workers"),
        ("not toml [", {}, "c.toml"),
        ("sandbox_start = 'lazy'\n", {}, "sandbox_start must be eager or on_first_use"),
        ("", {"PRORL_SANDBOX_START": "later"}, "sandbox_start"),
    ],
)
def test_config_errors_name_the_field(
    tmp_path: Path, content: str, env: dict[str, str], needle: str
) -> None:
    toml = tmp_path / "c.toml"
    toml.write_text(content)
    with pytest.raises(ConfigError, match=needle):
        load_config(path=str(toml), env=env)


def test_default_state_dir_is_per_user_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", "/x/cache")
    assert load_config(env={}).state_dir == "/x/cache/prorl-async"


async def test_sigterm_with_live_sandboxes_leaves_nothing(tmp_path: Path) -> None:
    from prorl_async.sandbox import bwrap_problem
    from tests.conftest import require

    problem = bwrap_problem()
    require(problem is None, f"bubblewrap cannot create sandboxes here: {problem}")
    async with served(tmp_path / "state", "--runtime", "bwrap") as server:
        proc, url, started = server.proc, server.url, len(server.lines)
        async with RolloutClient(url) as client:
            # No LLM backend is registered: each job starts its sandbox in INIT, then
            # waits in RUN for a backend while holding it.
            jobs = [{"task": "sandbox", "instance": {"prompt": f"p{i}"}} for i in range(8)]
            await client.submit_batch(jobs)
            async with asyncio.timeout(60):
                status = await client.status()
                while status["sandboxes"] < 8 or status["backend_waiting"] < 8:
                    status = await client.status()
            children = descendants(proc.pid)
            assert len(children) >= 8 * 2  # bwrap + tool server per sandbox at least
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(60):
            code = await proc.wait()
            rest = await _log_after(server, started)
        assert code == 0, rest
        assert "Traceback" not in rest
        assert [p for p in children if _not_zombie(p)] == []
        records = tmp_path / "state" / "sandboxes"
        assert not records.exists() or not any(records.iterdir())


def test_server_job_ids_are_unique_and_sort_by_creation_time() -> None:
    """``j-``, 12 hex digits of wall-clock milliseconds, 20 random hex digits (80 bits):
    the durable store's id index takes new ids at its end."""
    before = int(time.time() * 1000)
    ids = [_new_job_id() for _ in range(1_000)]  # across blocks of 256 random draws
    after = int(time.time() * 1000)
    assert all(re.fullmatch(r"j-[0-9a-f]{32}", i) for i in ids)
    assert len(set(ids)) == len(ids)
    stamps = [int(i[2:14], 16) for i in ids]
    assert stamps == sorted(stamps)
    assert before <= stamps[0] and stamps[-1] <= after
    # Within one millisecond the rest is random, not a counter.
    assert len({i[14:] for i in ids}) == len(ids)
