"""Finding and killing every process a tool started, including ones that left the tree."""

from __future__ import annotations

import os
import signal

__all__ = ["kill_tree", "session_and_descendants"]


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    # the command name may contain spaces and parens: split after the last ')'
    return stat.rsplit(")", 1)[1].split()


def session_and_descendants(root: int) -> set[int]:
    """Live processes in ``root``'s session plus ``root``'s descendants (``root`` excluded).

    Orphans reparented away from ``root`` still share its session, so a session
    scan finds background jobs that a plain tree walk would miss.
    """
    children: dict[int, list[int]] = {}
    found: set[int] = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = _stat_fields(int(name))
        if fields is None or fields[0] == "Z":
            continue
        ppid, sid = int(fields[1]), int(fields[3])
        children.setdefault(ppid, []).append(int(name))
        if sid == root:
            found.add(int(name))
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    found.discard(root)
    return found


def kill_tree(root: int) -> None:
    """SIGKILL ``root``, its descendants and its session members (found before and after)."""
    before = session_and_descendants(root)
    _kill(root)  # first, so it forks nothing new while we sweep
    for pid in before | session_and_descendants(root):
        _kill(pid)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # already gone
