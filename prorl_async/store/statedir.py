"""One server per state directory: an ``flock``'d lock file naming its holder.

The kernel drops the lock when the holder dies (kill -9 included), so a crashed
server never blocks its successor; a live one makes a second ``serve`` on the same
directory refuse with the holder's pid and address.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from pathlib import Path

__all__ = ["StateDirBusy", "StateDirLock", "set_aside"]

LOCK_NAME = "server.lock"


class StateDirBusy(RuntimeError):
    """Another live server holds the state directory; the message names it."""


class StateDirLock:
    """Held from ``acquire()`` until ``release()`` (idempotent) or the process ends."""

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.path = Path(state_dir) / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise ``StateDirBusy`` naming the process that holds it."""
        if self._fd is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe(os.pread(fd, 4096, 0))
            os.close(fd)
            raise StateDirBusy(
                f"state dir {self.path.parent} is in use by another prorl-async server "
                f"({holder}); stop it or pass a different --state-dir"
            ) from None
        self._fd = fd
        self.announce(None)

    def announce(self, url: str | None) -> None:
        """Write who holds the lock (pid, and the address once listening)."""
        if self._fd is None:
            return
        body = json.dumps({"pid": os.getpid(), "url": url}).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, body, 0)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def _describe(raw: bytes) -> str:
    try:
        info = json.loads(raw)
        pid, url = info.get("pid"), info.get("url")
    except (ValueError, AttributeError):
        return "holder unknown"
    return f"pid {pid}" + (f", listening on {url}" if url else "")


def set_aside(path: Path) -> Path | None:
    """Rename a database (and its WAL files) to ``<name>.<UTC timestamp>``; never deletes."""
    if not path.exists():
        return None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = path.with_name(f"{path.name}.{stamp}")
    os.replace(path, target)
    for suffix in ("-wal", "-shm"):
        side = path.with_name(path.name + suffix)
        with contextlib.suppress(FileNotFoundError):
            os.replace(side, target.with_name(target.name + suffix))
    return target
