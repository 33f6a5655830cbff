"""The runtime interface: ``Runtime.start(spec) -> Sandbox`` and ``get_runtime(name, config)``.

A runtime only decides *how* the tool server is launched (``command`` and
``environment``); everything else is shared: the sandbox's directories (on a
size-capped tmpfs where one can be mounted), loopback address, pids and memory
cgroup, rlimits (a ``prlimit`` prefix), its own session and process group, the
live-sandbox record, and readiness (a successful connect to the tool server's
socket, raced against the process exiting). The launched process gets a minimal
environment, never the server's: its secrets must not reach the sandbox.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import os
from typing import ClassVar, Protocol

from prorl_async.capacity.budget import SandboxBudget
from prorl_async.sandbox.cgroup import SandboxCgroup, find_cgroup_parents
from prorl_async.sandbox.disk import can_mount
from prorl_async.sandbox.keeper import ENV as KEEPER_ENV
from prorl_async.sandbox.keeper import Keeper
from prorl_async.sandbox.layout import Layout
from prorl_async.sandbox.limits import SandboxLimits, describe_enforcement, prlimit_argv
from prorl_async.sandbox.loopback import LoopbackAllocator, LoopbackLease
from prorl_async.sandbox.records import SandboxRecords
from prorl_async.sandbox.sandbox import Sandbox
from prorl_async.sandbox.spec import RuntimeConfig, SandboxSpec, SpecError
from prorl_async.stages.scope import StageScope
from prorl_async.toolserver.client import ToolClient

__all__ = [
    "Runtime",
    "RuntimeUnavailableError",
    "SandboxStartError",
    "join_cgroup_argv",
]

log = logging.getLogger(__name__)

# prorl_async/ (this file is prorl_async/sandbox/runtime.py).
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def package_root() -> str:
    """The directory holding the ``prorl_async`` this server runs (symlinks resolved:
    what a sandbox binds and imports from must be the same real path)."""
    return os.path.dirname(os.path.realpath(_PACKAGE_DIR))


class RuntimeUnavailableError(RuntimeError):
    """The requested runtime cannot run on this machine; the message says why."""


class SandboxStartError(RuntimeError):
    """A sandbox failed to come up; the message carries the runtime's own output."""


class WarmSource(Protocol):
    """Pre-started sandboxes a start may take instead of starting one (``sandbox.WarmPool``)."""

    @property
    def ready(self) -> int: ...
    def take(self, spec: SandboxSpec) -> Sandbox | None: ...
    async def evict(self) -> bool: ...
    def live_idle_seconds(self) -> float: ...


class Runtime(abc.ABC):
    """Starts sandboxes of one kind. Closing the runtime closes every sandbox it started.

    Every start takes a slot of ``budget`` (live sandboxes of every stage share it) and
    the slot is given back when the sandbox closes; ``warm`` may hand out a pre-started one.
    """

    name: ClassVar[str]
    # Whether the sandbox sees its own paths (/workspace) rather than the host's.
    isolated: ClassVar[bool] = True

    def __init__(self, config: RuntimeConfig | None = None) -> None:
        self.config = config if config is not None else RuntimeConfig()
        self.config.validate()
        self.allocator = LoopbackAllocator(self.config.loopback_dir)
        self.records = SandboxRecords(self.config.state_dir)
        self.cgroups = find_cgroup_parents(self.config.cgroup_parent)
        self.pids_parent = self.cgroups.pids
        self._live: set[Sandbox] = set()
        self.budget = SandboxBudget()
        self.warm: WarmSource | None = None
        # While a sandbox lives: ends every sandbox process if this server dies (keeper.py).
        self.keeper: Keeper | None = None
        self._retired: list[Keeper] = []

    @abc.abstractmethod
    def command(self, spec: SandboxSpec, layout: Layout, ip: str) -> list[str]:
        """The argv that runs the tool server in a sandbox (before the limits prefix)."""

    def environment(self, spec: SandboxSpec, layout: Layout, ip: str) -> dict[str, str]:
        """Environment of the launched process: a bare PATH, nothing of the server's."""
        return {"PATH": _BASE_PATH}

    def check_spec(self, spec: SandboxSpec) -> None:
        """Reject a spec this runtime cannot honour (``SpecError`` naming the field)."""
        if spec.network and not self.config.allow_network:
            raise SpecError(
                "network: sandboxes with network are disabled on this server "
                "(the operator enables them with [sandbox] allow_network = true)"
            )

    def check(self, spec: SandboxSpec) -> None:
        """Everything ``start`` checks before it waits or launches: the spec is valid
        and this runtime can honour it (``SpecError`` naming the field)."""
        spec.validate()
        self.check_spec(spec)

    @property
    def drops_root(self) -> bool:
        """Whether sandboxed processes run as ``sandbox_uid`` (a server running as root)."""
        return os.geteuid() == 0

    @property
    def owner(self) -> tuple[int, int] | None:
        """Host uid/gid the sandbox's writable directories belong to (None: the server's)."""
        if not self.drops_root:
            return None
        return (self.config.sandbox_uid, self.config.sandbox_gid)

    def disk_enforcer(self) -> str | None:
        """What caps workspace + /tmp together here (None: nothing)."""
        return "a size-capped tmpfs holding workspace and /tmp" if can_mount() else None

    def sandbox_env(self, spec: SandboxSpec, layout: Layout, ip: str) -> dict[str, str]:
        """Variables every sandboxed process sees; ``spec.env`` wins over them."""
        python_dir = os.path.dirname(self.config.python)
        env = {
            "PATH": f"{python_dir}:{_BASE_PATH}",
            "HOME": layout.inner_workspace,
            "LANG": "C.UTF-8",
            "SANDBOX_ID": layout.sandbox_id,
            "SANDBOX_LOOPBACK_IP": ip,
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        env.update(spec.env)
        return env

    def tool_server_argv(
        self, python: str, layout: Layout, *, same_code: bool = False
    ) -> list[str]:
        """The tool server's command line. ``same_code``: import ``prorl_async`` from where
        this server imported it (runtimes that see the host's paths), not from wherever the
        interpreter's installed copy points: with two checkouts, an editable install may
        name the other one, which a sandbox does not bind."""
        args = ["--socket", layout.inner_socket, "--workspace", layout.inner_workspace]
        # -P: the workspace (cwd) must not shadow the tool server's own imports.
        if not same_code:
            return [python, "-P", "-m", "prorl_async.toolserver", *args]
        root = package_root()
        boot = (
            f"import runpy, sys; sys.path.insert(0, {root!r}); "
            "runpy.run_module('prorl_async.toolserver', run_name='__main__', alter_sys=True)"
        )
        return [python, "-P", "-c", boot, *args]

    @property
    def live(self) -> int:
        """Number of sandboxes started and not yet closed."""
        return len(self._live)

    def enforcement(self, limits: SandboxLimits | None = None) -> dict[str, str]:
        """How ``limits`` (default: the defaults) are enforced here, and as which user sandboxed
        code runs (for the start-up log and ``/status``)."""
        out = describe_enforcement(
            limits if limits is not None else SandboxLimits(),
            self.cgroups.pids,
            memory_cgroup=self.cgroups.memory,
            disk=self.disk_enforcer(),
        )
        out["runtime"] = self.name
        out["user"] = self._describe_user()
        return out

    def _describe_user(self) -> str:
        if self.drops_root:
            return (
                f"host uid {self.config.sandbox_uid} gid {self.config.sandbox_gid}, no capabilities"
            )
        uid = os.geteuid()
        return f"host uid {uid} (the server's){' UNISOLATED' if not self.isolated else ''}"

    async def start(
        self, spec: SandboxSpec | None = None, scope: StageScope | None = None
    ) -> Sandbox:
        """Start a sandbox and return once its tool server answers; clean up on any failure.

        ``scope``: the job's stage the sandbox is for (``job.scope``; ``None``: none). A
        warm sandbox of the same spec is taken when there is one; otherwise this waits for
        a budget slot, ranked by ``scope``'s stage and pausing its job's timer, evicting an
        idle warm one first.
        """
        spec = spec if spec is not None else SandboxSpec()
        self.check(spec)
        warm = self.warm.take(spec) if self.warm is not None else None
        if warm is not None:
            return warm
        if not self.budget.try_acquire(scope):
            if self.warm is not None and self.budget.free == 0:
                await self.warm.evict()  # only a full budget is worth an idle warm one
            await self.budget.acquire(scope)
        return await self.start_reserved(spec, scope)

    async def start_reserved(self, spec: SandboxSpec, scope: StageScope | None = None) -> Sandbox:
        """Start a sandbox on a budget slot the caller already holds (given back at close);
        ``scope`` as for ``start``."""
        try:
            sb = self._prepare(spec)
        except BaseException:
            self.budget.release()
            raise
        try:
            await self._launch(sb, spec)
        except BaseException:
            await sb.aclose()
            raise
        return sb

    def _closed(self, sb: Sandbox) -> None:
        if sb in self._live:
            self._live.discard(sb)
            self.budget.release()
        if not self._live and self.keeper is not None:
            # Nothing left to keep: it exits after one pass; reaped later.
            self.keeper.release()
            self._retired.append(self.keeper)
            self.keeper = None

    def _prepare(self, spec: SandboxSpec) -> Sandbox:
        disk = spec.limits.disk_bytes if can_mount() else None
        layout = Layout.create(
            self.config.run_dir, isolated=self.isolated, disk_bytes=disk, owner=self.owner
        )
        lease: LoopbackLease | None = None
        try:
            layout.write_files(spec.files)
            lease = self.allocator.acquire()
            cgroup = self._make_cgroup(layout, spec)
        except BaseException:
            if lease is not None:
                lease.release()
            layout.remove()
            raise
        sb = Sandbox(
            runtime=self.name,
            layout=layout,
            lease=lease,
            limits=spec.limits,
            records=self.records,
            cgroup=cgroup,
            close_grace=self.config.close_grace_s,
            on_close=self._closed,
        )
        self._live.add(sb)
        return sb

    def _make_cgroup(self, layout: Layout, spec: SandboxSpec) -> SandboxCgroup | None:
        name = f"prorl-sb-{layout.sandbox_id}"
        limits = spec.limits
        return SandboxCgroup.create(
            self.cgroups, name, max_pids=limits.max_processes, memory=limits.sandbox_memory_bytes
        )

    def _argv(self, sb: Sandbox, spec: SandboxSpec) -> list[str]:
        # With a pids cgroup, a per-uid RLIMIT_NPROC would count every sandbox of sandbox_uid.
        pids_capped = sb.cgroup is not None and self.cgroups.pids is not None
        prefix = prlimit_argv(spec.limits, nproc=not pids_capped)
        return join_cgroup_argv(sb) + prefix + self.command(spec, sb.layout, sb.loopback_ip)

    async def attach_network(self, sb: Sandbox, spec: SandboxSpec) -> None:
        """Give a started sandbox the outside network its spec asks for (runtimes that can)."""

    def sandbox_tag(self) -> dict[str, str]:
        """The environment entry every process this runtime launches carries, so the
        keeper finds it if the server dies (started here while none runs)."""
        if self.keeper is None:
            self._retired = [k for k in self._retired if not k.exited()]
            self.keeper = Keeper()
            self.keeper.start()
        return {KEEPER_ENV: self.keeper.tag}

    async def _launch(self, sb: Sandbox, spec: SandboxSpec) -> None:
        argv = self._argv(sb, spec)
        env = self.environment(spec, sb.layout, sb.loopback_ip) | self.sandbox_tag()
        out = os.open(sb.layout.log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                env=env,
                cwd=sb.layout.root,  # a shell wrapper exports PWD: not the server's directory
                start_new_session=True,
            )
        finally:
            os.close(out)
        sb.attach_process(proc)
        cgroups = tuple(str(p) for p in sb.cgroup.paths) if sb.cgroup is not None else ()
        self.records.add(
            sb.id,
            proc.pid,
            runtime=self.name,
            paths=(str(sb.layout.root),),
            cgroups=cgroups,
            loopback=sb.loopback_lock,
        )
        sb.attach_client(await self._connect(sb))
        if spec.network:
            await self.attach_network(sb, spec)

    async def _connect(self, sb: Sandbox) -> ToolClient:
        timeout = self.config.start_timeout_s
        connect = asyncio.ensure_future(ToolClient.connect(str(sb.layout.socket), timeout=timeout))
        exited = asyncio.ensure_future(sb.wait_process())
        try:
            await asyncio.wait([connect, exited], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (connect, exited):
                task.cancel()
            await asyncio.wait([connect, exited])
        if connect.done() and not connect.cancelled() and connect.exception() is None:
            return connect.result()
        raise SandboxStartError(self._start_failure(sb, connect))

    def _start_failure(self, sb: Sandbox, connect: asyncio.Future[ToolClient]) -> str:
        if sb.process_exited():
            why = f"exited with status {sb.returncode} during start-up"
        else:
            why = f"did not become ready: {connect.exception()}"
        return f"{self.name} sandbox {sb.id} {why}; its output: {sb.layout.log_tail() or '(none)'}"

    async def aclose(self) -> None:
        """Close every live sandbox (concurrently); idempotent."""
        live = list(self._live)
        if live:
            await asyncio.gather(*(sb.aclose() for sb in live), return_exceptions=True)
        keepers = [*self._retired, *([self.keeper] if self.keeper is not None else [])]
        self.keeper, self._retired = None, []
        for keeper in keepers:
            await asyncio.to_thread(keeper.wait)


def join_cgroup_argv(sb: Sandbox) -> list[str]:
    """A ``sh`` prefix joining the sandbox's cgroups before exec, so every process of the
    sandbox (and a helper such as slirp4netns) is born inside them."""
    if sb.cgroup is None:
        return []
    files = [str(f) for f in sb.cgroup.procs_files]
    join = " && ".join(f'echo $$ > "${i + 1}"' for i in range(len(files)))
    return ["/bin/sh", "-c", f'{join} && shift {len(files)} && exec "$@"', "sh", *files]
