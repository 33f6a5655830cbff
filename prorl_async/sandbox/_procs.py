"""Process helpers: /proc parsing, pid-reuse-safe signalling and waiting on exits via pidfds."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Iterable

__all__ = ["descendants", "kill_all", "start_time", "wait_exited"]


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return None
    # comm may contain spaces and parens: the fields proper start after the last ')'.
    return raw.rsplit(")", 1)[1].split()


def start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (field 22), or None if it is gone."""
    fields = _stat_fields(pid)
    if fields is None or fields[0] == "Z":
        return None
    return int(fields[19])


def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = _stat_fields(int(name))
            if fields is not None and fields[0] != "Z":
                kids.setdefault(int(fields[1]), []).append(int(name))
    return kids


def descendants(pid: int) -> set[int]:
    """Live descendants of ``pid`` (a snapshot; callers re-check after killing)."""
    kids = _children_map()
    out: set[int] = set()
    stack = [pid]
    while stack:
        for child in kids.get(stack.pop(), ()):
            if child not in out:
                out.add(child)
                stack.append(child)
    return out


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (ProcessLookupError, OSError):
        return None


def kill_all(pids: Iterable[int], sig: int = signal.SIGKILL) -> None:
    """Signal every pid that still exists; a vanished pid is not an error."""
    for pid in pids:
        fd = _pidfd(pid)
        if fd is None:
            continue
        try:
            signal.pidfd_send_signal(fd, sig)
        except ProcessLookupError:
            pass
        finally:
            os.close(fd)


async def wait_exited(pids: Iterable[int], timeout: float) -> set[int]:
    """Wait until every pid has exited (pidfd readable) or ``timeout``; return those still alive."""
    loop = asyncio.get_running_loop()
    waits: dict[int, tuple[int, asyncio.Future[None]]] = {}
    for pid in pids:
        fd = _pidfd(pid)
        if fd is None:
            continue
        fut: asyncio.Future[None] = loop.create_future()
        loop.add_reader(fd, _resolve, fut)
        waits[pid] = (fd, fut)
    try:
        if waits:
            await asyncio.wait([f for _, f in waits.values()], timeout=timeout)
        return {pid for pid, (_, fut) in waits.items() if not fut.done()}
    finally:
        for fd, _ in waits.values():
            loop.remove_reader(fd)
            with contextlib.suppress(OSError):
                os.close(fd)


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
