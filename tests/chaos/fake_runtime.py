"""``FakeRuntime``: a TEST DOUBLE sandbox runtime with no processes.

It inherits the real ``Runtime.start`` (warm take, budget slot, eviction) and replaces
only ``start_reserved``: each start is a ``FakeStart`` whose outcome the test decides,
by a ``script`` coroutine (succeed, fail, hang) or by hand (``pending``). Its sandboxes
hold their budget slot until closed, like real ones, and can be made to die while idle.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from pathlib import Path

from prorl_async.sandbox import RuntimeConfig, SandboxSpec
from prorl_async.sandbox.layout import Layout
from prorl_async.sandbox.runtime import Runtime, SandboxStartError
from prorl_async.stages.scope import StageScope
from prorl_async.util.resource import AsyncResource

__all__ = ["FakeRuntime", "FakeSandbox", "FakeStart", "fake_config"]

_ids = itertools.count()


def fake_config(tmp: Path, **changes: object) -> RuntimeConfig:
    """A runtime config of this test's own directories, without cgroups."""
    fields: dict[str, object] = {
        "state_dir": str(tmp / "state"),
        "run_dir": str(tmp / "run"),
        "loopback_dir": str(tmp / "loopback"),
        "cgroup_parent": "",
        **changes,
    }
    return RuntimeConfig(**fields)  # type: ignore[arg-type]


class FakeStart:
    """One call of ``start_reserved``: its spec, the stage that asked (``None``: the warm
    pool), and the future a hand-driven test resolves."""

    def __init__(self, spec: SandboxSpec, stage: str | None) -> None:
        self.spec = spec
        self.stage = stage
        self.fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @property
    def warm(self) -> bool:
        return self.stage is None

    def ok(self) -> None:
        if not self.fut.done():
            self.fut.set_result(None)

    def fail(self, why: str = "scripted start failure") -> None:
        if not self.fut.done():
            self.fut.set_exception(SandboxStartError(why))


class FakeSandbox(AsyncResource):
    """A sandbox with no process: holds its budget slot until ``aclose``."""

    def __init__(self, runtime: FakeRuntime, spec: SandboxSpec) -> None:
        self.id = f"fake-{next(_ids)}"
        self.spec = spec
        self.dead = False
        self._runtime = runtime
        self._closing = False

    @property
    def closed(self) -> bool:
        return self._closing

    def process_exited(self) -> bool:
        return self.dead

    async def aclose(self) -> None:
        if self._closing:
            return
        self._closing = True
        self._runtime._closed(self)  # type: ignore[arg-type]  # gives the slot back


Script = Callable[[FakeStart], Awaitable[None]]


class FakeRuntime(Runtime):
    """The real start path over scripted starts. Default script: wait for the test to
    resolve the start (``pending``); a cancelled start gives its slot back, like a real
    one that is cancelled."""

    name = "fake"

    def __init__(self, config: RuntimeConfig, script: Script | None = None) -> None:
        super().__init__(config)
        self.script: Script = script if script is not None else self._by_hand
        self.pending: list[FakeStart] = []
        self.starts: list[FakeStart] = []

    def command(self, spec: SandboxSpec, layout: Layout, ip: str) -> list[str]:
        raise AssertionError("a FakeRuntime launches nothing")

    async def _by_hand(self, start: FakeStart) -> None:
        self.pending.append(start)
        try:
            await start.fut
        finally:
            self.pending.remove(start)

    async def start_reserved(  # type: ignore[override]
        self, spec: SandboxSpec, scope: StageScope | None = None
    ) -> FakeSandbox:
        start = FakeStart(spec, None if scope is None else scope.name)
        self.starts.append(start)
        try:
            await self.script(start)
        except BaseException:
            self.budget.release()  # as a real start gives its slot back on any failure
            raise
        sb = FakeSandbox(self, spec)
        self._live.add(sb)  # type: ignore[arg-type]
        return sb
