"""A size-capped tmpfs holding one sandbox's writable directories (workspace, /tmp, socket).

Workspace and ``/tmp`` live on one tmpfs, so its size caps them *together*: a
write past it fails with ENOSPC ("No space left on device"), a clear error for
the tool call. Mounting needs ``CAP_SYS_ADMIN`` (a server running as root); other
servers fall back to bwrap's ``--size`` for ``/tmp`` alone. tmpfs pages are charged
to the memory cgroup of the process writing them, so the sandbox's memory cap
covers them too.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import shutil
from functools import cache

__all__ = ["can_mount", "mount_tmpfs", "remove_tree"]

log = logging.getLogger(__name__)

_MNT_DETACH = 2
_MS_NOSUID, _MS_NODEV = 2, 4


@cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def can_mount() -> bool:
    """Whether this process may mount a tmpfs (root in the initial namespaces)."""
    return os.geteuid() == 0


def mount_tmpfs(path: str, size: int) -> None:
    """Mount a fresh tmpfs of ``size`` bytes on ``path`` (mode 0711: reachable, not listable)."""
    opts = f"size={size},mode=0711".encode()
    flags = _MS_NOSUID | _MS_NODEV
    if _libc().mount(b"tmpfs", path.encode(), b"tmpfs", flags, opts) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount tmpfs on {path}: {os.strerror(err)}")


def _unmount(path: str) -> None:
    if os.path.ismount(path) and _libc().umount2(path.encode(), _MNT_DETACH) != 0:
        err = ctypes.get_errno()
        log.warning("could not unmount %s: %s", path, os.strerror(err))


def remove_tree(path: str) -> None:
    """Unmount ``path`` if it is a mount point, then remove it and everything under it."""
    _unmount(path)
    shutil.rmtree(path, ignore_errors=True)
