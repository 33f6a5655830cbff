"""Warm sandboxes: started ahead of demand so INIT does not pay a sandbox start.

Only for specs that do not depend on the instance (the pool holds sandboxes of one
spec, and ``take`` hands one out only for an equal spec). A sandbox is used by one
job only and never comes back.

The pool never holds a slot a job waits for. It fills only from free budget slots
nobody is waiting for, and whenever the budget has a waiter it cannot serve (the
budget's ``shortfall``: a start of any spec, including the pool's own when none was
ready) it gives slots back: it closes idle sandboxes, then cancels its starts still
under way. That holds in every order of events: a job that began waiting while the
pool's starts held every slot (at start-up, with ``size`` at or above the budget) is
served when a start is cancelled, not left waiting behind sandboxes that come up idle.
So at most ``min(size, max_sandboxes)`` sandboxes are warm, and only while no job
wants their slots.
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
        # Slots given back to waiting starts: idle sandboxes closed, starts cancelled.
        self.evicted = 0
        self.cancelled = 0
        self.idle_seconds = 0.0
        self._idle: collections.deque[tuple[Sandbox, float]] = collections.deque()
        self._starting: set[asyncio.Task[Sandbox]] = set()
        # Starts cancelled to give their slot back (their slot returns when they end).
        self._cancelling: set[asyncio.Task[Sandbox]] = set()
        self._entered: set[asyncio.Task[Sandbox]] = set()
        self._closing: set[asyncio.Task[None]] = set()
        # Slots on their way back (closing or cancelled, not yet released): neither
        # counted again when giving back nor refilled until they are released.
        self._returning = 0
        self._failed = False
        self._stopped = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        runtime.budget.on_release(self._wake.set)
        runtime.budget.on_demand(self._give_back)

    @property
    def ready(self) -> int:
        return len(self._idle)

    @property
    def starting(self) -> int:
        """Starts under way (each holds a budget slot), cancelled ones excepted."""
        return len(self._starting) - len(self._cancelling)

    def start(self) -> None:
        """Attach to the runtime and begin filling."""
        self.runtime.warm = self
        if self._task is None and self.size > 0:
            capacity = self.runtime.budget.capacity
            if capacity is not None and self.size > capacity:
                log.info(
                    "warm_sandboxes %d is above max_sandboxes %d: at most %d are kept warm, "
                    "and none while a job waits for a slot",
                    self.size,
                    capacity,
                    capacity,
                )
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
            self._close(sb)  # died while waiting: never hand out a broken one
        return None

    async def evict(self) -> bool:
        """Give one idle sandbox's slot back for a start about to wait for one; False if
        none. Returns at once: the sandbox closes in the background and its slot goes to
        the budget's first waiter (the caller, once it waits), not back to this pool."""
        if not self._idle:
            return False
        self._evict_one()
        return True

    def live_idle_seconds(self) -> float:
        """Idle sandbox-seconds so far, including sandboxes idle right now."""
        now = time.monotonic()
        return self.idle_seconds + sum(now - since for _, since in self._idle)

    # -- giving slots back -------------------------------------------------------------------

    def _give_back(self) -> None:
        """Give back as many slots as the budget's waiters lack (not counting slots already
        on their way back): idle sandboxes first (newest first), then starts under way."""
        if self._stopped or not (self._idle or self.starting):
            return
        need = self.runtime.budget.shortfall - self._returning
        while need > 0 and self._idle:
            self._evict_one()
            need -= 1
        for task in list(self._starting - self._cancelling):
            if need <= 0:
                break
            if task.cancel():
                self._cancelling.add(task)
                self._returning += 1
                self.cancelled += 1
                need -= 1

    def _evict_one(self) -> None:
        sb, since = self._idle.pop()
        self.idle_seconds += time.monotonic() - since
        self.evicted += 1
        self._close(sb)

    def _close(self, sb: Sandbox) -> None:
        """Close ``sb`` in a task this pool owns (awaited by ``aclose``)."""
        self._returning += 1
        task = asyncio.create_task(sb.aclose(), name=f"warm-close:{sb.id}")
        self._closing.add(task)
        task.add_done_callback(self._closed)

    def _closed(self, task: asyncio.Task[None]) -> None:
        self._closing.discard(task)
        self._returning -= 1
        if not task.cancelled() and task.exception() is not None:
            log.error("closing a warm sandbox failed", exc_info=task.exception())
        self._settled()

    def _settled(self) -> None:
        """A slot is back (or a sandbox is ready): give back again if still short, and let
        the filler look again."""
        self._give_back()
        self._wake.set()

    # -- filling -----------------------------------------------------------------------------

    async def _fill(self) -> None:
        while True:
            self._wake.clear()
            if self._failed:
                self._failed = False
                await asyncio.sleep(_RETRY_S)  # back off after a failed start
                continue
            while self._want_more() and self.runtime.budget.try_acquire():
                task = asyncio.create_task(self._start_one())
                self._starting.add(task)
                task.add_done_callback(self._started)
            await self._wake.wait()

    async def _start_one(self) -> Sandbox:
        # From here on start_reserved owns the slot (it gives it back on any failure); a
        # task cancelled before it ran this far never got there: _started gives it back.
        task = asyncio.current_task()
        assert task is not None
        self._entered.add(task)
        return await self.runtime.start_reserved(self.spec)

    def _want_more(self) -> bool:
        # Not while slots are on their way back: they are meant for a waiting start.
        return not self._returning and len(self._idle) + len(self._starting) < self.size

    def _started(self, task: asyncio.Task[Sandbox]) -> None:
        self._starting.discard(task)
        if task in self._entered:
            self._entered.discard(task)
        else:
            self.runtime.budget.release()  # cancelled before it began: the slot is ours
        if task in self._cancelling:
            self._cancelling.discard(task)
            self._returning -= 1
        if task.cancelled():
            pass  # given back (or the pool is closing): start_reserved closed the sandbox
        elif (exc := task.exception()) is not None:
            log.error("starting a warm sandbox failed", exc_info=exc)
            self._failed = True
        else:
            sb = task.result()
            self.started += 1
            if self._stopped:
                self._close(sb)
            else:
                self._idle.append((sb, time.monotonic()))
        self._settled()

    async def aclose(self) -> None:
        """Stop filling and close every idle sandbox; idempotent."""
        self._stopped = True
        if self.runtime.warm is self:
            self.runtime.warm = None
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task])
            self._task = None
        starting = list(self._starting)
        for task in starting:
            task.cancel()
        if starting:
            await asyncio.wait(starting)
        idle = [sb for sb, _ in self._idle]
        self._idle.clear()
        await asyncio.gather(*(sb.aclose() for sb in idle), return_exceptions=True)
        if self._closing:
            await asyncio.wait(list(self._closing))
