"""A per-sandbox cgroup (pids and memory), where this process may create one (v1 or delegated v2).

The pids controller caps the number of processes per sandbox (``RLIMIT_NPROC``
cannot for root); the memory controller caps the memory of all the sandbox's
processes together, tmpfs pages they write included, so going over is an OOM kill
inside the sandbox, never the host's memory. Either also gives teardown a complete
list of the sandbox's processes, including ones that escaped the process group.
On cgroup v1 each controller is its own hierarchy, so a sandbox has one directory
per controller; on v2 one directory holds both.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from dataclasses import dataclass
from pathlib import Path

from prorl_async.util.procs import kill_all, wait_exited

__all__ = ["CgroupParents", "SandboxCgroup", "find_cgroup_parents", "find_pids_parent"]

log = logging.getLogger(__name__)

_ROOT = Path("/sys/fs/cgroup")
# controller -> (v1 limit file, v2 limit file)
_LIMIT_FILES = {"pids": ("pids.max", "pids.max"), "memory": ("memory.limit_in_bytes", "memory.max")}


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


def _candidates(controller: str) -> list[Path]:
    own = _own_cgroups()
    found = []
    for controllers, path in own.items():
        if controller in controllers.split(","):
            found.append(_ROOT / controller / path.lstrip("/"))
    if "" in own and (_ROOT / "cgroup.controllers").exists():
        v2 = _ROOT / own[""].lstrip("/")
        if controller in _read(v2 / "cgroup.subtree_control").split():
            found.append(v2)
    return found


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _limit_file(parent: Path, controller: str) -> str:
    v1, v2 = _LIMIT_FILES[controller]
    return v2 if (parent / "cgroup.controllers").exists() else v1


def _probe(parent: Path, controller: str) -> bool:
    probe = parent / f"prorl-probe-{uuid.uuid4().hex[:8]}"
    try:
        probe.mkdir()
    except OSError:
        return False
    try:
        return (probe / _limit_file(parent, controller)).exists()
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()


def _find_parent(controller: str, explicit: str | None) -> Path | None:
    if explicit is not None:
        return Path(explicit) if _probe(Path(explicit), controller) else None
    for parent in _candidates(controller):
        if _probe(parent, controller):
            return parent
    return None


def find_pids_parent(explicit: str | None = None) -> Path | None:
    """The directory under which sandbox pids cgroups can be created, or None."""
    return _find_parent("pids", explicit)


@dataclass(frozen=True, slots=True)
class CgroupParents:
    """Where sandbox cgroups go, per controller (None: that controller is not available)."""

    pids: Path | None = None
    memory: Path | None = None


def find_cgroup_parents(explicit: str | None = None) -> CgroupParents:
    """Parents for the pids and memory controllers; ``explicit == ""`` disables both."""
    if explicit == "":
        return CgroupParents()
    return CgroupParents(_find_parent("pids", explicit), _find_parent("memory", explicit))


def _no_swap_beyond(path: Path, memory: int) -> None:
    # Where swap exists, memory + swap together get the same cap (v1), or no swap at all (v2).
    for name, value in (("memory.memsw.limit_in_bytes", str(memory)), ("memory.swap.max", "0")):
        if (path / name).exists():
            (path / name).write_text(value)


class SandboxCgroup:
    """One sandbox's cgroup directories: created with their limits, emptied and removed by
    ``kill_and_remove``."""

    def __init__(self, paths: tuple[Path, ...]) -> None:
        self.paths = paths

    @classmethod
    def create(
        cls, parents: CgroupParents, name: str, *, max_pids: int | None, memory: int | None
    ) -> SandboxCgroup | None:
        """Make ``parent/name`` for each available controller and set its limit."""
        wanted = {"pids": (parents.pids, max_pids), "memory": (parents.memory, memory)}
        made: dict[Path, Path] = {}
        try:
            for controller, (parent, value) in wanted.items():
                if parent is None:
                    continue
                path = made.get(parent) or parent / name
                if path not in made.values():
                    path.mkdir()
                    made[parent] = path
                if value is not None:
                    (path / _limit_file(parent, controller)).write_text(str(value))
                    if controller == "memory":
                        _no_swap_beyond(path, value)
        except BaseException:
            for path in made.values():
                with contextlib.suppress(OSError):
                    path.rmdir()
            raise
        return cls(tuple(made.values())) if made else None

    @property
    def procs_files(self) -> list[Path]:
        return [p / "cgroup.procs" for p in self.paths]

    def pids(self) -> set[int]:
        """Processes currently in the cgroup."""
        return {int(x) for f in self.procs_files for x in _read(f).split()}

    def memory_peak(self) -> int | None:
        """Highest memory use of the sandbox so far, in bytes, where the kernel reports it."""
        for path in self.paths:
            for name in ("memory.max_usage_in_bytes", "memory.peak"):
                text = _read(path / name).strip()
                if text:
                    return int(text)
        return None

    async def kill_and_remove(self, timeout: float = 5.0) -> None:
        """SIGKILL everything inside, wait for the exits, then remove the directories."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while (pids := self.pids()) and loop.time() < deadline:
            # Re-read after each round: a process may have forked while being killed.
            kill_all(pids)
            left = await wait_exited(pids, max(0.0, deadline - loop.time()))
            if not left and self.pids() == pids:
                break  # only exited-but-unreaped entries remain; their parent reaps them
        for path in self.paths:
            try:
                path.rmdir()
            except OSError as exc:
                log.warning("could not remove cgroup %s: %s", path, exc)
