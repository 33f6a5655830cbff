"""The sandbox budget: a resizable bound on live sandboxes, shared by every stage.

Every sandbox start takes a slot first (``Runtime.start`` is the one place that does)
and the slot is given back when the sandbox closes. A taker names the job's stage it
takes the slot for by passing its ``StageScope`` (``job.scope``). Waiting for a slot
pauses that job's timer, like waiting for an LLM backend, so a job is never timed out
for the server's lack of capacity.

A freed slot goes to the waiter of the latest stage first (EVAL, then RUN, then INIT,
then takers outside a stage such as warm sandboxes), in arrival order within a stage.
A later stage finishes a job the server has already paid for, and it only has jobs to
offer that earlier stages started, so it cannot starve them: under a full budget,
first-come order would instead let INIT keep starting jobs while finished RUNs wait
for an EVAL sandbox, which lengthens every such job and, at the end of a batch, the
batch itself.

A stage may be given an admission rule (``admit_when``): its waiters then get a free slot
only while the rule admits, and are offered one again on ``wake``. Just-in-time INIT
uses it so a slot freed while RUN jobs already wait for a backend is not turned into
one more sandbox waiting for it.

Slots held by sandboxes nobody uses yet (warm ones) can be given back: a holder that
registers with ``on_demand`` is told whenever a taker may be waiting for a slot
(a waiter queued, an admission re-checked, the capacity changed) and gives back up to
``shortfall`` slots. Without that, a waiter that arrived while such a holder was still
starting its sandboxes would wait for a slot nobody ever releases.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import time
from collections.abc import Callable
from typing import Protocol

from prorl_async.stages.scope import StageScope

__all__ = ["SandboxBudget", "default_max_sandboxes", "total_memory_bytes"]

_FALLBACK_PER_SANDBOX = 1 << 30
# The memory limit is an address-space cap (RLIMIT_AS), far above what a sandbox keeps
# resident (a tool server maps ~0.5 GiB, touches ~60 MiB): below this floor the derived
# budget would starve the default INIT pool on any machine under 32 GiB.
MIN_DEFAULT = 8
# Who gets a freed slot first: a higher rank (a later stage) before a lower one.
_RANK = {"eval": 3, "run": 2, "init": 1}


def _rank(stage: str | None) -> int:
    return _RANK.get(stage, 0) if stage is not None else 0


def _rank_of(scope: StageScope | None) -> int:
    """The rank of a taker for ``scope``'s stage (0: outside any stage, e.g. warm)."""
    return 0 if scope is None else _rank(scope.name)


def total_memory_bytes() -> int:
    """Physical memory of this machine (``MemTotal``)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class MemoryLimited(Protocol):
    """Per-sandbox limits as the budget reads them (``sandbox.SandboxLimits``)."""

    @property
    def memory_bytes(self) -> int | None: ...


def default_max_sandboxes(limits: MemoryLimited, memory: int | None = None) -> int:
    """As many sandboxes as fit in memory at the per-sandbox memory limit, at least 8.

    Without a memory limit a sandbox is assumed to need 1 GiB.
    """
    memory = total_memory_bytes() if memory is None else memory
    per = limits.memory_bytes or _FALLBACK_PER_SANDBOX
    return max(MIN_DEFAULT, memory // per)


class SandboxBudget:
    """At most ``capacity`` slots held at once (``None``: unbounded); waiters served
    latest stage first, first come first served within a stage."""

    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = capacity
        self.live = 0
        self.peak = 0
        self.waits = 0
        self.wait_seconds = 0.0
        # Slots taken per stage (``None``: outside a stage, e.g. warm sandboxes).
        self.taken_by: dict[str | None, int] = {}
        # One line of waiters per rank (see ``_rank``), highest rank served first.
        self._waiters: dict[int, collections.deque[asyncio.Future[None]]] = {
            r: collections.deque() for r in sorted({0, *_RANK.values()}, reverse=True)
        }
        self._listeners: list[Callable[[], None]] = []
        self._demand: list[Callable[[], None]] = []
        self._admissions: dict[int, Callable[[], bool]] = {}

    def admit_when(self, stage: str, is_open: Callable[[], bool]) -> None:
        """Give ``stage``'s takers a slot only while ``is_open()`` (re-checked on ``wake``)."""
        self._admissions[_rank(stage)] = is_open

    def wake(self) -> None:
        """Hand free slots to waiters whose admission may have opened."""
        self._wake()
        self._ask()

    def _admitted(self, rank: int, *, asking: StageScope | None = None) -> bool:
        """Whether ``rank``'s admission rule admits; ``asking``: evaluated for that job's
        stage, with its timer paused (it is waiting for a slot, not yet working on one)."""
        is_open = self._admissions.get(rank)
        if is_open is None:
            return True
        timer = None if asking is None else asking.timer
        if timer is None:
            return is_open()
        with timer.paused():
            return is_open()

    @property
    def waiting(self) -> int:
        return sum(len(line) for line in self._waiters.values())

    def waiting_at(self, stage: str) -> int:
        """Takers for ``stage`` waiting for a slot now."""
        return sum(1 for fut in self._waiters[_rank(stage)] if not fut.done())

    def _ahead(self, rank: int) -> bool:
        """Whether someone of ``rank`` or higher waits for a slot."""
        return any(line for r, line in self._waiters.items() if r >= rank)

    @property
    def shortfall(self) -> int:
        """Slots to give back so every waiter whose admission rule admits gets one and ``live`` fits
        the capacity (what a holder of idle slots should give up; 0 when none)."""
        if self.capacity is None:
            return 0
        wanting = sum(
            sum(1 for fut in line if not fut.done())
            for rank, line in self._waiters.items()
            if line and self._admitted(rank)
        )
        return max(wanting + self.live - self.capacity, 0)

    @property
    def free(self) -> int | None:
        """Slots that could be taken now without waiting (``None``: unbounded)."""
        if self.capacity is None:
            return None
        return max(self.capacity - self.live, 0)

    def on_release(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` whenever a slot may have become free."""
        self._listeners.append(callback)

    def on_demand(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` whenever ``shortfall`` may have grown (called synchronously,
        in the asking taker's context: it must not block or raise)."""
        self._demand.append(callback)

    def _ask(self) -> None:
        for callback in self._demand:
            callback()

    def resize(self, capacity: int | None) -> None:
        if capacity is not None and capacity < 1:
            raise ValueError(f"max_sandboxes must be >= 1, got {capacity}")
        self.capacity = capacity
        self._freed()  # a larger capacity frees slots (for waiters, then warm sandboxes)
        self._ask()  # a smaller one may take slots back from idle holders

    def try_acquire(self, scope: StageScope | None = None) -> bool:
        """Take a slot for ``scope``'s job (``None``: outside a stage) if one is free,
        nobody of its stage or a later one is queued for one, and its stage's admission
        rule (if any) admits."""
        rank = _rank_of(scope)
        if self._ahead(rank) or not self._admitted(rank, asking=scope):
            return False
        if self.capacity is not None and self.live >= self.capacity:
            return False
        self._take()
        self._count(scope)
        return True

    async def acquire(self, scope: StageScope | None = None) -> None:
        """Take a slot for ``scope``'s job, waiting in line if none is free; the job's
        timer is paused meanwhile."""
        if self.try_acquire(scope):
            return
        timer = None if scope is None else scope.timer
        t0 = time.monotonic()
        self.waits += 1
        rank = _rank_of(scope)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[rank].append(fut)
        try:
            with timer.paused() if timer is not None else contextlib.nullcontext():
                if rank in self._admissions:
                    self._wake()  # its admission rule now sees this job waiting, not working
                if not fut.done():
                    self._ask()  # a holder of idle slots gives one up for this waiter
                await fut
        except BaseException:
            self._abandon(fut)
            raise
        finally:
            self.wait_seconds += time.monotonic() - t0
        self._count(scope)

    def release(self) -> None:
        """Give a slot back (a sandbox closed, or a start failed)."""
        self.live -= 1
        self._freed()

    def _freed(self) -> None:
        """A slot may be free, or a taker no longer behind a waiter: tell them."""
        self._wake()
        for callback in self._listeners:
            callback()

    def _count(self, scope: StageScope | None) -> None:
        stage = None if scope is None else scope.name
        self.taken_by[stage] = self.taken_by.get(stage, 0) + 1
        if scope is not None:
            scope.slots += 1

    def _take(self) -> None:
        self.live += 1
        self.peak = max(self.peak, self.live)

    def _abandon(self, fut: asyncio.Future[None]) -> None:
        if fut.done() and not fut.cancelled():
            self.release()  # granted just as the waiter went away: hand it on
        else:
            fut.cancel()
            for line in self._waiters.values():
                if fut in line:
                    line.remove(fut)
            # Takers that were behind this waiter (a lower stage, warm sandboxes) may
            # take a free slot now.
            self._freed()

    def _wake(self) -> None:
        for rank, line in self._waiters.items():  # highest rank first
            if line and not self._admitted(rank):
                continue
            while line and (self.capacity is None or self.live < self.capacity):
                fut = line.popleft()
                if not fut.done():
                    self._take()
                    fut.set_result(None)
