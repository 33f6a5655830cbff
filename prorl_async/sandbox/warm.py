"""Warm sandboxes: started ahead of demand so INIT does not pay a sandbox start.

Only for specs that do not depend on the instance (the pool holds sandboxes of one
spec, and ``take`` hands one out only for an equal spec). A sandbox is used by one
job only and never comes back. The pool fills only from free budget slots nobody is
waiting for, and gives a slot up (closes an idle sandbox) when a start of another
spec would otherwise wait, so warm sandboxes never hold up real work.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import TYPE_CHECKING

from prorl_async.sandbox.spec import SandboxSpec
from prorl_async.util.resource import AsyncResource

if TYPE_CHECKING:
    from prorl_async.sandbox.runtime import Runtime
    from prorl_async.sandbox.sandbox import Sandbox

__all__ = ["WarmPool"]

log = logging.getLogger(__name__)

_RETRY_S = 1.0


class WarmPool(AsyncResource):
    """Keeps up to ``size`` idle sandboxes of ``spec`` started, within the runtime's budget."""

    def __init__(self, runtime: Runtime, spec: SandboxSpec, size: int) -> None:
        self.runtime = runtime
        self.spec = spec
        self.size = size
        self.taken = 0
        self.started = 0
        self.idle_seconds = 0.0
        self._idle: collections.deque[tuple[Sandbox, float]] = collections.deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Task[None]] = set()
        runtime.budget.on_release(self._wake.set)

    @property
    def ready(self) -> int:
        return len(self._idle)

    def start(self) -> None:
        """Attach to the runtime and begin filling."""
        self.runtime.warm = self
        if self._task is None and self.size > 0:
            self._task = asyncio.create_task(self._fill(), name="warm-sandboxes")

    def take(self, spec: SandboxSpec) -> Sandbox | None:
        """An idle warm sandbox for ``spec``, or ``None`` (a different spec, or none ready)."""
        if spec != self.spec:
            return None
        while self._idle:
            sb, since = self._idle.popleft()
            self.idle_seconds += time.monotonic() - since
            self._wake.set()
            if not sb.closed and not sb.process_exited():
                self.taken += 1
                return sb
            self._close_later(sb)  # died while waiting: never hand out a broken one
        return None

    async def evict(self) -> bool:
        """Close one idle sandbox so its slot goes to a waiting start; False if none."""
        if not self._idle:
            return False
        sb, since = self._idle.pop()
        self.idle_seconds += time.monotonic() - since
        await sb.aclose()
        return True

    def live_idle_seconds(self) -> float:
        """Idle sandbox-seconds so far, including sandboxes idle right now."""
        now = time.monotonic()
        return self.idle_seconds + sum(now - since for _, since in self._idle)

    async def _fill(self) -> None:
        while True:
            self._wake.clear()
            batch = 0
            while self._want_more(batch) and self.runtime.budget.try_acquire():
                batch += 1
            if batch:
                started = await asyncio.gather(*(self._start_one() for _ in range(batch)))
                if not all(started):
                    await asyncio.sleep(_RETRY_S)  # back off after a failed start
                continue
            await self._wake.wait()

    def _want_more(self, batch: int) -> bool:
        return len(self._idle) + batch < self.size

    async def _start_one(self) -> bool:
        try:
            sb = await self.runtime.start_reserved(self.spec)
        except Exception:
            log.exception("starting a warm sandbox failed")
            return False
        self.started += 1
        self._idle.append((sb, time.monotonic()))
        return True

    def _close_later(self, sb: Sandbox) -> None:
        task = asyncio.create_task(sb.aclose())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def aclose(self) -> None:
        """Stop filling and close every idle sandbox; idempotent."""
        if self.runtime.warm is self:
            self.runtime.warm = None
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task])
            self._task = None
        idle = [sb for sb, _ in self._idle]
        self._idle.clear()
        await asyncio.gather(*(sb.aclose() for sb in idle), return_exceptions=True)
        if self._closing:
            await asyncio.wait(list(self._closing))
