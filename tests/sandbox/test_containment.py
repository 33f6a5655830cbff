"""What untrusted code in a bwrap sandbox cannot reach: the server's environment, host files,
host root, host memory and disk beyond its caps (issue #11, findings 1-3)."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from prorl_async.sandbox import BwrapRuntime, RuntimeConfig, SandboxLimits, SandboxSpec
from prorl_async.sandbox.disk import can_mount
from prorl_async.util.procs import descendants
from tests.conftest import require

MiB = 1 << 20
SECRET = f"s3cret-{uuid.uuid4().hex}"


def _environ(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _status(pid: int, key: str) -> list[str]:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(f"{key}:"):
                return line.split()[1:]
    return []


async def test_no_server_environment_in_any_sandbox_process(
    config: RuntimeConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PRORL_TOKEN", SECRET)
    monkeypatch.setenv("HF_TOKEN", SECRET)
    bwrap = BwrapRuntime(config)
    try:
        async with await bwrap.start(SandboxSpec(env={"MINE": "listed"})) as sb:
            # From inside: every environ the sandbox can read, bwrap's /proc/1 included.
            inside = await sb.exec("cat /proc/[0-9]*/environ | tr '\\0' '\\n'", timeout=10)
            assert "MINE=listed" in inside.stdout and SECRET not in inside.stdout
            # From the host (as the server): every process of the sandbox, bwrap and prlimit too.
            tree = descendants(sb.pid) | {sb.pid}
            envs = {pid: _environ(pid) for pid in tree}
            assert any(b"SANDBOX_ID=" in e for e in envs.values()), envs
            leaked = [pid for pid, env in envs.items() if SECRET.encode() in env]
            assert leaked == [], leaked
    finally:
        await bwrap.aclose()


@pytest.fixture
def planted() -> Iterator[tuple[Path, Path]]:
    """A mode-600 secret in the home directory, and a state dir outside /tmp holding one."""
    home = Path(os.path.expanduser("~"))
    secret = home / f".prorl-i11s-{uuid.uuid4().hex[:8]}"
    secret.write_text(SECRET)
    secret.chmod(0o600)
    state = Path(tempfile.mkdtemp(prefix="prorl-state-", dir=home))
    (state / "token").write_text(SECRET)
    yield secret, state
    secret.unlink()
    shutil.rmtree(state)


async def test_host_files_and_host_root_are_out_of_reach(
    config: RuntimeConfig, planted: tuple[Path, Path]
) -> None:
    secret, state = planted
    config = msgspec.structs.replace(config, state_dir=str(state))
    bwrap = BwrapRuntime(config)
    try:
        async with await bwrap.start() as sb:
            reads = " ".join(
                f"cat {p} 2>/dev/null && echo READ {p};"
                for p in (secret, "/etc/shadow", state / "token", "/var/log/dpkg.log")
            )
            r = await sb.exec(reads, timeout=10)
            assert "READ" not in r.stdout and SECRET not in r.stdout, r.stdout
            tops = set((await sb.exec("ls -A /")).stdout.split())
            assert not tops & {"home", "var", "opt", "srv", "mnt", "boot"}, tops
            assert "shadow" not in (await sb.exec("ls -A /etc")).stdout.split()
            # /root exists inside only as the path to a bound Python prefix (pyenv), if at all.
            home = os.path.expanduser("~")
            needed = {
                p[len(home) + 1 :].split("/")[0]
                for p in bwrap.python_roots
                if p.startswith(home + "/")
            }
            listing = await sb.exec(f"ls -A {home} 2>/dev/null")
            assert set(listing.stdout.split()) <= needed, listing.stdout
            status = (await sb.exec("cat /proc/self/status")).stdout
            assert _status_line(status, "CapEff") == "0000000000000000"
            assert _status_line(status, "CapBnd") == "0000000000000000"
            if os.geteuid() == 0:
                # Host view: the tool server and its children run as sandbox_uid, not root.
                tree = descendants(sb.pid)
                server = [p for p in tree if _cmdline(p).startswith(config.python)]
                assert server, "tool server process not found"
                for pid in server:
                    assert set(_status(pid, "Uid")) == {str(config.sandbox_uid)}
                    assert set(_status(pid, "Gid")) == {str(config.sandbox_gid)}
                assert _status_line(status, "NoNewPrivs") == "1"
    finally:
        await bwrap.aclose()


def _status_line(text: str, key: str) -> str | None:
    for line in text.splitlines():
        if line.startswith(f"{key}:"):
            return line.split()[1]
    return None


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


_HOG = """
import sys
block = b"x" * ({size})  # written, so every page is really held
print("held", flush=True)
sys.stdin.read()
"""


async def test_memory_is_capped_for_all_processes_together(config: RuntimeConfig) -> None:
    bwrap = BwrapRuntime(config)
    require(bwrap.cgroups.memory is not None, "no memory cgroup can be created here")
    cap = 1 << 30
    limits = SandboxLimits(sandbox_memory_bytes=cap)
    hog = _HOG.format(size=3 << 30)
    try:
        async with await bwrap.start(SandboxSpec(limits=limits, files={"hog.py": hog})) as sb:
            # 3 x 3 GiB, each under its own RLIMIT_AS (4 GiB): only the sandbox total stops them.
            cmd = "for i in 1 2 3; do python3 hog.py < /dev/zero & done; wait; echo done"
            r = await sb.exec(f"({cmd}) 2>&1 | sort | uniq -c", timeout=60)
            assert sb.cgroup is not None
            peak = sb.cgroup.memory_peak()
            cgroups = sb.cgroup.paths
        assert not [p for p in cgroups if p.exists()]  # teardown removed every cgroup dir
        held = sum(int(line.split()[0]) for line in r.stdout.splitlines() if "held" in line)
        assert held < 3 and "Killed" in r.stdout, r.stdout  # OOM kills inside the sandbox
        assert peak is not None and peak <= cap, peak
        assert "memory cgroup" in bwrap.enforcement(limits)["sandbox_memory_bytes"]
    finally:
        await bwrap.aclose()


_FILL = """
import errno, sys
block = b"x" * (8 << 20)
written = 0
try:
    with open(sys.argv[1], "wb") as f:
        while written < int(sys.argv[2]):
            f.write(block)
            f.flush()
            written += len(block)
    print("wrote", written)
except OSError as exc:
    print("stopped", written, errno.errorcode[exc.errno], exc.strerror)
"""


async def test_disk_is_capped_for_workspace_and_tmp_together(config: RuntimeConfig) -> None:
    require(can_mount(), "a size-capped tmpfs for the workspace needs a server running as root")
    bwrap = BwrapRuntime(config)
    cap = 256 * MiB
    limits = SandboxLimits(disk_bytes=cap)
    try:
        async with await bwrap.start(SandboxSpec(limits=limits, files={"fill.py": _FILL})) as sb:
            first = await sb.exec(f"python3 fill.py /tmp/a {160 * MiB}", timeout=60)
            assert first.stdout.split()[:2] == ["wrote", str(160 * MiB)], first
            # The workspace shares the cap with /tmp: this write stops at the total.
            second = await sb.exec(f"python3 fill.py big {3 * 1000**3}", timeout=60)
            word, written, code = second.stdout.split()[:3]
            assert (word, code) == ("stopped", "ENOSPC"), second
            assert "No space left on device" in second.stdout
            assert 64 * MiB <= int(written) < cap - 160 * MiB + 8 * MiB
            usage = shutil.disk_usage(sb.layout.root)
            assert usage.total <= cap
        assert not sb.layout.root.exists() and not os.path.ismount(sb.layout.root)
        assert "tmpfs" in bwrap.enforcement(limits)["disk_bytes"]
    finally:
        await bwrap.aclose()


async def test_fakeroot_is_root_inside_only(config: RuntimeConfig) -> None:
    bwrap = BwrapRuntime(config)
    try:
        async with await bwrap.start(SandboxSpec(fakeroot=True)) as sb:
            r = await sb.exec("id -u; touch made-by-root && echo wrote", timeout=10)
            assert r.stdout.split() == ["0", "wrote"], r
            tree = descendants(sb.pid)
            server = [p for p in tree if _cmdline(p).startswith(config.python)]
            assert server and all("0" not in _status(p, "Uid") for p in server)
            assert (sb.workspace / "made-by-root").stat().st_uid != 0
    finally:
        await bwrap.aclose()
