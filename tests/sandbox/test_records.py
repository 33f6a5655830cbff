"""Live-sandbox records and reaping what a crashed server left behind."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from prorl_async.sandbox import SandboxRecords
from prorl_async.sandbox.cgroup import find_cgroup_parents
from prorl_async.util.procs import start_time, wait_exited
from tests.conftest import require

# A "server" that starts a sandbox-like process in its own session, records it, and crashes.
_CRASHING_SERVER = """
import os, subprocess, sys
from prorl_async.sandbox import SandboxRecords
child = subprocess.Popen(["sleep", "1000"], start_new_session=True, stdout=subprocess.DEVNULL)
os.makedirs(sys.argv[2], exist_ok=True)
SandboxRecords(sys.argv[1]).add("crashed1", child.pid, runtime="local", paths=(sys.argv[2],))
print(child.pid, flush=True)
os._exit(0)
"""


async def _crash_leaving_orphan(state: Path, owned_dir: Path) -> int:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _CRASHING_SERVER,
        str(state),
        str(owned_dir),
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    return int(out)


async def test_reap_stale_kills_orphans_of_a_dead_server(tmp_path: Path) -> None:
    owned = tmp_path / "sandbox-dir"
    orphan = await _crash_leaving_orphan(tmp_path, owned)
    assert start_time(orphan) is not None, "the orphan should outlive its crashed server"
    records = SandboxRecords(tmp_path)
    reaped = records.reap_stale()
    assert [r.sandbox_id for r in reaped] == ["crashed1"]
    assert await wait_exited([orphan], timeout=10) == set()
    assert not owned.exists()
    assert records.load() == []


async def test_reused_pid_is_never_killed(tmp_path: Path) -> None:
    victim = await asyncio.create_subprocess_exec("sleep", "1000", start_new_session=True)
    try:
        records = SandboxRecords(tmp_path)
        rec = records.add("reused", victim.pid, runtime="bwrap")
        # Same pid, different start time, dead owner: as if the pid had been recycled.
        forged = rec.__class__(
            sandbox_id="reused",
            pid=victim.pid,
            start_time=rec.start_time - 1,
            owner_pid=rec.owner_pid,
            owner_start_time=rec.owner_start_time - 1,
            runtime="bwrap",
        )
        (tmp_path / "sandboxes" / "reused.json").write_bytes(_encode(forged))
        assert [r.sandbox_id for r in records.reap_stale()] == ["reused"]
        assert victim.returncode is None and start_time(victim.pid) == rec.start_time
    finally:
        victim.kill()
        await victim.wait()


async def test_records_of_a_live_server_are_left_alone(tmp_path: Path) -> None:
    child = await asyncio.create_subprocess_exec("sleep", "1000", start_new_session=True)
    try:
        records = SandboxRecords(tmp_path)
        records.add("mine", child.pid, runtime="bwrap")
        (tmp_path / "sandboxes" / "junk.json").write_text("{not json")
        assert records.reap_stale() == []
        assert start_time(child.pid) is not None
        assert [r.sandbox_id for r in records.load()] == ["mine"]
        records.remove("mine")
        assert records.load() == []
    finally:
        child.kill()
        await child.wait()


# A crashed server whose sandbox died with it (--die-with-parent): only the leftovers remain.
_CRASH_AFTER_SANDBOX = """
import os, subprocess, sys
from prorl_async.sandbox import SandboxRecords
from prorl_async.sandbox.cgroup import SandboxCgroup, find_cgroup_parents
from prorl_async.sandbox.loopback import LoopbackAllocator
state, owned, lockdir = sys.argv[1:4]
child = subprocess.Popen(["sleep", "1000"], start_new_session=True)
os.makedirs(owned, exist_ok=True)
lease = LoopbackAllocator(lockdir).acquire()
cgroup = SandboxCgroup.create(
    find_cgroup_parents(), f"prorl-test-{os.getpid()}", max_pids=8, memory=None
)
cgs = tuple(str(p) for p in cgroup.paths) if cgroup else ()
SandboxRecords(state).add(
    "gone1", child.pid, runtime="bwrap", paths=(owned,), cgroups=cgs, loopback=str(lease.path)
)
child.kill()
child.wait()
print(" ".join(cgs), flush=True)
"""


# Like the above, with the child in the sandbox's pids + memory cgroups and its directory a
# size-capped tmpfs, as a root server's bwrap sandbox has them.
_CRASHING_ROOT_SERVER = """
import os, subprocess, sys
from prorl_async.sandbox import SandboxRecords
from prorl_async.sandbox.cgroup import SandboxCgroup, find_cgroup_parents
from prorl_async.sandbox.disk import mount_tmpfs
os.makedirs(sys.argv[2])
mount_tmpfs(sys.argv[2], 1 << 20)
cg = SandboxCgroup.create(find_cgroup_parents(), "prorl-sb-crash" + str(os.getpid()),
                          max_pids=8, memory=64 << 20)
join = " && ".join(f"echo $$ > {f}" for f in cg.procs_files)
child = subprocess.Popen(["sh", "-c", join + " && exec sleep 1000"], start_new_session=True,
                         stdout=subprocess.DEVNULL)
while child.pid not in cg.pids():
    pass
SandboxRecords(sys.argv[1]).add("crashed2", child.pid, runtime="bwrap", paths=(sys.argv[2],),
                                cgroups=tuple(str(p) for p in cg.paths))
print(child.pid, *cg.paths, flush=True)
os._exit(0)
"""


async def test_reap_stale_cleans_up_when_the_sandbox_pid_is_gone(tmp_path: Path) -> None:
    owned, lockdir = tmp_path / "workspace", tmp_path / "loopback"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _CRASH_AFTER_SANDBOX,
        str(tmp_path),
        str(owned),
        str(lockdir),
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    cgroups = out.decode().split()
    assert owned.is_dir() and len(list(lockdir.iterdir())) == 1
    assert all(Path(c).is_dir() for c in cgroups)
    records = SandboxRecords(tmp_path)
    assert [r.sandbox_id for r in records.reap_stale()] == ["gone1"]
    assert not owned.exists()
    assert list(lockdir.iterdir()) == []  # the dead server's loopback lock file
    assert [c for c in cgroups if Path(c).exists()] == []
    assert records.load() == []


async def test_reap_stale_removes_cgroups_and_unmounts_the_sandbox_tmpfs(tmp_path: Path) -> None:
    require(os.geteuid() == 0, "cgroups and a tmpfs per sandbox need a server running as root")
    require(find_cgroup_parents().memory is not None, "no memory cgroup can be created here")
    owned = tmp_path / "sandbox-dir"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _CRASHING_ROOT_SERVER,
        str(tmp_path),
        str(owned),
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    orphan, *cgroups = out.decode().split()
    assert os.path.ismount(owned) and all(Path(c).is_dir() for c in cgroups)
    reaped = SandboxRecords(tmp_path).reap_stale()
    assert [r.sandbox_id for r in reaped] == ["crashed2"]
    assert await wait_exited([int(orphan)], timeout=10) == set()
    assert not owned.exists() and not os.path.ismount(owned)
    assert [c for c in cgroups if Path(c).exists()] == []


def _encode(rec: object) -> bytes:
    import msgspec

    return msgspec.json.encode(rec)
