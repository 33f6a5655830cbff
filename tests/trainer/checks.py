"""What every returned group must satisfy, computed from the planted outcomes."""

from __future__ import annotations

from typing import Any

import msgspec

from handlers.planted import PlantedInstance, planted_reward
from prorl_async.trainer import Group


def check_group(group: Group, n: int, filtered: bool = True) -> list[tuple[str, int]]:
    """Assert the group is n results of one prompt, rewarded as planted; returns its samples."""
    assert len(group.results) == n
    inst = msgspec.convert(group.job["instance"], PlantedInstance)
    samples = []
    for k, result in enumerate(group.results):
        mine = result["metadata"]["prorl_trainer"]
        assert mine["prompt_uid"] == group.prompt_uid
        assert mine["sample"] == k
        assert result["status"] == "done", result.get("error")
        assert result["reward"] == planted_reward(inst, f"{group.prompt_uid}-{k}")
        samples.append((group.prompt_uid, k))
    if filtered:
        assert len(set(group.rewards)) > 1, "nonzero_std let an all-equal group through"
    return samples


def check_accounting(metrics: dict[str, Any]) -> None:
    """Every prompt taken is in exactly one place: nothing lost."""
    g = metrics["groups"]
    placed = (
        g["returned"]
        + g["filtered"]
        + g["failed"]
        + g["cancelled"]
        + metrics["inflight_groups"]
        + metrics["ready_groups"]
        + metrics["resubmit_groups"]
    )
    assert placed == metrics["prompts_taken"], metrics
