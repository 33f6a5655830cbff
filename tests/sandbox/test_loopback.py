"""The loopback allocator: unique across tasks and processes, released on close or death."""

from __future__ import annotations

import asyncio
import ipaddress
import sys
from pathlib import Path

import pytest

from prorl_async.sandbox import LoopbackAllocator

_HOLDER = """
import sys
from prorl_async.sandbox import LoopbackAllocator
lease = LoopbackAllocator(sys.argv[1]).acquire()
print(lease.ip, flush=True)
sys.stdin.read()  # hold the address until the test closes stdin or kills us
"""


def test_addresses_are_unique_loopback_and_released(tmp_path: Path) -> None:
    alloc = LoopbackAllocator(tmp_path)
    leases = [alloc.acquire() for _ in range(300)]
    ips = {lease.ip for lease in leases}
    assert len(ips) == 300
    for ip in ips:
        addr = ipaddress.IPv4Address(ip)
        assert addr.is_loopback and not ip.startswith("127.0.")
    assert sorted(alloc.in_use()) == sorted(ips)
    held = leases[0]
    assert alloc.try_acquire(held.ip) is None  # a second lock in the same process is refused
    for lease in leases:
        lease.release()
        lease.release()  # idempotent
    assert alloc.in_use() == []
    assert list(tmp_path.iterdir()) == []  # files are unlinked on release
    again = alloc.try_acquire(held.ip)
    assert again is not None
    again.release()


def test_rejects_addresses_outside_the_pool(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="outside"):
        LoopbackAllocator(tmp_path).try_acquire("127.0.0.1")


async def test_exclusive_across_processes_and_freed_when_holder_dies(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _HOLDER,
        str(tmp_path),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        ip = (await proc.stdout.readline()).decode().strip()
        alloc = LoopbackAllocator(tmp_path)
        assert alloc.in_use() == [ip]
        assert alloc.try_acquire(ip) is None
    finally:
        proc.kill()  # no release: the kernel must drop the lock with the process
        await proc.wait()
    lease = alloc.try_acquire(ip)
    assert lease is not None
    lease.release()


async def test_concurrent_threads_get_distinct_addresses(tmp_path: Path) -> None:
    alloc = LoopbackAllocator(tmp_path)
    leases = await asyncio.gather(*(asyncio.to_thread(alloc.acquire) for _ in range(64)))
    assert len({lease.ip for lease in leases}) == 64
    for lease in leases:
        lease.release()
