"""The bwrap runtime, for real: isolation, limits, loopback addresses, teardown, scale."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import msgspec
import pytest

from prorl_async.sandbox import (
    BwrapRuntime,
    RuntimeConfig,
    SandboxLimits,
    SandboxSpec,
    SandboxStartError,
    SpecError,
)
from prorl_async.toolserver.client import ToolServerError
from prorl_async.util.procs import descendants
from tests.sandbox.conftest import snapshot, still_running

MiB = 1 << 20

_CONNECT = """
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
s.sendall(b"from-sandbox")
s.close()
"""


async def _listener() -> tuple[asyncio.Server, int, asyncio.Future[bytes]]:
    got: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    async def on_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.read()
        if not got.done():
            got.set_result(data)
        writer.close()

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], got


async def test_no_network_by_default(bwrap: BwrapRuntime) -> None:
    server, port, got = await _listener()
    async with server, await bwrap.start() as sb:
        r = await sb.exec(f"python3 -c '{_CONNECT}' {port}", timeout=20)
        assert r.exit_code != 0 and "ConnectionRefusedError" in r.stderr, r
        assert not got.done()
        net = await sb.exec("ls /sys/class/net 2>&1; cat /proc/net/dev | tail -n +3", timeout=10)
        assert net.stdout.split()[0:1] in (["ls:"], ["lo:"]) and "eth" not in net.stdout


async def test_host_is_read_only_except_workspace(bwrap: BwrapRuntime, tmp_path: Path) -> None:
    spec = SandboxSpec(files={"src/a.txt": "alpha"})
    async with await bwrap.start(spec) as sb:
        assert (sb.workspace / "src" / "a.txt").read_text() == "alpha"
        targets = ["/etc/x", "/usr/x", "/root/x", f"{tmp_path}/x", "/x"]
        script = "; ".join(f"touch {t} 2>/dev/null && echo WROTE {t}" for t in targets)
        r = await sb.exec(f"{script}; echo ok > out.txt; echo t > /tmp/private; pwd", timeout=10)
        assert "WROTE" not in r.stdout, r.stdout
        assert r.stdout.strip().endswith("/workspace")
        assert (sb.workspace / "out.txt").read_text() == "ok\n"
        assert "private" not in os.listdir("/tmp")  # the sandbox's /tmp is its own
        await sb.write_files({"b/c.txt": "gamma"})
        assert await sb.read_file("b/c.txt") == "gamma"
        assert (await sb.exec("cat src/a.txt b/c.txt")).stdout == "alphagamma"
        with pytest.raises(SpecError):
            await sb.read_file("../etc/passwd")
        assert _inherited_fds(sb.pid) == []  # no server socket or pipe leaks into the sandbox


async def test_loopback_ip_exported_unique_and_bindable(bwrap: BwrapRuntime) -> None:
    bind = (
        "python3 -c 'import os, socket; "
        'socket.socket().bind((os.environ["SANDBOX_LOOPBACK_IP"], 0))\''
    )
    sbs = await asyncio.gather(*(bwrap.start() for _ in range(6)))
    try:
        outs = await asyncio.gather(
            *(sb.exec(f'{bind} && echo "$SANDBOX_LOOPBACK_IP"', timeout=20) for sb in sbs)
        )
        assert [o.stdout.strip() for o in outs] == [sb.loopback_ip for sb in sbs]
        assert len({sb.loopback_ip for sb in sbs}) == len(sbs)
        assert sorted(bwrap.allocator.in_use()) == sorted(sb.loopback_ip for sb in sbs)
    finally:
        await asyncio.gather(*(sb.aclose() for sb in sbs))
    assert bwrap.allocator.in_use() == []


async def test_default_rlimits_apply_inside(bwrap: BwrapRuntime) -> None:
    show = (
        "import resource as r; print(*(r.getrlimit(getattr(r, n))[1] for n in "
        "('RLIMIT_AS', 'RLIMIT_FSIZE', 'RLIMIT_NOFILE', 'RLIMIT_NPROC')))"
    )
    async with await bwrap.start() as sb:
        r = await sb.exec(f'python3 -c "{show}"', timeout=10)
        lim = SandboxLimits()
        want = (lim.memory_bytes, lim.file_size_bytes, lim.open_files)
        got = r.stdout.split()
        assert got[:3] == [str(v) for v in want]
        # RLIMIT_NPROC is per uid: only the fallback when no pids cgroup caps each sandbox.
        assert (got[3] == str(lim.max_processes)) == (bwrap.cgroups.pids is None), got


async def test_huge_write_and_runaway_allocation_are_stopped(bwrap: BwrapRuntime) -> None:
    limits = SandboxLimits(file_size_bytes=8 * MiB, memory_bytes=768 * MiB)
    async with await bwrap.start(SandboxSpec(limits=limits)) as sb:
        w = await sb.exec("head -c 100M /dev/zero > big; echo status=$?", timeout=20)
        assert "status=153" in w.stdout, w  # 128 + SIGXFSZ
        assert (sb.workspace / "big").stat().st_size == 8 * MiB
        m = await sb.exec("python3 -c 'b = bytearray(2 * 1024**3)'", timeout=20)
        assert m.exit_code == 1 and "MemoryError" in m.stderr, m


_FORK_BOMB = """
import subprocess
kids = []
try:
    for _ in range(60):
        kids.append(subprocess.Popen(["sleep", "30"]))
except OSError as exc:
    print("refused:", exc.errno)
print(len(kids))
for k in kids:
    k.kill()
    k.wait()
"""


async def test_process_cap(bwrap: BwrapRuntime) -> None:
    limits = SandboxLimits(max_processes=24)
    async with await bwrap.start(SandboxSpec(limits=limits)) as sb:
        r = await sb.exec(f"python3 -c '{_FORK_BOMB}'", timeout=20)
        if bwrap.pids_parent is None and os.getuid() == 0:
            assert "NOT ENFORCED" in bwrap.enforcement()["max_processes"]
            pytest.skip("no pids cgroup and root ignores RLIMIT_NPROC: cap not enforceable here")
        assert "refused: 11" in r.stdout, r  # EAGAIN from fork
        assert int(r.stdout.split()[-1]) < 24


@pytest.mark.parametrize("how", ["close", "cancel"])
async def test_close_or_cancel_mid_command_leaves_nothing(bwrap: BwrapRuntime, how: str) -> None:
    sb = await bwrap.start()
    os.mkfifo(sb.workspace / "ready")
    os.chmod(sb.workspace / "ready", 0o666)  # the sandbox may run as another uid (root server)
    # A plain child and one in its own session (escaped the group); the latter says when it runs.
    runner = 'import time; open("ready", "w").write("go"); time.sleep(1000)'
    cmd = f"sleep 1000 & setsid python3 -c '{runner}' & wait"
    running = asyncio.ensure_future(sb.exec(cmd, timeout=600))
    await asyncio.wait_for(asyncio.to_thread((sb.workspace / "ready").read_text), 20)
    tree = snapshot(descendants(sb.pid) | {sb.pid})
    assert any("time.sleep(1000)" in _cmd(p) for p in tree), tree
    assert len(tree) >= 6  # bwrap, its init, tool server, bash, sleep, python
    if how == "cancel":
        running.cancel()
        closing = asyncio.ensure_future(sb.aclose())
        await asyncio.sleep(0)  # let aclose start, then cancel it too
        closing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await closing
    else:
        await sb.aclose()
    await asyncio.wait([running])
    if not running.cancelled():  # closed under it: the call fails instead of hanging
        assert isinstance(running.exception(), ToolServerError)
    assert still_running(tree) == []
    assert not sb.layout.root.exists()
    assert bwrap.records.load() == [] and bwrap.allocator.in_use() == []
    await sb.aclose()  # idempotent


async def test_64_concurrent_sandboxes(bwrap: BwrapRuntime) -> None:
    sbs = await asyncio.gather(*(bwrap.start() for _ in range(64)))
    try:
        assert bwrap.live == 64
        outs = await asyncio.gather(*(sb.exec("echo $SANDBOX_ID") for sb in sbs))
        assert [o.stdout.strip() for o in outs] == [sb.id for sb in sbs]
        tree = snapshot({p for sb in sbs for p in descendants(sb.pid) | {sb.pid}})
    finally:
        await asyncio.gather(*(sb.aclose() for sb in sbs))
    assert bwrap.live == 0 and still_running(tree) == []
    assert bwrap.allocator.in_use() == [] and bwrap.records.load() == []


async def test_failed_start_reports_output_and_cleans_up(config: RuntimeConfig) -> None:
    bad = BwrapRuntime(msgspec.structs.replace(config, python="/nonexistent/python"))
    with pytest.raises(SandboxStartError, match="exited with status .*nonexistent"):
        await bad.start()
    assert bad.live == 0 and bad.records.load() == [] and bad.allocator.in_use() == []
    await bad.aclose()


async def test_bad_spec_is_rejected_before_anything_starts(bwrap: BwrapRuntime) -> None:
    with pytest.raises(SpecError, match="files"):
        await bwrap.start(SandboxSpec(files={"../escape": "x"}))
    assert bwrap.live == 0


def _inherited_fds(pid: int) -> list[str]:
    fds = Path(f"/proc/{pid}/fd")
    targets = [os.readlink(fds / name) for name in os.listdir(fds)]
    return [t for t in targets if t.startswith(("socket:", "pipe:"))]


def _cmd(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""
