"""``GET /results``: the result log read by cursor, on a real server (both stores)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest

from prorl_async.client import GoneError
from tests.blocking import BlockingHandler
from tests.helpers import ServerFactory, eventually

SLEEP = {"task": "sleep", "instance": {}}


async def _read_all(client: Any, after: int, count: int, limit: int) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    async with asyncio.timeout(60):
        while len(docs) < count:
            out = await client.results(after, limit=limit, wait=5)
            assert len(out["results"]) <= limit
            docs += out["results"]
            after = out["next"]
    return docs


@pytest.mark.parametrize("store", ["memory", "sqlite"])
async def test_pages_in_seq_order_and_documents_carry_their_seq(
    make_server: ServerFactory, store: str
) -> None:
    async with make_server(store=store) as srv:
        c = srv.client
        ids = await c.submit_batch([SLEEP] * 40)
        docs = await _read_all(c, 0, 40, limit=7)
        seqs = [d["seq"] for d in docs]
        assert seqs == sorted(seqs) and len(set(seqs)) == 40
        assert {d["job_id"] for d in docs} == set(ids)
        # the same document, seq and all, from GET /jobs/{id}
        one = await c.result(docs[5]["job_id"])
        assert one == docs[5]
        out = await c.results(seqs[-1], limit=10)  # nothing after the last: cursor kept
        assert out["results"] == [] and out["next"] == seqs[-1]
        out = await c.results(seqs[9], limit=3)
        assert [d["seq"] for d in out["results"]] == seqs[10:13]
        assert out["next"] == seqs[12]
        assert (await c.status())["last_seq"] == seqs[-1]


async def test_a_long_poll_returns_when_a_job_ends(
    make_server: ServerFactory, blocking: BlockingHandler
) -> None:
    async with make_server() as srv:
        c = srv.client
        job = await c.submit("blocking", {"block": ["run"]})
        start = (await c.status())["last_seq"]
        reader = asyncio.ensure_future(c.results(start, wait=60))
        log = srv.service.store.log
        await eventually(lambda: log.waiters("default") == 1)  # waiting on the server
        assert not reader.done()
        blocking.release(job)
        out = await reader
        assert [d["job_id"] for d in out["results"]] == [job]
        assert log.waiters("default") == 0


async def test_wait_is_capped_by_max_wait_s(make_server: ServerFactory) -> None:
    async with make_server(max_wait_s=0.05) as srv:
        out = await srv.client.results(0, wait=3600)
        assert out == {"results": [], "next": 0, "epoch": out["epoch"]}


@pytest.mark.parametrize("store", ["memory", "sqlite"])
async def test_a_cursor_older_than_retention_is_410_with_the_oldest_seq(
    make_server: ServerFactory, store: str
) -> None:
    async with make_server(store=store, retention_s=60) as srv:
        c = srv.client
        await c.submit_batch([SLEEP] * 5)
        first = await _read_all(c, 0, 5, limit=100)
        # retention passes for these five (expiry checked at a chosen time, not waited for)
        assert srv.service.store.expire(now=time.monotonic() + 61) == 5
        await c.submit_batch([SLEEP] * 3)
        with pytest.raises(GoneError) as info:
            await c.results(first[1]["seq"])
        newest = first[-1]["seq"]
        assert info.value.oldest_seq == newest + 1
        assert f"oldest seq still held is {newest + 1}" in info.value.detail
        async with aiohttp.ClientSession() as s, s.get(f"{srv.url}/results?after=0") as r:
            assert r.status == 410 and r.headers["X-Prorl-Oldest-Seq"] == str(newest + 1)
            assert (await r.json())["oldest_seq"] == newest + 1
        # from the last expired seq on (or with no cursor: from the oldest held), all is there
        rest = await _read_all(c, newest, 3, limit=100)
        assert [d["seq"] for d in rest] == [newest + 1, newest + 2, newest + 3]
        assert [d["seq"] for d in (await c.results(None))["results"]] == [d["seq"] for d in rest]


async def test_a_deleted_or_resubmitted_job_is_read_once_at_its_latest_seq(
    make_server: ServerFactory,
) -> None:
    async with make_server() as srv:
        c = srv.client
        await c.submit("sleep", {}, job_id="again")
        gone = await c.submit("sleep", {}, job_id="gone")
        await _read_all(c, 0, 2, limit=10)
        await c.delete(gone)
        await c.delete("again")
        await c.submit("sleep", {}, job_id="again")
        docs = await _read_all(c, 0, 1, limit=10)
        assert [d["job_id"] for d in docs] == ["again"] and docs[0]["seq"] == 3
        assert (await c.results(0))["results"] == docs


@pytest.mark.parametrize(
    ("query", "headers", "named"),
    [
        ("/results?after=-1", {}, "after:"),
        ("/results?after=x", {}, "after:"),
        ("/results?limit=10001", {}, "limit:"),
        ("/results?wait=nan", {}, "wait:"),
        ("/events", {"Last-Event-ID": "abc"}, "Last-Event-ID:"),
        ("/events?after=1.5", {}, "after:"),
    ],
)
async def test_bad_cursor_parameters_are_400_naming_them(
    make_server: ServerFactory, query: str, headers: dict[str, str], named: str
) -> None:
    async with make_server() as srv:
        async with aiohttp.ClientSession() as s, s.get(srv.url + query, headers=headers) as r:
            assert r.status == 400
            assert (await r.json())["detail"].startswith(named)


@pytest.mark.parametrize("store", ["memory", "sqlite"])
async def test_expiry_in_slices_drops_the_oldest_first_and_all_of_them_in_the_end(
    make_server: ServerFactory, store: str
) -> None:
    """The sweeper drops results a slice a loop step (``expire(limit=...)``): each slice the
    oldest due, none twice, and every result due in the end."""
    async with make_server(store=store, retention_s=60) as srv:
        c, st = srv.client, srv.service.store
        ids = []
        for _ in range(7):  # one at a time: they finish, and expire, in this order
            [job] = await c.submit_batch([SLEEP])
            assert (await c.result(job, wait=30) or {})["status"] == "done"
            ids.append(job)
        [fresh] = await c.submit_batch([{**SLEEP, "instance": {"run_s": 3600}}])
        later = time.monotonic() + 61
        assert st.expire(later, 3) == 3
        out = await c.poll(ids, wait=0)
        assert out["unknown"] == ids[:3] and [d["job_id"] for d in out["done"]] == ids[3:]
        assert [st.expire(later, 3) for _ in range(3)] == [3, 1, 0]
        out = await c.poll([*ids, fresh], wait=0)
        assert out["unknown"] == ids and out["pending"] == [fresh]  # a live job never expires
