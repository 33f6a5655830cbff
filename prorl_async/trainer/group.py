"""A GRPO group: the n results of one prompt, and its veRL and slime views."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Group",
    "active_seconds",
    "generated_tokens",
    "slime_status",
    "to_slime",
    "to_verl",
    "weight_versions",
]


def weight_versions(result: dict[str, Any]) -> list[int]:
    """Integer weight versions a result's turns were generated with."""
    found = [v for v in result.get("weight_versions") or () if isinstance(v, int)]
    # Per token (an interrupted turn has several): the oldest is what staleness counts.
    found.extend(v for v in set(result.get("response_versions") or ()) if isinstance(v, int))
    for turn in result.get("turns") or ():
        v = turn.get("weight_version") if isinstance(turn, dict) else None
        if isinstance(v, int) and not isinstance(v, bool):
            found.append(v)
    return found


def generated_tokens(result: dict[str, Any]) -> int:
    """Tokens the LLM generated for a result (mask-1 response tokens)."""
    mask = result.get("response_mask")
    if isinstance(mask, list):
        return int(sum(1 for m in mask if m))
    return 0


def active_seconds(result: dict[str, Any]) -> float:
    """Seconds a result's job was actively worked on (``timing.active_s``; 0 if absent)."""
    timing = result.get("timing") or {}
    value = timing.get("active_s") if isinstance(timing, dict) else None
    return float(value) if isinstance(value, int | float) else 0.0


@dataclass
class Group:
    """The ``group_size`` results of one prompt, in sample order.

    ``attempts`` counts job submissions for this group (``group_size`` when nothing was
    retried). ``min_weight_version``/``max_weight_version`` span every turn of every
    result (``None`` when no turn carries an integer version).
    """

    prompt_uid: str
    job: dict[str, Any]
    results: list[dict[str, Any]]
    attempts: int = 0
    rewards: list[float | None] = field(init=False)
    min_weight_version: int | None = field(init=False)
    max_weight_version: int | None = field(init=False)

    def __post_init__(self) -> None:
        self.rewards = [_reward(r) for r in self.results]
        versions = [v for r in self.results for v in weight_versions(r)]
        self.min_weight_version = min(versions) if versions else None
        self.max_weight_version = max(versions) if versions else None

    @property
    def tokens(self) -> int:
        return sum(generated_tokens(r) for r in self.results)

    def to_verl(self) -> list[dict[str, Any]]:
        """One dict per sample with veRL ``AgentLoopOutput`` field names."""
        return [to_verl(r) for r in self.results]

    def to_slime(self) -> list[dict[str, Any]]:
        """One dict per sample with slime ``Sample`` field names."""
        return [to_slime(r) for r in self.results]


def _reward(result: dict[str, Any]) -> float | None:
    reward = result.get("reward")
    return float(reward) if isinstance(reward, int | float) else None


def to_verl(result: dict[str, Any]) -> dict[str, Any]:
    """A result as veRL ``AgentLoopOutput`` fields, plus our ``response_versions``
    (docs/integrations.md)."""
    return {
        "prompt_ids": list(result.get("prompt_ids") or []),
        "response_ids": list(result.get("response_ids") or []),
        "response_mask": list(result.get("response_mask") or []),
        "response_logprobs": list(result.get("response_logprobs") or []),
        "response_versions": list(result.get("response_versions") or []),
        "reward_score": _reward(result),
        "num_turns": int(result.get("num_turns") or 0),
        "metrics": {
            "status": result.get("status"),
            "timing": result.get("timing") or {},
            "weight_versions": result.get("weight_versions") or [],
            "job_id": result.get("job_id"),
        },
    }


# Our terminal status -> slime ``Sample.Status`` value. A timeout is a budget cut, like a
# length cut: the trajectory so far is the policy's own (trainer/retry.py scores it too).
_SLIME_STATUS = {
    "done": "completed",
    "timed_out": "truncated",
    "failed": "failed",
    "cancelled": "aborted",
}
# ``finish`` of a done job the context or ``max_tokens`` cut short.
_CUT_SHORT = frozenset({"length", "context_exhausted"})


def slime_status(result: dict[str, Any]) -> str:
    """The slime ``Sample.Status`` value of a finished job's result."""
    status = result.get("status")
    if not isinstance(status, str) or status not in _SLIME_STATUS:
        raise ValueError(f"job {result.get('job_id')!r} has not ended (status {status!r})")
    if status == "done" and result.get("finish") in _CUT_SHORT:
        return "truncated"
    return _SLIME_STATUS[status]


def to_slime(result: dict[str, Any]) -> dict[str, Any]:
    """A result as the slime ``Sample`` fields we can fill (docs/integrations.md).

    ``status`` is the ``Sample.Status`` value (``Sample.Status(row["status"])``);
    ``metadata`` holds only our keys, to merge into the sample's own.
    """
    prompt = list(result.get("prompt_ids") or [])
    response = list(result.get("response_ids") or [])
    turns = [t for t in result.get("turns") or () if isinstance(t, dict)]
    return {
        "tokens": prompt + response,
        "response": "".join(str(t.get("text") or "") for t in turns),
        "response_length": len(response),
        "reward": _reward(result),
        "loss_mask": list(result.get("response_mask") or []),
        "weight_versions": [str(v) for v in result.get("weight_versions") or ()],
        "rollout_log_probs": list(result.get("response_logprobs") or []),
        "status": slime_status(result),
        "metadata": {
            "prorl_async": {
                "job_id": result.get("job_id"),
                "status": result.get("status"),
                "num_turns": int(result.get("num_turns") or 0),
                "response_versions": list(result.get("response_versions") or []),
                "timing": result.get("timing") or {},
            }
        },
    }
