"""Stage capacity that follows the load: sandbox budget, resizable pools, JIT INIT,
warm sandboxes and the autoscaler."""

from __future__ import annotations

from prorl_async.capacity.autoscale import AutoscaleConfig, Autoscaler, Decision
from prorl_async.capacity.budget import SandboxBudget, default_max_sandboxes, total_memory_bytes
from prorl_async.capacity.jit import JitGate, run_queue_target
from prorl_async.capacity.stats import Ewma, Pulse, RateMeter, StageStats
from prorl_async.capacity.warm import WarmPool
from prorl_async.capacity.workers import WorkerPool

__all__ = [
    "AutoscaleConfig",
    "Autoscaler",
    "Decision",
    "Ewma",
    "JitGate",
    "Pulse",
    "RateMeter",
    "SandboxBudget",
    "StageStats",
    "WarmPool",
    "WorkerPool",
    "default_max_sandboxes",
    "run_queue_target",
    "total_memory_bytes",
]
