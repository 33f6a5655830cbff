"""A per-sandbox pids cgroup, where this process may create one (v1 ``pids`` or delegated v2).

The cgroup caps the number of processes per sandbox (``RLIMIT_NPROC`` cannot for
root) and gives teardown a complete list of the sandbox's processes, including
ones that escaped the process group or were reparented.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from pathlib import Path

from prorl_async._procs import kill_all, wait_exited

__all__ = ["PidsCgroup", "find_pids_parent"]

log = logging.getLogger(__name__)

_ROOT = Path("/sys/fs/cgroup")


def _own_cgroups() -> dict[str, str]:
    """``controller list -> path`` from /proc/self/cgroup (``""`` is the v2 entry)."""
    out: dict[str, str] = {}
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                out[controllers] = path
    except OSError:
        pass
    return out


def _candidates() -> list[Path]:
    own = _own_cgroups()
    found = []
    for controllers, path in own.items():
        if "pids" in controllers.split(","):
            found.append(_ROOT / "pids" / path.lstrip("/"))
    if "" in own and (_ROOT / "cgroup.controllers").exists():
        v2 = _ROOT / own[""].lstrip("/")
        if "pids" in _read(v2 / "cgroup.subtree_control").split():
            found.append(v2)
    return found


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _probe(parent: Path) -> bool:
    probe = parent / f"prorl-probe-{uuid.uuid4().hex[:8]}"
    try:
        probe.mkdir()
    except OSError:
        return False
    try:
        return (probe / "pids.max").exists()
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()


def find_pids_parent(explicit: str | None = None) -> Path | None:
    """The directory under which sandbox pids cgroups can be created, or None."""
    if explicit is not None:
        return Path(explicit) if _probe(Path(explicit)) else None
    for parent in _candidates():
        if _probe(parent):
            return parent
    return None


class PidsCgroup:
    """One sandbox's cgroup: created with ``pids.max``, emptied and removed by ``aclose``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, parent: Path, name: str, max_pids: int | None) -> PidsCgroup:
        """Make ``parent/name`` and set its ``pids.max``."""
        path = parent / name
        path.mkdir()
        if max_pids is not None:
            (path / "pids.max").write_text(str(max_pids))
        return cls(path)

    @property
    def procs_file(self) -> Path:
        return self.path / "cgroup.procs"

    def pids(self) -> set[int]:
        """Processes currently in the cgroup."""
        return {int(x) for x in _read(self.procs_file).split()}

    async def kill_and_remove(self, timeout: float = 5.0) -> None:
        """SIGKILL everything inside, wait for the exits, then remove the directory."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while (pids := self.pids()) and loop.time() < deadline:
            # Re-read after each round: a process may have forked while being killed.
            kill_all(pids)
            left = await wait_exited(pids, max(0.0, deadline - loop.time()))
            if not left and self.pids() == pids:
                break  # only exited-but-unreaped entries remain; their parent reaps them
        try:
            self.path.rmdir()
        except OSError as exc:
            log.warning("could not remove cgroup %s: %s", self.path, exc)
