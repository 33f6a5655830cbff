"""The local (unisolated, dev-only) runtime and runtime selection."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from prorl_async.sandbox import (
    BwrapRuntime,
    LocalRuntime,
    RuntimeConfig,
    bwrap_problem,
    get_runtime,
)
from prorl_async.sandbox.layout import Layout
from prorl_async.util.procs import descendants, kill_all, wait_exited
from tests.sandbox.conftest import snapshot, still_running

# Starts `sleep` in a new session with no inherited fds, records its pid and exits at once.
_DAEMON = """
import subprocess
p = subprocess.Popen(["sleep", "1000"], start_new_session=True, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
open("child", "w").write(str(p.pid))
"""


async def test_local_runs_in_host_workspace_and_kills_escapees(
    local: LocalRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        sb = await local.start()
    assert "UNISOLATED" in caplog.text
    async with sb:
        r = await sb.exec(f"python3 -c '{_DAEMON}'; pwd", timeout=20)
        assert r.stdout.strip() == str(sb.workspace)
        assert (await sb.exec("echo $SANDBOX_LOOPBACK_IP")).stdout.strip() == sb.loopback_ip
        # The daemon outlived its parent: reparented, no longer below sb.pid.
        escapee = snapshot({int((sb.workspace / "child").read_text())})
        assert escapee and not set(escapee) & descendants(sb.pid)
        tree = snapshot(descendants(sb.pid) | {sb.pid})
    assert still_running(tree) == []
    if sb.cgroup is None:
        left = still_running(escapee)
        kill_all(left)
        await wait_exited(left, 5)
        pytest.skip("without a pids cgroup the local runtime cannot find reparented processes")
    assert still_running(escapee) == []


def test_get_runtime(config: RuntimeConfig) -> None:
    with pytest.raises(ValueError, match="'nope'"):
        get_runtime("nope", config)
    assert isinstance(get_runtime("local", config), LocalRuntime)
    auto = get_runtime("auto", config)
    expected = BwrapRuntime if bwrap_problem() is None else LocalRuntime
    assert isinstance(auto, expected)


def test_tool_server_imports_the_servers_own_checkout(local: LocalRuntime, tmp_path: Path) -> None:
    """With two checkouts, the interpreter's import path may name the other one (an
    editable install made from it); the tool server must import this server's code.
    Here ``PYTHONPATH`` names a decoy ``prorl_async`` that refuses to import."""
    decoy = tmp_path / "other-checkout" / "prorl_async"
    decoy.mkdir(parents=True)
    (decoy / "__init__.py").write_text("raise ImportError('the other checkout')\n")
    layout = Layout(sandbox_id="x", root=tmp_path)
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(decoy.parent)}
    for same_code, wanted in ((False, 1), (True, 0)):
        argv = local.tool_server_argv(sys.executable, layout, same_code=same_code)
        proc = subprocess.run([*argv, "--help"], env=env, capture_output=True, timeout=60)
        assert proc.returncode == wanted, proc.stderr.decode()[-500:]
    assert b"--socket" in proc.stdout  # the real tool server's usage
