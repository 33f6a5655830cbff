"""Argument checks, cluster files, filters and the veRL view (no servers needed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from prorl_async.trainer import Group, RolloutManager, load_cluster, nonzero_std
from prorl_async.trainer.staleness import Staleness


def result(reward: float, version: int, k: int) -> dict[str, Any]:
    return {
        "job_id": f"j{k}", "status": "done", "reward": reward, "prompt_ids": [1, 2],
        "response_ids": [3, 4, 5], "response_mask": [1, 0, 1],
        "response_logprobs": [-0.1, 0.0, -0.2], "num_turns": 2,
        "turns": [{"role": "assistant", "token_ids": [3], "weight_version": version}],
        "weight_versions": [version], "timing": {"active_s": 0.5}, "metadata": {},
    }  # fmt: skip


VERL_FIELDS = {
    "prompt_ids", "response_ids", "response_mask", "response_logprobs", "reward_score",
    "num_turns", "metrics",
}  # fmt: skip


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
    assert s.admits(accepted=100, running=100) and not s.is_stale(0)  # no version yet
    s.set_version(5)
    s.set_version(6)
    assert s.lag(4) == 2 and s.is_stale(4) and not s.is_stale(5)
    assert s.admits(accepted=4, running=7) and not s.admits(accepted=4, running=8)
    with pytest.raises(ValueError, match="older than the current 6"):
        s.set_version(2)


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
    path.write_text(json.dumps({
        "slurm_job_id": "7", "servers": [{"url": "http://a:1", "node": "a"}],
        "llms": [{"address": "http://a:2/v1", "node": "a"}],
        "assignment": {"http://a:1": ["http://a:2/v1"]}, "extra": True,
    }))  # fmt: skip
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
