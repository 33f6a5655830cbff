"""Weighted fair admission into INIT: per-tenant queues, each admission to the tenant
furthest below its weighted share of the jobs in flight (deficit round robin on ties)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from prorl_async.client import RolloutClient
from prorl_async.stages import FairQueue
from tests.blocking import BlockingHandler
from tests.helpers import ServerFactory, eventually

Item = tuple[str, int]


class Ledger:
    """Shares for the unit tests: weights, and what each tenant has queued or in flight
    (every item taken stays in flight, as a job that has not ended)."""

    def __init__(self, weights: dict[str, float], in_flight: dict[str, int] | None = None):
        self.weights = weights
        self.queued: Counter[str] = Counter()
        self.taken: Counter[str] = Counter(in_flight or {})

    def weight(self, tenant: str) -> float:
        return self.weights.get(tenant, 1.0)

    def load(self, tenant: str) -> int:
        return self.queued[tenant] + self.taken[tenant]


class Round:
    def __init__(self, shares: Ledger | None) -> None:
        self.shares = shares
        self.q: FairQueue[Item] = FairQueue(key=lambda item: item[0], shares=shares)

    def put(self, tenant: str, n: int) -> None:
        for i in range(n):
            self.q.put_nowait((tenant, i))
            if self.shares is not None:
                self.shares.queued[tenant] += 1

    def take(self, n: int) -> list[Item]:
        out = [self.q.get_nowait() for _ in range(n)]
        if self.shares is not None:
            for tenant, _ in out:
                self.shares.queued[tenant] -= 1
                self.shares.taken[tenant] += 1
        return out


def test_backlogged_tenants_hold_slots_in_proportion_to_their_weights() -> None:
    r = Round(Ledger({"a": 3, "b": 1}))
    r.put("a", 400)
    r.put("b", 400)
    order = r.take(400)
    assert Counter(t for t, _ in order[:8]) == {"a": 6, "b": 2}
    assert Counter(t for t, _ in order) == {"a": 300, "b": 100}
    assert [i for t, i in order if t == "b"] == list(range(100))  # FIFO within a tenant
    assert r.q.qsize() == 400 and r.q.backlog() == {"a": 100, "b": 300}


def test_a_newcomer_gets_every_freed_slot_until_it_holds_its_share() -> None:
    r = Round(Ledger({}, in_flight={"flood": 64}))
    r.put("flood", 10_000)
    r.put("small", 20)
    assert [t for t, _ in r.take(20)] == ["small"] * 20
    assert Counter(t for t, _ in r.take(100)) == {"flood": 100}


class WeightsOnly(Ledger):
    def load(self, tenant: str) -> int:
        return self.queued[tenant]  # nothing in flight: weights alone decide, by DRR


def test_on_equal_loads_and_without_shares_it_is_deficit_round_robin() -> None:
    r = Round(None)
    r.put("flood", 10_000)
    r.take(3)
    r.put("small", 2)  # served within one round
    assert [t for t, _ in r.take(4)] == ["flood", "small", "flood", "small"]
    r = Round(WeightsOnly({"half": 0.5, "one": 1}))  # fractional weights: over rounds
    for tenant in ("half", "one"):
        r.put(tenant, 100)
    assert Counter(t for t, _ in r.take(60)) == {"one": 40, "half": 20}


async def _admission_order(
    make_server: ServerFactory,
    blocking: BlockingHandler,
    tenants: dict[str, Any],
    waves: list[dict[str, int]],
) -> list[str]:
    """Tenants in the order their jobs entered INIT. One INIT worker; before each wave a
    job of tenant ``x`` holds INIT until the wave's jobs are all queued. Every job waits
    in RUN until the end, so what each tenant has in flight is what it was admitted."""
    tenants = {"x": {"token": "tx"}, **tenants}
    async with make_server(init_workers=1, jit_init=False, tenants=tenants) as srv:
        clients = {t: RolloutClient(srv.url, token=cfg["token"]) for t, cfg in tenants.items()}
        owner: dict[str, str] = {}
        try:
            for client in clients.values():
                await client.__aenter__()
            for wave in waves:
                blocker = await clients["x"].submit("blocking", {"block": ["init"]})
                await blocking.event(blocker, "init").wait()
                for tenant, n in wave.items():
                    ids = await clients[tenant].submit_batch(
                        [{"task": "blocking", "instance": {"block": ["run"]}}] * n
                    )
                    owner.update(dict.fromkeys(ids, tenant))
                blocking.release(blocker)
                await eventually(lambda: all((j, "init") in blocking.entered for j in owner), 60)
        finally:
            for job in owner:
                blocking.release(job)
            await eventually(lambda: srv.service.store.unfinished_count() == 0, timeout=60)
            for client in clients.values():
                await client.aclose()
    return [owner[job] for job, stage in blocking.calls if stage == "init" and job in owner]


async def test_weights_3_to_1_give_3_to_1_of_the_slots(
    make_server: ServerFactory, blocking: BlockingHandler
) -> None:
    tenants = {"c": {"token": "tc", "weight": 3}, "d": {"token": "td", "weight": 1}}
    order = await _admission_order(make_server, blocking, tenants, [{"c": 200, "d": 200}])
    assert Counter(order[:8]) == {"c": 6, "d": 2}
    assert Counter(order[:200]) == {"c": 150, "d": 50}


async def test_a_flood_does_not_starve_a_small_tenant(
    make_server: ServerFactory, blocking: BlockingHandler
) -> None:
    tenants = {"a": {"token": "ta"}, "b": {"token": "tb"}}
    # b's 50 jobs, queued behind 2,000 of a's, enter INIT within the first 100
    order = await _admission_order(make_server, blocking, tenants, [{"a": 2000, "b": 50}])
    assert Counter(order[:100]) == {"a": 50, "b": 50}
    # a holds 30 in flight when b comes: b's 20 go first, though a's 100 were queued first
    order = await _admission_order(make_server, blocking, tenants, [{"a": 30}, {"a": 100, "b": 20}])
    assert order[:30] == ["a"] * 30 and order[30:50] == ["b"] * 20
