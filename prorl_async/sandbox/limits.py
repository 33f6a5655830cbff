"""Per-sandbox resource limits: rlimits through ``prlimit(1)`` and a pids cgroup where delegated.

Rlimits are applied by prefixing the sandbox command with ``prlimit``, so they are
set in the child *before* anything untrusted runs and are inherited by every
process in the sandbox. ``preexec_fn`` is avoided on purpose: it is unsafe in a
threaded server (a lock held by another thread at fork time deadlocks the child).

What binds where (``describe_enforcement`` reports it at start-up):
- ``RLIMIT_AS``, ``RLIMIT_FSIZE``, ``RLIMIT_NOFILE``, ``RLIMIT_CPU`` are per process.
- ``RLIMIT_NPROC`` counts processes per real uid and the kernel ignores it for
  root (uid 0 or ``CAP_SYS_RESOURCE``/``CAP_SYS_ADMIN``); only a pids cgroup gives a
  per-sandbox process cap then. One is used when this process may create child
  cgroups in its pids hierarchy (cgroup v1 ``pids`` or a delegated v2 subtree).
- ``sandbox_memory_bytes`` is for all the sandbox's processes together: a memory
  cgroup (v1 ``memory`` or delegated v2), where one can be created.
- ``disk_bytes`` caps workspace and ``/tmp`` together: a size-capped tmpfs (see
  ``disk.py``); without mount rights, bwrap's ``--size`` caps ``/tmp`` alone.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import msgspec

__all__ = [
    "LimitsError",
    "SandboxLimits",
    "describe_enforcement",
    "nproc_binds",
    "prlimit_argv",
]

GiB = 1 << 30
MiB = 1 << 20


class LimitsError(ValueError):
    """A limit value was invalid; the message names it."""


class SandboxLimits(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Resource caps for one sandbox. ``None`` leaves a limit unset (inherited)."""

    # Address space per process: stops a runaway allocation with MemoryError/ENOMEM.
    memory_bytes: int | None = 4 * GiB
    # Memory of all the sandbox's processes together (memory cgroup): OOM kill inside past it.
    sandbox_memory_bytes: int | None = 4 * GiB
    # Workspace and /tmp together (size-capped tmpfs): writes past it fail with ENOSPC.
    disk_bytes: int | None = 2 * GiB
    # Largest file any process may write: a 10 GB write dies with SIGXFSZ at this size.
    file_size_bytes: int | None = 1 * GiB
    # CPU seconds per process (SIGXCPU, then SIGKILL at the hard limit).
    cpu_seconds: int | None = 3600
    # Processes in the sandbox (pids cgroup) and, as a fallback, RLIMIT_NPROC per uid.
    max_processes: int | None = 512
    open_files: int | None = 1024
    # Output kept from one exec/tool call; the rest is dropped and the result marked truncated.
    output_bytes: int = 1 * MiB

    def validate(self) -> None:
        """Raise ``LimitsError`` naming the first non-positive limit."""
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise LimitsError(f"limits.{name} must be > 0 or null, got {value}")


_PRLIMIT_FLAGS = (
    ("memory_bytes", "--as"),
    ("file_size_bytes", "--fsize"),
    ("cpu_seconds", "--cpu"),
    ("max_processes", "--nproc"),
    ("open_files", "--nofile"),
)


def prlimit_binary() -> str:
    """Path of ``prlimit`` (util-linux); a clear error when it is missing."""
    path = shutil.which("prlimit") or (
        "/usr/bin/prlimit" if os.path.exists("/usr/bin/prlimit") else None
    )
    if path is None:
        raise LimitsError(
            "prlimit (util-linux) not found on PATH: it is needed to apply sandbox limits"
        )
    return path


def prlimit_argv(limits: SandboxLimits, *, nproc: bool = True) -> list[str]:
    """``prlimit --as=N:N ... --`` prefix setting soft = hard for every configured limit.

    ``nproc=False`` leaves ``RLIMIT_NPROC`` out: where a pids cgroup caps each sandbox, a
    per-uid count shared by every sandbox of the same uid would only get in the way.
    """
    limits.validate()
    argv = [prlimit_binary()]
    for field, flag in _PRLIMIT_FLAGS:
        value = getattr(limits, field)
        if value is not None and (nproc or field != "max_processes"):
            argv.append(f"{flag}={value}:{value}")
    argv.append("--")
    return argv


def _effective_caps() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


def nproc_binds() -> bool:
    """Whether the kernel enforces ``RLIMIT_NPROC`` on processes this server starts."""
    cap_sys_admin, cap_sys_resource = 1 << 21, 1 << 24
    if os.getuid() == 0:
        return False
    return not _effective_caps() & (cap_sys_admin | cap_sys_resource)


def describe_enforcement(
    limits: SandboxLimits,
    pids_cgroup: Path | None,
    *,
    memory_cgroup: Path | None = None,
    disk: str | None = None,
) -> dict[str, str]:
    """Human-readable account of how each limit is enforced on this machine.

    ``disk`` says what caps ``disk_bytes`` here (None: nothing does).
    """
    out: dict[str, str] = {}
    for field, flag in _PRLIMIT_FLAGS:
        value = getattr(limits, field)
        if value is None:
            out[field] = "unset"
        elif field != "max_processes":
            out[field] = f"RLIMIT_{flag[2:].upper()}={value} per process"
    out["max_processes"] = _describe_processes(limits.max_processes, pids_cgroup)
    out["sandbox_memory_bytes"] = _describe_memory(limits.sandbox_memory_bytes, memory_cgroup)
    out["disk_bytes"] = _describe_disk(limits.disk_bytes, disk)
    out["output_bytes"] = f"{limits.output_bytes} bytes kept per exec/tool call"
    return out


def _describe_memory(value: int | None, memory_cgroup: Path | None) -> str:
    if value is None:
        return "unset"
    if memory_cgroup is None:
        return "NOT ENFORCED: no memory cgroup can be created here (per-process RLIMIT_AS only)"
    return f"memory cgroup limit={value} for all processes of a sandbox under {memory_cgroup}"


def _describe_disk(value: int | None, disk: str | None) -> str:
    if value is None:
        return "unset"
    if disk is None:
        return "NOT ENFORCED: no size-capped tmpfs here (per-file RLIMIT_FSIZE only)"
    return f"{value} bytes by {disk}"


def _describe_processes(value: int | None, pids_cgroup: Path | None) -> str:
    if value is None:
        return "unset"
    if pids_cgroup is not None:
        return f"pids cgroup pids.max={value} per sandbox under {pids_cgroup}"
    if nproc_binds():
        return f"RLIMIT_NPROC={value} (counts every process of this uid, not per sandbox)"
    return "NOT ENFORCED: running as root ignores RLIMIT_NPROC and no pids cgroup is delegated"
