"""Argument checks, cluster files, filters and the veRL view (no servers needed)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from prorl_async.trainer import Group, RolloutManager, load_cluster, nonzero_std
from prorl_async.trainer.dispatch import Dispatcher, Settings
from prorl_async.trainer.loop import LoopLag, Waker
from prorl_async.trainer.registry import GroupState
from prorl_async.trainer.servers import ServerPool, ServerState
from prorl_async.trainer.staleness import Staleness


def result(reward: float, version: int, k: int) -> dict[str, Any]:
    return {
        "job_id": f"j{k}",
        "status": "done",
        "reward": reward,
        "prompt_ids": [1, 2],
        "response_ids": [3, 4, 5],
        "response_mask": [1, 0, 1],
        "response_logprobs": [-0.1, 0.0, -0.2],
        "num_turns": 2,
        "turns": [{"role": "assistant", "token_ids": [3], "weight_version": version}],
        "weight_versions": [version],
        "timing": {"active_s": 0.5},
        "metadata": {},
    }


VERL_FIELDS = {
    "prompt_ids",
    "response_ids",
    "response_mask",
    "response_logprobs",
    "response_versions",
    "reward_score",
    "num_turns",
    "metrics",
}


def test_group_fields_and_verl_view() -> None:
    group = Group("p0", {"task": "t"}, [result(1.0, 3, 0), result(0.0, 5, 1)], attempts=3)
    assert group.rewards == [1.0, 0.0]
    assert (group.min_weight_version, group.max_weight_version) == (3, 5)
    assert group.tokens == 4
    verl = group.to_verl()
    assert [v["reward_score"] for v in verl] == [1.0, 0.0]
    for row in verl:
        assert len(row["response_ids"]) == len(row["response_mask"])
        assert len(row["response_ids"]) == len(row["response_logprobs"])
        assert row["num_turns"] == 2 and row["prompt_ids"] == [1, 2]
        assert set(row) == VERL_FIELDS
    assert nonzero_std(group)
    assert not nonzero_std(Group("p1", {}, [result(1.0, 0, 0), result(1.0, 0, 1)]))


def test_staleness_bounds() -> None:
    s = Staleness(1, batch_groups=4)
    assert s.admits(unconsumed=100) and not s.is_stale(0)  # no version yet
    s.set_version(5)
    s.set_version(6)
    assert s.lag(4) == 2 and s.is_stale(4) and not s.is_stale(5)
    assert s.admits(unconsumed=7) and not s.admits(unconsumed=8)
    with pytest.raises(ValueError, match="older than the current 6"):
        s.set_version(2)


def test_staleness_admission_counts_unconsumed_groups_only() -> None:
    # any cadence: many batches at one version, then a jump; the bound never runs out
    s = Staleness(1, batch_groups=4)
    s.set_version(0)
    for _ in range(10):
        s.batch_requested()
        assert s.admits(unconsumed=7) and not s.admits(unconsumed=8)
        s.batch_handed_out()  # an update may come before the next batch: one batch less
        assert s.admits(unconsumed=3) and not s.admits(unconsumed=4)
    s.set_version(3)
    assert s.admits(unconsumed=7)
    lag0 = Staleness(0, batch_groups=4)
    lag0.set_version(0)
    lag0.batch_handed_out()
    assert not lag0.admits(unconsumed=0)  # what starts now would be stale after the update
    lag0.batch_requested()  # no update came: a batch that waits can always start a group
    assert lag0.admits(unconsumed=3)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one of servers"),
        ({"servers": ["h:1"]}, "not an http"),
        ({"servers": ["http://h:1"], "group_size": 0}, "group_size must be > 0"),
        ({"servers": ["http://h:1"], "group_filter": "nope"}, "unknown filter 'nope'"),
        ({"servers": ["http://h:1"], "on_batch_full": "drop"}, "'carry' or 'cancel'"),
        ({"servers": ["http://h:1"], "max_version_lag": -1}, "max_version_lag must be >= 0"),
    ],
)
def test_bad_arguments_name_what_is_wrong(kwargs: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {"prompts": [], "group_size": 2, "batch_groups": 1, **kwargs}
    with pytest.raises(ValueError, match=message):
        RolloutManager(**args)


def test_cluster_file(tmp_path: Path) -> None:
    path = tmp_path / "cluster.json"
    path.write_text(
        json.dumps(
            {
                "slurm_job_id": "7",
                "servers": [{"url": "http://a:1", "node": "a"}],
                "llms": [{"address": "http://a:2/v1", "node": "a"}],
                "assignment": {"http://a:1": ["http://a:2/v1"]},
                "extra": True,
            }
        )
    )
    cluster = load_cluster(path)
    assert [s.url for s in cluster.servers] == ["http://a:1"]
    assert RolloutManager(cluster=path, prompts=[], group_size=1, batch_groups=1).urls == [
        "http://a:1"
    ]
    path.write_text(json.dumps({"servers": []}))
    with pytest.raises(ValueError, match="'servers' is empty"):
        load_cluster(path)
    with pytest.raises(ValueError, match="No such file"):
        load_cluster(tmp_path / "missing.json")


async def test_a_pass_moves_samples_off_a_dead_server_once_and_never_wakes_itself() -> None:
    dead, full = ServerState("http://a", None, 4), ServerState("http://b", None, 0)  # type: ignore[arg-type]
    dead.quarantine()
    settings = Settings(
        group_size=2,
        batch_groups=1,
        max_inflight_groups=1,
        group_filter=nonzero_std,
        max_infra_retries=3,
    )
    dispatcher = Dispatcher(settings, iter([]), ServerPool([dead, full]), Staleness(None, 1), "r")
    dispatcher.reg.add_group(GroupState("p0", {"task": "t", "instance": {}}, 2))
    for sample in dispatcher.reg.pending:  # their submission's answer was lost, then a went down
        sample.pin = dead.url
    for _ in range(3):  # no server has room: every pass leaves the samples waiting
        await dispatcher.dispatch()
        assert not dispatcher.wake.is_set()
        assert sorted(s.job_id for s in dispatcher.reg.pending) == ["r-p0-0-1", "r-p0-1-1"]
        assert all(s.pin is None and s.avoid == dead.url for s in dispatcher.reg.pending)
    assert dead.orphans == {"r-p0-0-0", "r-p0-1-0"}
    assert dispatcher.metrics.retries == {"quarantine": 2}


async def test_waker_yields_when_already_woken_and_keeps_one_timer() -> None:
    waker, order = Waker(), []
    waker.set()

    async def other() -> None:
        order.append("other")

    task = asyncio.ensure_future(other())
    await waker.wait()  # already woken: still lets the other task run first
    order.append("woken")
    await task
    assert order == ["other", "woken"] and not waker.is_set()
    now = time.monotonic()
    waker.at(now + 60, now)
    first = waker._timer
    waker.at(now + 120, now)  # later than the armed timer: nothing new
    assert waker._timer is first and waker._timer_at == now + 60
    waker.at(now, now)  # earlier: the timer moves, and wakes the loop
    assert first is not None and first.cancelled()
    await asyncio.wait_for(waker.wait(), 10)
    assert waker._timer is None
    waker.at(now + 60, now)
    waker.close()
    assert waker._timer is None


def test_loop_lag_keeps_the_max_and_a_recent_window() -> None:
    lag = LoopLag(window=2)
    for late_s in (0.5, 0.001, 0.002, -0.001):
        lag.record(late_s)
    assert lag.to_dict() == {"max": 500.0, "recent": 2.0}
