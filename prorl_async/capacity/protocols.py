"""What the capacity controls read of the rooms above them: the pipeline and a runtime.

``core.Pipeline`` and ``sandbox.Runtime`` satisfy these; capacity never imports them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from prorl_async.capacity.budget import SandboxBudget
from prorl_async.schemas import Stage
from prorl_async.stages.jit import JitAdmission
from prorl_async.stages.stats import StageStats
from prorl_async.stages.workers import WorkerPool

__all__ = ["StagedPipeline", "BudgetedRuntime", "WarmView"]


class StagedPipeline(Protocol):
    """Per-stage queues, workers and statistics, and a way to resize a stage's pool."""

    @property
    def queued(self) -> Mapping[Stage, int]: ...
    @property
    def active(self) -> Mapping[Stage, int]: ...
    @property
    def pools(self) -> Mapping[Stage, WorkerPool[Any]]: ...
    @property
    def stats(self) -> Mapping[str, StageStats]: ...
    @property
    def jit(self) -> JitAdmission: ...
    def resize(self, stage: Stage, size: int) -> None: ...


class WarmView(Protocol):
    """Warm sandboxes as the capacity view reports them."""

    @property
    def ready(self) -> int: ...
    def live_idle_seconds(self) -> float: ...


class BudgetedRuntime(Protocol):
    """A sandbox runtime: its budget of live sandboxes and its warm pool, if any."""

    @property
    def budget(self) -> SandboxBudget: ...
    @property
    def warm(self) -> WarmView | None: ...
