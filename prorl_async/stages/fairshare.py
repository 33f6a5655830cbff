"""Weighted fair admission: per-tenant queues, each admission to the tenant furthest
below its share of the jobs in flight.

``FairQueue`` is a ``StageQueue`` (the INIT stage's worker pool drains it as
any stage queue) holding one FIFO per tenant. Given ``Shares`` (each tenant's weight
and its jobs in flight, queued ones included), ``get`` takes the next job of the backlogged tenant
with the fewest jobs admitted and unfinished per unit of weight: weighted max-min
fairness of the server's slots. Backlogged tenants with weights 3 and 1 hold 3:1 of
the slots (3:1 finished jobs for jobs of equal length), and a tenant that arrives while
another holds every slot gets each slot that frees until it holds its share, however
long the other's queue. Ties, and a queue without ``Shares``, go by deficit round
robin: each turn a tenant's deficit grows by its weight and it is served one job per
whole unit; a tenant whose queue empties leaves the round and keeps no credit.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Generic, Protocol, TypeVar

from prorl_async.stages.queue import StageQueue

__all__ = ["FairQueue", "Shares"]

T = TypeVar("T")


class Shares(Protocol):
    """Each tenant's weight, and its jobs queued or running (``tenancy.Tenants``)."""

    def weight(self, tenant: str) -> float: ...
    def load(self, tenant: str) -> int: ...


class _Rounds(Generic[T]):
    """The per-tenant FIFOs and the round; ``len`` and iteration cover every item."""

    def __init__(self, key: Callable[[T], str], shares: Shares | None) -> None:
        self._key = key
        self._shares = shares
        self._fifos: dict[str, deque[T]] = {}
        self._round: deque[str] = deque()  # tenants with a backlog; the head has the turn
        self._deficit: dict[str, float] = {}
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[T]:
        for fifo in self._fifos.values():
            yield from fifo

    def append(self, item: T) -> None:
        tenant = self._key(item)
        fifo = self._fifos.get(tenant)
        if fifo is None:
            fifo = self._fifos[tenant] = deque()
            self._round.append(tenant)
            self._deficit[tenant] = 0.0
        fifo.append(item)
        self._size += 1

    def popleft(self) -> T:
        if not self._size:
            raise IndexError("pop from an empty FairQueue")
        if self._shares is not None and len(self._round) > 1:
            self._to_front(self._furthest_below_share(self._shares))
        while True:
            tenant = self._round[0]
            if self._deficit[tenant] < 1.0:
                # Its turn starts: one quantum. Weights below 1 need several rounds.
                self._deficit[tenant] += max(self._weight(tenant), 0.01)
                if self._deficit[tenant] < 1.0:
                    self._round.rotate(-1)
                    continue
            return self._serve(tenant)

    def _weight(self, tenant: str) -> float:
        return 1.0 if self._shares is None else self._shares.weight(tenant)

    def _furthest_below_share(self, shares: Shares) -> str:
        """The backlogged tenant with the fewest admitted, unfinished jobs per weight (the
        first in round order among equals)."""
        best, low = self._round[0], float("inf")
        for tenant in self._round:
            admitted = shares.load(tenant) - len(self._fifos[tenant])
            used = admitted / max(shares.weight(tenant), 0.01)
            if used < low:
                best, low = tenant, used
        return best

    def _to_front(self, tenant: str) -> None:
        if self._round[0] != tenant:
            self._round.remove(tenant)
            self._round.appendleft(tenant)
            self._deficit[tenant] = max(self._deficit[tenant], 1.0)  # its turn, now

    def _serve(self, tenant: str) -> T:
        fifo = self._fifos[tenant]
        item = fifo.popleft()
        self._size -= 1
        self._deficit[tenant] -= 1.0
        if not fifo:
            del self._fifos[tenant], self._deficit[tenant]
            self._round.popleft()
        elif self._deficit[tenant] < 1.0:
            self._round.rotate(-1)  # turn used up: to the back of the round
        return item

    def backlog(self) -> dict[str, int]:
        return {tenant: len(fifo) for tenant, fifo in self._fifos.items()}


class FairQueue(StageQueue[T]):
    """An unbounded stage queue served by weighted fair share over tenants.

    ``key(item)`` names an item's tenant. With ``shares``, each get serves the tenant
    furthest below its weighted share of the jobs in flight; without, plain deficit
    round robin with equal weights.
    """

    __slots__ = ("_rounds",)

    def __init__(self, key: Callable[[T], str], shares: Shares | None = None) -> None:
        self._rounds: _Rounds[T] = _Rounds(key, shares)
        super().__init__(self._rounds)  # the queue's items are the rounds

    def backlog(self) -> dict[str, int]:
        """Items waiting, per tenant."""
        return self._rounds.backlog()
