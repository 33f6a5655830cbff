"""Stage capacity that follows the load: the sandbox budget, resizable worker pools,
just-in-time INIT, stage statistics and the autoscaler.

A lower room than ``core`` and ``sandbox`` (the pipeline and the runtimes use these
pieces); the parts that look at the pipeline or a runtime (``autoscale``, ``view``)
declare ``Protocol``s of what they read. Warm sandboxes are ``sandbox.WarmPool``."""

from __future__ import annotations

from prorl_async.capacity.autoscale import AutoscaleConfig, Autoscaler, Decision
from prorl_async.capacity.budget import SandboxBudget, default_max_sandboxes, total_memory_bytes
from prorl_async.capacity.jit import JitAdmission, run_queue_target
from prorl_async.capacity.stats import Ewma, Pulse, RateMeter, StageStats
from prorl_async.capacity.workers import StageQueue, WorkerPool

__all__ = [
    "AutoscaleConfig",
    "Autoscaler",
    "Decision",
    "Ewma",
    "JitAdmission",
    "Pulse",
    "RateMeter",
    "SandboxBudget",
    "StageQueue",
    "StageStats",
    "WorkerPool",
    "default_max_sandboxes",
    "run_queue_target",
    "total_memory_bytes",
]
