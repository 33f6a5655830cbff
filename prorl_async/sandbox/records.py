"""Records of live sandboxes in the server's state directory, for reaping after a crash.

Each live sandbox is one small JSON file naming its process (pid + start time from
``/proc/PID/stat``), its owner server process (pid + start time), and the paths it
holds. At start-up ``reap_stale()`` cleans up after owners that are gone: it kills
what is left of each sandbox, empties and removes its cgroups, removes its
directories and its loopback lock file, also when the sandbox's own pid is already
gone (``--die-with-parent`` usually ends it with its server). A pid is only
signalled when its start time still matches the record, so a pid the kernel has
since reused for an unrelated process is never killed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from pathlib import Path

import msgspec

from prorl_async.sandbox.disk import remove_tree
from prorl_async.sandbox.loopback import LoopbackAllocator
from prorl_async.util.procs import descendants, kill_all, start_time

__all__ = ["SandboxRecord", "SandboxRecords"]

log = logging.getLogger(__name__)


class SandboxRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What is needed to find and kill one sandbox later."""

    sandbox_id: str
    pid: int
    start_time: int
    owner_pid: int
    owner_start_time: int
    runtime: str
    # Host directories owned by the sandbox (socket dir, workspace); removed when reaped.
    paths: tuple[str, ...] = ()
    cgroup: str | None = None
    # Further cgroup directories (one per controller hierarchy), if any.
    cgroups: tuple[str, ...] = ()
    # The loopback address lock file (LoopbackAllocator); removed if no one holds it.
    loopback: str | None = None

    def cgroup_paths(self) -> tuple[str, ...]:
        first = (self.cgroup,) if self.cgroup is not None else ()
        return first + tuple(c for c in self.cgroups if c != self.cgroup)


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(SandboxRecord)


def _alive(pid: int, started: int) -> bool:
    return start_time(pid) == started


class SandboxRecords:
    """A directory of ``<sandbox_id>.json`` records under ``state_dir/sandboxes``."""

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.directory = Path(state_dir) / "sandboxes"
        self._owner_pid = os.getpid()
        self._owner_start = start_time(self._owner_pid) or 0

    def add(
        self,
        sandbox_id: str,
        pid: int,
        *,
        runtime: str,
        paths: tuple[str, ...] = (),
        cgroup: str | None = None,
        cgroups: tuple[str, ...] = (),
        loopback: str | None = None,
    ) -> SandboxRecord:
        """Record a running sandbox; written atomically (temp file + rename)."""
        started = start_time(pid)
        if started is None:
            raise ProcessLookupError(f"sandbox {sandbox_id}: pid {pid} is not running")
        rec = SandboxRecord(
            sandbox_id=sandbox_id,
            pid=pid,
            start_time=started,
            owner_pid=self._owner_pid,
            owner_start_time=self._owner_start,
            runtime=runtime,
            paths=paths,
            cgroup=cgroup,
            cgroups=cgroups,
            loopback=loopback,
        )
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.directory / f".{sandbox_id}.tmp"
        tmp.write_bytes(_encoder.encode(rec))
        os.replace(tmp, self._path(sandbox_id))
        return rec

    def remove(self, sandbox_id: str) -> None:
        """Forget a sandbox that has been closed (missing is fine)."""
        self._path(sandbox_id).unlink(missing_ok=True)

    def load(self) -> list[SandboxRecord]:
        """Every readable record; corrupt files are logged and skipped."""
        out = []
        for path in sorted(self.directory.glob("*.json")) if self.directory.is_dir() else []:
            try:
                out.append(_decoder.decode(path.read_bytes()))
            except (OSError, msgspec.DecodeError) as exc:
                log.warning("ignoring unreadable sandbox record %s: %s", path, exc)
        return out

    def reap_stale(self) -> list[SandboxRecord]:
        """Kill and clean up sandboxes whose owning server is gone; return the records handled."""
        handled = []
        for rec in self.load():
            if _alive(rec.owner_pid, rec.owner_start_time):
                continue  # a live server (this one or a neighbour) still owns it
            _kill_recorded(rec)
            for cgroup in rec.cgroup_paths():
                _kill_cgroup(Path(cgroup))
            _remove_paths(rec)
            _free_loopback(rec.loopback)
            self.remove(rec.sandbox_id)
            handled.append(rec)
        return handled

    def _path(self, sandbox_id: str) -> Path:
        if not sandbox_id or "/" in sandbox_id or sandbox_id.startswith("."):
            raise ValueError(f"invalid sandbox id {sandbox_id!r}")
        return self.directory / f"{sandbox_id}.json"


def _kill_recorded(rec: SandboxRecord) -> None:
    if not _alive(rec.pid, rec.start_time):
        log.info("stale sandbox %s: pid %d already gone or reused", rec.sandbox_id, rec.pid)
        return
    log.warning("killing stale sandbox %s (pid %d)", rec.sandbox_id, rec.pid)
    victims = descendants(rec.pid)
    # The sandbox leads its own process group; kill the group, then any stragglers.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(rec.pid, signal.SIGKILL)
    kill_all(victims | {rec.pid})


def _kill_cgroup(path: Path, grace_s: float = 2.0) -> None:
    """Kill whatever the cgroup still holds and remove it (busy until the kills land)."""
    deadline = time.monotonic() + grace_s
    while True:
        try:
            pids = {int(x) for x in (path / "cgroup.procs").read_text().split()}
        except OSError:
            return  # gone already (or never created)
        kill_all(pids)
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if time.monotonic() >= deadline:
                log.warning("could not remove cgroup %s of a dead sandbox: %s", path, exc)
                return
        # Killed processes leave the cgroup once reaped by their new parent: a brief wait.
        time.sleep(0.01)


def _free_loopback(lock_file: str | None) -> None:
    if lock_file is None:
        return
    path = Path(lock_file)
    lease = LoopbackAllocator(path.parent).try_acquire(path.name) if path.exists() else None
    if lease is not None:
        lease.release()  # nobody held it (its holder died): unlink it


def _remove_paths(rec: SandboxRecord) -> None:
    for p in rec.paths:
        remove_tree(p)
