"""Sandbox network (issue #11, finding 4): off unless allowed; when on, a user-mode stack in
the sandbox's own namespace reaches outside addresses but never the host's 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator

import msgspec
import pytest

from prorl_async.sandbox import BwrapRuntime, RuntimeConfig, SandboxSpec, SpecError
from prorl_async.sandbox.network import find_slirp4netns
from tests.conftest import require

_CONNECT = """
import socket, sys
try:
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
    print("GOT", s.recv(64).decode())
except OSError as exc:
    print("FAILED", type(exc).__name__)
"""

# Answers every connection with its greeting; runs inside the test's own netns.
_GREETER = """
import socket, sys
srv = socket.create_server((sys.argv[1], 0))
print(srv.getsockname()[1], flush=True)
while True:
    conn, _ = srv.accept()
    conn.sendall(b"outside-hello")
    conn.close()
"""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@contextlib.asynccontextmanager
async def outside_server() -> AsyncIterator[tuple[str, int]]:
    """A TCP server in a network namespace this test creates (veth to the host): an "outside"
    address that is none of the host's own."""
    require(shutil.which("ip") is not None, "no iproute2 (ip)")
    require(os.geteuid() == 0, "ip netns (the test's outside address) needs root")
    tag = uuid.uuid4().hex[:6]
    ns, host_if, ns_if = f"prorl-t{tag}", f"pvh{tag}", f"pvn{tag}"
    net = f"10.{random.randrange(200, 250)}.{random.randrange(256)}"
    _ip("netns", "add", ns)
    proc = None
    try:
        _ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        _ip("link", "set", ns_if, "netns", ns)
        _ip("addr", "add", f"{net}.1/24", "dev", host_if)
        _ip("link", "set", host_if, "up")
        _ip("-n", ns, "addr", "add", f"{net}.2/24", "dev", ns_if)
        _ip("-n", ns, "link", "set", ns_if, "up")
        proc = await asyncio.create_subprocess_exec(
            "ip",
            "netns",
            "exec",
            ns,
            "python3",
            "-c",
            _GREETER,
            f"{net}.2",
            stdout=asyncio.subprocess.PIPE,
        )
        assert proc.stdout is not None
        port = int(await asyncio.wait_for(proc.stdout.readline(), 10))
        yield f"{net}.2", port
    finally:
        if proc is not None and proc.returncode is None:
            proc.kill()
            await proc.wait()
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("link", "del", host_if)
        _ip("netns", "del", ns)


async def _host_listener() -> tuple[asyncio.Server, int]:
    async def greet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"host-loopback")
        writer.close()

    server = await asyncio.start_server(greet, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_network_refused_unless_allowed(config: RuntimeConfig) -> None:
    bwrap = BwrapRuntime(config)
    try:
        with pytest.raises(SpecError, match="allow_network"):
            await bwrap.start(SandboxSpec(network=True))
        assert bwrap.live == 0
    finally:
        await bwrap.aclose()


async def test_allowed_network_reaches_outside_but_not_host_loopback(
    config: RuntimeConfig,
) -> None:
    require(find_slirp4netns() is not None, "slirp4netns is not installed")
    bwrap = BwrapRuntime(msgspec.structs.replace(config, allow_network=True))
    server, port = await _host_listener()
    spec = SandboxSpec(network=True, files={"c.py": _CONNECT})
    try:
        async with server, outside_server() as (addr, out_port), await bwrap.start(spec) as sb:
            outside = await sb.exec(f"python3 c.py {addr} {out_port}", timeout=20)
            assert outside.stdout.split() == ["GOT", "outside-hello"], outside
            for host in ("127.0.0.1", "10.0.2.2"):  # the sandbox's own lo; slirp's host alias
                r = await sb.exec(f"python3 c.py {host} {port}", timeout=20)
                assert r.stdout.split()[0] == "FAILED", (host, r)
        assert bwrap.live == 0
    finally:
        await bwrap.aclose()
