"""Machine-wide allocator of per-sandbox loopback addresses (``127.x.y.z``).

Every address is a file in one shared directory, held with ``flock``. The lock
belongs to the open file description, so it is exclusive between tasks of one
process as much as between processes, and the kernel drops it when the holder
dies: a crashed server never leaks an address. A freed address's file is
unlinked; the inode check after locking closes the unlink/lock race (a holder
that locked a file someone else just unlinked retries instead of sharing the
address with whoever creates the file next).

Peers connecting to a ``127.x`` alias appear as ``127.0.0.1`` unless they bind
their source address, so the address is for *binding* services, never for
identifying a sandbox by its peer address.
"""

from __future__ import annotations

import errno
import fcntl
import ipaddress
import os
import random
from pathlib import Path

__all__ = ["DEFAULT_LOOPBACK_DIR", "LoopbackAllocator", "LoopbackExhaustedError", "LoopbackLease"]

DEFAULT_LOOPBACK_DIR = "/tmp/prorl-async-loopback"

# 127.0.0.0/16 is left alone: 127.0.0.1 and Debian's 127.0.1.1 hostname live there.
_FIRST = int(ipaddress.IPv4Address("127.1.0.1"))
_LAST = int(ipaddress.IPv4Address("127.254.255.254"))


class LoopbackExhaustedError(RuntimeError):
    """No free loopback address was found after the configured number of tries."""


class LoopbackLease:
    """One held address. ``release()`` is idempotent; the lock dies with the process anyway."""

    __slots__ = ("ip", "_path", "_fd")

    def __init__(self, ip: str, path: Path, fd: int) -> None:
        self.ip = ip
        self._path = path
        self._fd: int | None = fd

    @property
    def path(self) -> Path:
        """The lock file (recorded so a successor can remove it after a crash)."""
        return self._path

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Unlink the address file (while still locked) and drop the lock."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            self._path.unlink(missing_ok=True)
        except OSError:
            pass  # another user's sticky dir entry: leaving the file is harmless
        os.close(fd)

    def __repr__(self) -> str:
        return f"LoopbackLease({self.ip!r}, held={self.held})"


class LoopbackAllocator:
    """Hands out unique loopback addresses, safe across tasks and server processes."""

    def __init__(self, directory: str | os.PathLike[str] = DEFAULT_LOOPBACK_DIR) -> None:
        self.directory = Path(directory)
        self._rng = random.Random()

    def acquire(self, *, tries: int = 1000) -> LoopbackLease:
        """Lock and return a free address; raise ``LoopbackExhaustedError`` if none is found."""
        self._ensure_dir()
        for _ in range(tries):
            ip = str(ipaddress.IPv4Address(self._rng.randint(_FIRST, _LAST)))
            lease = self._try_lock(ip)
            if lease is not None:
                return lease
        raise LoopbackExhaustedError(
            f"no free loopback address in {self.directory} after {tries} tries"
        )

    def try_acquire(self, ip: str) -> LoopbackLease | None:
        """Lock one specific address, or None if another holder has it."""
        addr = ipaddress.IPv4Address(ip)
        if not _FIRST <= int(addr) <= _LAST:
            raise ValueError(f"loopback address {ip} is outside 127.1.0.1-127.254.255.254")
        self._ensure_dir()
        return self._try_lock(str(addr))

    def in_use(self) -> list[str]:
        """Addresses currently locked by any process (for diagnostics and tests)."""
        out = []
        for name in sorted(os.listdir(self.directory)) if self.directory.is_dir() else []:
            fd = self._open(self.directory / name)
            if fd is None:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                out.append(name)
            finally:
                os.close(fd)
        return out

    def _ensure_dir(self) -> None:
        if self.directory.is_dir():
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        try:
            # World-writable + sticky: servers run by different users share the namespace.
            os.chmod(self.directory, 0o1777)
        except PermissionError:
            pass

    def _open(self, path: Path) -> int | None:
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except PermissionError:
            pass  # another user's file: a read-only fd still takes an flock
        try:
            return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.EACCES):
                return None
            raise

    def _try_lock(self, ip: str) -> LoopbackLease | None:
        path = self.directory / ip
        fd = self._open(path)
        if fd is None:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        if not _same_file(fd, path):
            os.close(fd)  # we locked a file that its previous holder had just unlinked
            return None
        return LoopbackLease(ip, path, fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = path.stat()
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)
