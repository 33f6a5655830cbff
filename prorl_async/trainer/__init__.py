"""Trainer side: ``RolloutManager`` turns rollout servers into batches of GRPO groups.

``from prorl_async.trainer import RolloutManager, Group`` -- see docs/trainer.md.
"""

from prorl_async.trainer.cluster import ClusterFile, load_cluster
from prorl_async.trainer.errors import (
    PromptsExhausted,
    RolloutStalled,
    TrainerError,
    WeightsFailed,
    WeightsTimeout,
)
from prorl_async.trainer.filters import FILTERS, GroupFilter, nonzero_std
from prorl_async.trainer.group import Group
from prorl_async.trainer.manager import RolloutManager

__all__ = [
    "FILTERS",
    "ClusterFile",
    "Group",
    "GroupFilter",
    "PromptsExhausted",
    "RolloutManager",
    "RolloutStalled",
    "TrainerError",
    "WeightsFailed",
    "WeightsTimeout",
    "load_cluster",
    "nonzero_std",
]
