"""Where one sandbox's files live on the host and inside.

``run_dir/<id>/`` holds ``ws/`` (the workspace, bound in read-write), ``tmp/`` (the
sandbox's ``/tmp``), ``sock/`` (the tool server's socket directory, bound in) and
``log`` (the sandbox's stdout and stderr, host-only, read back when start-up
fails). With ``disk_bytes`` (a root server) ``run_dir/<id>`` is a tmpfs of that
size, capping workspace and ``/tmp`` together; with ``owner`` the directories the
sandbox writes belong to that unprivileged uid/gid.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from prorl_async.sandbox.disk import mount_tmpfs, remove_tree
from prorl_async.sandbox.spec import SpecError, check_relative_path

__all__ = ["INNER_SOCKET_DIR", "INNER_WORKSPACE", "Layout"]

INNER_WORKSPACE = "/workspace"
INNER_SOCKET_DIR = "/run/prorl"
_SOCKET_NAME = "tool.sock"
_MAX_UNIX_PATH = 107


@dataclass(frozen=True, slots=True)
class Layout:
    """Host and inner paths of one sandbox."""

    sandbox_id: str
    root: Path
    inner_workspace: str = INNER_WORKSPACE
    inner_socket_dir: str = INNER_SOCKET_DIR
    # Host uid/gid of the sandbox's processes when not the server's (server running as root).
    owner: tuple[int, int] | None = None

    @classmethod
    def create(
        cls,
        run_dir: str,
        *,
        isolated: bool = True,
        disk_bytes: int | None = None,
        owner: tuple[int, int] | None = None,
    ) -> Layout:
        """Make a fresh, private directory tree; ``isolated=False`` uses host paths inside too."""
        sandbox_id = uuid.uuid4().hex[:12]
        root = Path(run_dir) / sandbox_id
        if isolated:
            layout = cls(sandbox_id, root, owner=owner)
        else:
            layout = cls(sandbox_id, root, str(root / "ws"), str(root / "sock"), owner=owner)
        if len(str(layout.socket)) > _MAX_UNIX_PATH:
            raise SpecError(f"run_dir {run_dir!r} is too long for a Unix socket path")
        Path(run_dir).mkdir(parents=True, exist_ok=True, mode=0o700)
        layout.root.mkdir(mode=0o700)
        try:
            layout._populate(disk_bytes)
        except BaseException:
            layout.remove()
            raise
        return layout

    def _populate(self, disk_bytes: int | None) -> None:
        if disk_bytes is not None:
            mount_tmpfs(str(self.root), disk_bytes)
        # 0711: bwrap (root without CAP_DAC_OVERRIDE) must reach them to chdir and bind.
        for path in (self.workspace, self.socket_dir, self.tmp):
            path.mkdir(mode=0o711)
            self._own(path)

    def _own(self, path: Path) -> None:
        if self.owner is not None:
            os.chown(path, *self.owner, follow_symlinks=False)

    def remove(self) -> None:
        """Unmount (if mounted) and delete the whole tree."""
        remove_tree(str(self.root))

    @property
    def workspace(self) -> Path:
        return self.root / "ws"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    @property
    def socket_dir(self) -> Path:
        return self.root / "sock"

    @property
    def socket(self) -> Path:
        """The tool server's socket, as the host sees it."""
        return self.socket_dir / _SOCKET_NAME

    @property
    def inner_socket(self) -> str:
        return f"{self.inner_socket_dir}/{_SOCKET_NAME}"

    @property
    def log(self) -> Path:
        return self.root / "log"

    def write_files(self, files: dict[str, str]) -> None:
        """Write the spec's initial files; only before start, when nothing inside can race us."""
        for rel, text in files.items():
            rel_path = check_relative_path(rel, what="files")
            path = self.workspace / rel_path
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            for part in (rel_path, *rel_path.parents[:-1]):  # the file and the dirs made for it
                self._own(self.workspace / part)

    def log_tail(self, limit: int = 4000) -> str:
        """The last ``limit`` bytes the sandbox printed (for start-up errors)."""
        try:
            with open(self.log, "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - limit))
                return f.read().decode(errors="replace").strip()
        except OSError:
            return ""
