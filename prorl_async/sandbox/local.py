"""Local runtime: the tool server as a plain subprocess in a temp workspace. No isolation.

For development on machines without user namespaces only: sandboxed code can read
and write anything the server's user can, and shares its network. Limits (rlimits,
a pids cgroup where delegated), its own session, teardown and records still apply.
"""

from __future__ import annotations

import logging
import os

from prorl_async.sandbox.layout import Layout
from prorl_async.sandbox.runtime import Runtime
from prorl_async.sandbox.sandbox import Sandbox
from prorl_async.sandbox.spec import SandboxSpec
from prorl_async.stages.scope import StageScope

__all__ = ["LocalRuntime"]

log = logging.getLogger(__name__)


class LocalRuntime(Runtime):
    """Unisolated subprocess sandboxes (dev only)."""

    name = "local"
    isolated = False

    @property
    def drops_root(self) -> bool:
        return False  # no isolation to drop into: the tool server runs as the server's user

    def command(self, spec: SandboxSpec, layout: Layout, ip: str) -> list[str]:
        # cd into the workspace without a shell-interpolated path: exec via env -C.
        return [
            "env",
            "-C",
            layout.inner_workspace,
            *self.tool_server_argv(self.config.python, layout, same_code=True),
        ]

    def environment(self, spec: SandboxSpec, layout: Layout, ip: str) -> dict[str, str]:
        env = self.sandbox_env(spec, layout, ip)
        env["PATH"] = f"{os.path.dirname(self.config.python)}:{os.environ.get('PATH', '')}"
        env.setdefault("TMPDIR", str(layout.tmp))
        return env

    async def start(
        self, spec: SandboxSpec | None = None, scope: StageScope | None = None
    ) -> Sandbox:
        """Start an unisolated sandbox, warning that it is one."""
        log.warning(
            "local runtime: sandbox code runs UNISOLATED as %s, with host network and files",
            os.environ.get("USER") or os.getuid(),
        )
        return await super().start(spec, scope)
