"""Capacity that follows the load: the sandbox budget and the autoscaler that resizes the
stage pools and the budget (the stages themselves are ``stages``).

A lower room than ``core`` and ``sandbox`` (the pipeline and the runtimes use these
pieces); the parts that look at the pipeline or a runtime (``autoscale``, ``view``)
declare ``Protocol``s of what they read. Warm sandboxes are ``sandbox.WarmPool``."""

from __future__ import annotations

from prorl_async.capacity.autoscale import AutoscaleConfig, Autoscaler, Decision
from prorl_async.capacity.budget import SandboxBudget, default_max_sandboxes, total_memory_bytes

__all__ = [
    "AutoscaleConfig",
    "Autoscaler",
    "Decision",
    "SandboxBudget",
    "default_max_sandboxes",
    "total_memory_bytes",
]
