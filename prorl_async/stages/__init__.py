"""The stage machinery: how a stage admits, runs, times and counts a job.

- ``queue.StageQueue``: a stage's FIFO; ``fairshare.FairQueue``: INIT's, served by
  weighted fair share over tenants.
- ``workers.WorkerPool``: the stage's resizable workers (their number is its concurrency).
- ``jit.JitAdmission``: INIT starts a job only when RUN will take it soon.
- ``run.StageRun``: one job's stage: its ``scope.StageScope`` (the explicit handle that
  whatever the stage calls is given), its deadline, and what ``stats.StageStats`` records.

``core.Pipeline`` moves jobs through the stages with these. Nothing here knows a job:
the pieces take items, timers and keys.
"""

from __future__ import annotations

from prorl_async.stages.fairshare import FairQueue, Shares
from prorl_async.stages.jit import JitAdmission, run_queue_target
from prorl_async.stages.queue import StageQueue
from prorl_async.stages.run import StageRun
from prorl_async.stages.scope import StageScope
from prorl_async.stages.stats import Ewma, RateMeter, StageStats
from prorl_async.stages.workers import WorkerPool

__all__ = [
    "Ewma",
    "FairQueue",
    "JitAdmission",
    "RateMeter",
    "Shares",
    "StageQueue",
    "StageRun",
    "StageScope",
    "StageStats",
    "WorkerPool",
    "run_queue_target",
]
