"""The result log (``core.resultlog``) built directly: ``commit_many`` (a
transaction's results at once, as the durable store commits them) against ``commit``
one entry at a time, in and out of seq order, across tenants."""

from __future__ import annotations

import asyncio
import random

import pytest

from prorl_async.core.resultlog import LogEntry, ResultLog

Entry = tuple[str, int, str, str, float | None]
STATUSES = ("done", "failed", "cancelled", "timed_out")


def entries(n: int, tenants: tuple[str, ...], seed: int) -> list[Entry]:
    rng = random.Random(seed)
    return [
        (
            rng.choice(tenants),
            seq,
            f"job-{seq}",
            rng.choice(STATUSES),
            rng.choice((None, 0.0, 1.0, rng.random())),
        )
        for seq in range(1, n + 1)
    ]


def everything(log: ResultLog, tenants: tuple[str, ...]) -> dict[str, list[LogEntry]]:
    return {t: log.after(t, 0, 10_000) for t in tenants}


@pytest.mark.parametrize("seed", range(5))
def test_commit_many_leaves_the_log_commit_would(seed: int) -> None:
    tenants = ("a", "b", "c")
    todo = entries(300, tenants, seed)
    shuffled = todo[:]
    random.Random(seed).shuffle(shuffled)  # out of seq order: kept in order anyway
    one, many = ResultLog(), ResultLog()
    for entry in shuffled:
        one.commit(*entry)
    for at in range(0, len(shuffled), 64):  # in chunks, as transactions commit them
        many.commit_many(shuffled[at : at + 64])
    assert everything(many, tenants) == everything(one, tenants)
    assert many.committed == one.committed == 300
    for tenant in tenants:
        got = many.after(tenant, 0, 10_000)
        assert [c.seq for c in got] == sorted(c.seq for c in got)
        want = [LogEntry(s, j, st, r) for t, s, j, st, r in todo if t == tenant]
        assert got == want
        assert many.last(tenant) == want[-1].seq


def test_commit_many_of_nothing_changes_nothing() -> None:
    log = ResultLog()
    log.commit("a", 3, "job-3", "done", 1.0)
    log.commit_many([])
    assert log.committed == 3
    assert log.after("a", 0, 10) == [LogEntry(3, "job-3", "done", 1.0)]


async def test_commit_many_wakes_the_readers_of_its_tenants_only() -> None:
    log = ResultLog()
    log.commit("b", 1, "job-1", "done", None)
    reader_a = asyncio.create_task(log.wait("a", 0, timeout=30))
    reader_b = asyncio.create_task(log.wait("b", 1, timeout=30))  # waits for seq > 1
    await asyncio.sleep(0)  # a yield: each reader's first step runs and waits
    assert (log.waiters("a"), log.waiters("b")) == (1, 1)
    log.commit_many([("a", 2, "job-2", "done", 1.0), ("a", 3, "job-3", "failed", None)])
    await asyncio.wait_for(reader_a, 30)  # woken by its tenant's entries
    for _ in range(3):
        await asyncio.sleep(0)  # a yield: a wake-up of b would have run by now
    assert not reader_b.done()
    assert log.waiters("b") == 1
    log.close()
    await asyncio.wait_for(reader_b, 30)
    assert log.committed == 3
