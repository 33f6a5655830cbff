"""Process helpers shared by the sandbox runtimes and the tool server.

/proc parsing, tree and session walks, pid-reuse-safe signalling and waiting on
exits via pidfds.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Iterable

__all__ = [
    "descendants",
    "kill_all",
    "kill_tree",
    "session_and_descendants",
    "start_time",
    "wait_exited",
]


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


def _process_table() -> list[tuple[int, int, int]]:
    """(pid, ppid, session id) of every live, non-zombie process."""
    table = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = _stat_fields(int(name))
            if fields is not None and fields[0] != "Z":
                table.append((int(name), int(fields[1]), int(fields[3])))
    return table


def _walk(root: int, table: list[tuple[int, int, int]], found: set[int]) -> set[int]:
    kids: dict[int, list[int]] = {}
    for pid, ppid, _ in table:
        kids.setdefault(ppid, []).append(pid)
    stack = [root]
    while stack:
        for child in kids.get(stack.pop(), ()):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def descendants(pid: int) -> set[int]:
    """Live descendants of ``pid`` (a snapshot; callers re-check after killing)."""
    return _walk(pid, _process_table(), set())


def session_and_descendants(root: int) -> set[int]:
    """Live processes in ``root``'s session plus ``root``'s descendants (``root`` excluded).

    Orphans reparented away from ``root`` still share its session, so a session
    scan finds background jobs that a plain tree walk would miss.
    """
    table = _process_table()
    found = _walk(root, table, {pid for pid, _, sid in table if sid == root})
    found.discard(root)
    return found


def kill_tree(root: int) -> None:
    """SIGKILL ``root``, its descendants and its session members (found before and after)."""
    before = session_and_descendants(root)
    kill_all([root])  # first, so it forks nothing new while we sweep
    kill_all(before | session_and_descendants(root))


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
