"""The trainer-side arithmetic of a GRPO step: advantages, learner samples, step figures.

Pure functions over the manager's groups (``trainer.Group``); the learner process does
the tensor work. Advantages are group-normalised rewards: within a prompt's group of
samples, ``(r - mean) / (std + eps)``, so a group whose samples all scored the same
teaches nothing (the manager's ``nonzero_std`` filter drops such groups already).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from prorl_async.trainer import Group

__all__ = ["advantages", "learner_samples", "step_figures"]

_EPS = 1e-6


def advantages(rewards: Sequence[float | None]) -> list[float]:
    """Group-normalised advantages (a missing reward counts as 0)."""
    values = [0.0 if r is None else float(r) for r in rewards]
    mean = statistics.fmean(values)
    std = statistics.pstdev(values)
    return [(v - mean) / (std + _EPS) for v in values]


def learner_samples(batch: Sequence[Group]) -> list[dict[str, Any]]:
    """The learner's ``grpo`` samples of a batch: ids, mask, the engine's logprobs and
    versions per response token, and each sample's advantage."""
    out = []
    for group in batch:
        samples = group.to_verl()
        for sample, adv in zip(samples, advantages(group.rewards), strict=True):
            n = len(sample["response_ids"])
            out.append(
                {
                    "prompt_ids": sample["prompt_ids"],
                    "response_ids": sample["response_ids"],
                    "response_mask": sample["response_mask"] or [1] * n,
                    "logprobs": _padded(sample["response_logprobs"], n),
                    "versions": _padded(sample["response_versions"], n),
                    "advantage": adv,
                }
            )
    return out


def _padded(values: list[Any], n: int) -> list[Any]:
    return list(values[:n]) + [None] * (n - len(values))


def step_figures(batch: Sequence[Group]) -> dict[str, Any]:
    """What a step's rollouts were: reward mean, pass rate, response tokens the loss
    sees, and the range of weight versions their tokens came from."""
    rewards = [0.0 if r is None else float(r) for g in batch for r in g.rewards]
    tokens = sum(sum(s["response_mask"]) for g in batch for s in g.to_verl())
    low = [g.min_weight_version for g in batch if g.min_weight_version is not None]
    high = [g.max_weight_version for g in batch if g.max_weight_version is not None]
    return {
        "reward_mean": statistics.fmean(rewards) if rewards else 0.0,
        "pass_rate": sum(1 for r in rewards if r >= 1.0) / len(rewards) if rewards else 0.0,
        "tokens": tokens,
        "weight_version_min": min(low) if low else None,
        "weight_version_max": max(high) if high else None,
    }
