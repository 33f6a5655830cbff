"""``RolloutService`` is the one façade: its own operations give what the routes give,
the durable acknowledgement included, to any caller (an embedding application, a bench)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from prorl_async.config import load_config
from prorl_async.core.errors import NotFound, PayloadTooLarge
from prorl_async.core.handler import HandlerRegistry
from prorl_async.schemas import JobStatusResponse, ProcessRequest
from prorl_async.service import RolloutService


def _rows(state: Path, ids: list[str]) -> set[str]:
    """The ids among ``ids`` whose rows another connection sees committed."""
    with sqlite3.connect(f"file:{state / 'jobs.sqlite3'}?mode=ro", uri=True) as conn:
        marks = ",".join("?" * len(ids))
        return {r[0] for r in conn.execute(f"SELECT id FROM jobs WHERE id IN ({marks})", ids)}


def _service(state: Path, **overrides: object) -> RolloutService:
    cfg = load_config(overrides={"state_dir": str(state), **overrides}, env={})
    return RolloutService(cfg, HandlerRegistry.discover())


async def test_a_submit_through_the_service_returns_only_once_the_job_is_committed(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    sleep = {"init_s": 30.0}  # still running when read: only the accept can be on disk
    async with _service(state).running() as svc:
        answer, created = await svc.submit(ProcessRequest(task="sleep", instance=sleep))
        assert created and answer.status == "queued"
        # Read at once by another connection, with no await in between: committed.
        assert _rows(state, [answer.job_id]) == {answer.job_id}
        again, created = await svc.submit(
            ProcessRequest(task="sleep", instance=sleep, job_id=answer.job_id)
        )
        assert not created and again.job_id == answer.job_id
        ids = await svc.submit_batch([ProcessRequest(task="sleep", instance=sleep)] * 5)
        assert _rows(state, ids) == set(ids)
        assert isinstance(await svc.result(answer.job_id), JobStatusResponse)
        cancelled = await svc.cancel([answer.job_id, *ids])
        assert sorted(cancelled.cancelled) == sorted([answer.job_id, *ids])


async def test_the_service_refuses_what_the_routes_refuse(tmp_path: Path) -> None:
    async with _service(tmp_path / "state", max_batch=2).running() as svc:
        with pytest.raises(PayloadTooLarge, match="max_batch=2"):
            await svc.submit_batch([ProcessRequest(task="sleep")] * 3)
        with pytest.raises(NotFound, match="unknown job"):
            await svc.result("j-none")
        job, _ = await svc.submit(ProcessRequest(task="sleep"), tenant="a")
        with pytest.raises(NotFound, match="unknown job"):  # another tenant's: unknown
            await svc.result(job.job_id, tenant="b")
        poll = await svc.poll([job.job_id], tenant="b")
        assert poll.unknown == [job.job_id] and poll.done == []
