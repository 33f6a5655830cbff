"""Stages, timers, failures and cancel, through the real server over HTTP."""

from __future__ import annotations

import asyncio

import pytest

from tests.blocking import BlockingHandler
from tests.helpers import ServerFactory, eventually


async def test_sleep_job_runs_all_stages(make_server: ServerFactory) -> None:
    async with make_server() as srv:
        job_id = await srv.client.submit(
            "sleep",
            {"init_s": 0.01, "run_s": 0.05, "eval_s": 0.01, "reward": 0.25},
            metadata={"k": [1, 2]},
        )
        res = await srv.client.result(job_id, wait=10)
        assert res is not None
        assert res["status"] == "done" and res["reward"] == 0.25 and res["error"] is None
        assert res["metadata"] == {"k": [1, 2]}
        t = res["timing"]
        # loop timers have ~1 ms granularity
        assert t["run_s"] >= 0.045 and t["init_s"] >= 0.008 and t["eval_s"] >= 0.008
        assert t["active_s"] == pytest.approx(t["init_s"] + t["run_s"] + t["eval_s"], abs=1e-5)
        assert res["prompt_ids"] == [] and res["num_turns"] == 0


async def test_queue_time_does_not_count_against_timeout(make_server: ServerFactory) -> None:
    async with make_server(run_workers=1) as srv:
        blocker = await srv.client.submit("sleep", {"run_s": 5.0}, timeout_s=30)
        waiter = await srv.client.submit("sleep", {"run_s": 0.05}, timeout_s=1.0)
        res = await srv.client.result(waiter, wait=30)
        assert res is not None and res["status"] == "done", res
        assert res["timing"]["queued_s"] >= 4.0  # waited behind the 5 s job
        assert res["timing"]["active_s"] < 1.0
        first = await srv.client.result(blocker, wait=5)
        assert first is not None and first["status"] == "done"


async def test_run_over_budget_times_out(make_server: ServerFactory) -> None:
    async with make_server() as srv:
        job_id = await srv.client.submit("sleep", {"run_s": 30.0}, timeout_s=0.3)
        res = await srv.client.result(job_id, wait=10)
        assert res is not None and res["status"] == "timed_out"
        assert res["error"]["stage"] == "run" and res["error"]["type"] == "TimeoutError"
        assert 0.25 <= res["timing"]["active_s"] < 2.0
        assert res["reward"] is None


async def test_timeout_releases_held_resources(
    make_server: ServerFactory, blocking: BlockingHandler
) -> None:
    async with make_server() as srv:
        job_id = await srv.client.submit("blocking", {"block": ["run"]}, timeout_s=0.3)
        res = await srv.client.result(job_id, wait=10)
        assert res is not None and res["status"] == "timed_out" and res["error"]["stage"] == "run"
        assert job_id in blocking.released and job_id not in blocking.held
        assert (job_id, "run_exception") in blocking.calls


@pytest.mark.parametrize("stage", ["init", "run", "eval"])
async def test_failure_in_each_stage(make_server: ServerFactory, stage: str) -> None:
    async with make_server(init_workers=1, run_workers=1, eval_workers=1) as srv:
        bad = await srv.client.submit("sleep", {"fail_in": stage})
        res = await srv.client.result(bad, wait=10)
        assert res is not None and res["status"] == "failed"
        assert res["error"] == {
            "stage": stage,
            "type": "SleepFailure",
            "message": f"sleep task asked to fail in {stage}",
        }
        assert res["reward"] is None
        # The single worker of each stage keeps serving.
        ids = await srv.client.submit_batch([{"task": "sleep", "instance": {}}] * 5)
        for job_id in ids:
            ok = await srv.client.result(job_id, wait=10)
            assert ok is not None and ok["status"] == "done"


@pytest.mark.parametrize("stage", ["init", "run", "eval"])
async def test_failure_calls_exception_hook_and_skips_later_stages(
    make_server: ServerFactory, blocking: BlockingHandler, stage: str
) -> None:
    async with make_server() as srv:
        job_id = await srv.client.submit("blocking", {"fail": stage})
        res = await srv.client.result(job_id, wait=10)
        assert res is not None and res["status"] == "failed" and res["error"]["stage"] == stage
        assert res["blocking_final"] is True  # final_result extras reach the document
        stages = [s for j, s in blocking.calls if j == job_id]
        order = ["init", "run", "eval"]
        assert stages == order[: order.index(stage) + 1] + [f"{stage}_exception"]
        assert job_id in blocking.released and not blocking.held


async def test_resources_released_after_run_before_eval(
    make_server: ServerFactory, blocking: BlockingHandler
) -> None:
    async with make_server() as srv:
        job_id = await srv.client.submit("blocking", {"block": ["eval"]})
        await blocking.event(job_id, "eval").wait()
        assert job_id in blocking.released  # freed right after RUN, EVAL still running
        blocking.release(job_id)
        res = await srv.client.result(job_id, wait=10)
        assert res is not None and res["status"] == "done" and res["reward"] == 0.5


@pytest.mark.parametrize("stage", ["init", "run", "eval"])
async def test_cancel_in_stage(
    make_server: ServerFactory, blocking: BlockingHandler, stage: str
) -> None:
    async with make_server() as srv:
        job_id = await srv.client.submit("blocking", {"block": [stage]})
        await blocking.event(job_id, stage).wait()
        out = await srv.client.cancel(job_id)
        assert out == {"cancelled": [job_id], "already_finished": [], "not_found": []}
        # Released before the cancel call returned.
        assert job_id in blocking.released and job_id not in blocking.held
        res = await srv.client.result(job_id)
        assert res is not None and res["status"] == "cancelled"
        again = await srv.client.cancel([job_id, "nope"])
        assert again == {"cancelled": [], "already_finished": [job_id], "not_found": ["nope"]}


async def test_cancel_queued_job_never_runs(
    make_server: ServerFactory, blocking: BlockingHandler
) -> None:
    async with make_server(init_workers=1) as srv:
        blocker = await srv.client.submit("blocking", {"block": ["init"]})
        await blocking.event(blocker, "init").wait()
        queued = await srv.client.submit("blocking", {}, job_id="q-1")
        status = await srv.client.status()
        assert status["queues"]["init"] == 1
        out = await srv.client.cancel([queued])
        assert out["cancelled"] == [queued]
        assert (await srv.client.status())["queues"]["init"] == 0
        blocking.release(blocker)
        assert (await srv.client.result(blocker, wait=10) or {})["status"] == "done"
        # A late duplicate submit does not resurrect it, and it never ran.
        assert await srv.client.submit("blocking", {}, job_id="q-1") == "q-1"
        res = await srv.client.result("q-1")
        assert res is not None and res["status"] == "cancelled"
        assert not [c for c in blocking.calls if c[0] == "q-1"]


async def test_cancel_between_stages_releases(
    make_server: ServerFactory, blocking: BlockingHandler
) -> None:
    async with make_server(run_workers=1) as srv:
        blocker = await srv.client.submit("blocking", {"block": ["run"]})
        await blocking.event(blocker, "run").wait()
        second = await srv.client.submit("blocking", {})
        await blocking.event(second, "init").wait()

        async def in_run_queue() -> bool:  # INIT finished, waiting for the RUN worker
            queued: int = (await srv.client.status())["queues"]["run"]
            return queued == 1

        await eventually(in_run_queue)
        assert second in blocking.held
        await srv.client.cancel(second)
        assert second not in blocking.held
        blocking.release(blocker)
        await srv.client.result(blocker, wait=10)
        assert (second, "run") not in blocking.calls


async def test_idempotent_submit(make_server: ServerFactory, blocking: BlockingHandler) -> None:
    async with make_server() as srv:
        a = await srv.client.submit("blocking", {"block": ["run"]}, job_id="same")
        b = await srv.client.submit("blocking", {}, job_id="same")
        assert a == b == "same"
        ids = await srv.client.submit_batch(
            [
                {"task": "blocking", "instance": {}, "job_id": "same"},
                {"task": "sleep", "instance": {}, "job_id": "b1"},
                {"task": "sleep", "instance": {}, "job_id": "b1"},
            ]
        )
        assert ids == ["same", "b1", "b1"]
        await blocking.event("same", "run").wait()
        assert [c for c in blocking.calls if c == ("same", "init")] == [("same", "init")]
        blocking.release("same")
        assert (await srv.client.result("same", wait=10) or {})["status"] == "done"


async def test_stop_cancels_everything_and_start_resumes(
    make_server: ServerFactory, blocking: BlockingHandler
) -> None:
    from prorl_async.client import ServiceUnavailableError

    async with make_server(init_workers=1) as srv:
        running = await srv.client.submit("blocking", {"block": ["init"]})
        queued = await srv.client.submit("blocking", {})
        await blocking.event(running, "init").wait()
        status = await srv.client.stop()
        assert status["state"] == "stopped"
        assert not blocking.held
        for job_id in (running, queued):
            assert (await srv.client.result(job_id) or {})["status"] == "cancelled"
        with pytest.raises(ServiceUnavailableError) as err:
            await srv.client.submit("sleep", {})
        assert err.value.retry_after is not None
        await srv.client.start()
        job_id = await srv.client.submit("sleep", {})
        assert (await srv.client.result(job_id, wait=10) or {})["status"] == "done"


async def test_many_jobs_concurrently_all_finish(make_server: ServerFactory) -> None:
    async with make_server() as srv:
        jobs = [
            {
                "task": "sleep",
                "instance": {"run_s": 0.001 * (i % 7), "fail_in": "run" if i % 10 == 0 else None},
            }
            for i in range(2000)
        ]
        ids = await srv.client.submit_batch(jobs)
        pending, results = set(ids), {}
        while pending:
            out = await srv.client.poll(sorted(pending), wait=5)
            for doc in out["done"]:
                results[doc["job_id"]] = doc
                pending.discard(doc["job_id"])
        statuses = [results[i]["status"] for i in ids]
        assert statuses.count("failed") == 200 and statuses.count("done") == 1800
        status = await srv.client.status()
        assert status["jobs"]["done"] == 1800 and status["active"] == {
            "init": 0,
            "run": 0,
            "eval": 0,
        }


async def test_worker_count_bounds_concurrency(
    make_server: ServerFactory, blocking: BlockingHandler
) -> None:
    # Eager INIT: with just-in-time INIT only one job would be let into RUN's queue.
    async with make_server(run_workers=2, jit_init=False) as srv:
        ids = [await srv.client.submit("blocking", {"block": ["run"]}) for _ in range(4)]
        await blocking.event(ids[0], "run").wait()
        await blocking.event(ids[1], "run").wait()

        async def two_queued() -> bool:
            queued: int = (await srv.client.status())["queues"]["run"]
            return queued == 2

        await eventually(two_queued)
        status = await srv.client.status()
        assert status["active"]["run"] == 2
        assert (
            not blocking.event(ids[2], "run").is_set()
            and not blocking.event(ids[3], "run").is_set()
        )
        for job_id in ids:
            blocking.release(job_id)
        for job_id in ids:
            assert (await srv.client.result(job_id, wait=10) or {})["status"] == "done"


async def test_cancel_racing_completion_is_consistent(
    make_server: ServerFactory,
) -> None:
    async with make_server() as srv:
        ids = await srv.client.submit_batch([{"task": "sleep", "instance": {}}] * 300)
        out = await srv.client.cancel(ids)
        assert sorted(out["cancelled"] + out["already_finished"]) == sorted(ids)
        polled = await srv.client.poll(ids, wait=5)
        while polled["pending"]:
            polled = await srv.client.poll(ids, wait=5)
        by_id = {d["job_id"]: d["status"] for d in polled["done"]}
        assert all(by_id[i] == "cancelled" for i in out["cancelled"])
        await asyncio.sleep(0)


async def test_submit_wire_statuses(make_server: ServerFactory, blocking: BlockingHandler) -> None:
    import aiohttp

    async with make_server() as srv, aiohttp.ClientSession() as s:
        body = {"task": "blocking", "instance": {"block": ["run"]}, "job_id": "w1"}
        async with s.post(f"{srv.url}/process", json=body) as r:
            assert r.status == 202 and await r.json() == {"job_id": "w1", "status": "queued"}
        await blocking.event("w1", "run").wait()
        async with s.post(f"{srv.url}/process", json=body) as r:
            assert r.status == 200 and await r.json() == {"job_id": "w1", "status": "run"}
        blocking.release("w1")
        assert (await srv.client.result("w1", wait=10) or {})["status"] == "done"
        async with s.post(f"{srv.url}/process", json=body) as r:
            assert r.status == 200 and (await r.json())["status"] == "done"
