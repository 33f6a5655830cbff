"""Building the result document of a terminal job (API.md)."""

from __future__ import annotations

import logging
import time
from typing import Any

import msgspec

from prorl_async.core.job import EVAL, INIT, RUN, Job, TrajectoryLike

__all__ = ["encode_result", "timing"]

log = logging.getLogger(__name__)

_encoder = msgspec.json.Encoder()

_EMPTY_TRAJECTORY: dict[str, Any] = {
    "prompt_ids": [],
    "response_ids": [],
    "response_mask": [],
    "response_logprobs": [],
    "response_versions": [],
    "num_turns": 0,
    "turns": [],
    "weight_versions": [],
}


# The timing object at microsecond precision, formatted in one step instead of rounding
# each value and then encoding it as a float: the whole document 49k -> 40k instructions
# (callgrind). The values are the same JSON numbers ("0.000008" where it was 8e-06).
_TIMING = (
    b'{"queued_s":%.6f,"init_s":%.6f,"run_s":%.6f,"eval_s":%.6f,"active_s":%.6f,'
    b'"backend_wait_s":%.6f,"total_s":%.6f,"ended_at":%.6f}'
)


def timing(job: Job) -> bytes:
    """The result's ``timing`` object (JSON)."""
    active = job.stage_active
    init = active.get(INIT, 0.0)
    run = active.get(RUN, 0.0)
    eval_ = active.get(EVAL, 0.0)
    total_active = init + run + eval_
    wall = sum(job.stage_wall.values())
    return _TIMING % (
        job.queued_s,
        init,
        run,
        eval_,
        total_active,
        # Time inside a stage with the timer paused (waiting for an LLM backend).
        max(wall - total_active, 0.0),
        # Submit to terminal, wall clock: queued + active + backend wait + orchestration.
        max(job.finished_at - job.submitted_at, 0.0),
        # When it ended, wall clock (Unix seconds): how late a reader learns of it.
        time.time() - time.monotonic() + job.finished_at,
    )


# The document's keys in their order, with the values of a job without a trajectory:
# each document starts as a copy (one allocation at its final size, where filling an
# empty dict grew it twice) and its own values replace these in place.
_TEMPLATE: dict[str, Any] = {
    "job_id": None,
    "task": None,
    "status": None,
    "reward": None,
    **_EMPTY_TRAJECTORY,
    "error": None,
    "timing": None,
    "eval": None,
    "metadata": None,
    "restarts": 0,
    "seq": None,
}
_CONTRACT_KEYS = frozenset(_TEMPLATE)  # API.md's fields; a handler's extras are the rest


def _trajectory_fields(trajectory: TrajectoryLike) -> dict[str, Any]:
    fields = dict(_EMPTY_TRAJECTORY)
    fields.update(trajectory.to_result())
    fields["num_turns"] = sum(1 for t in fields["turns"] if t.get("role") == "assistant")
    return fields


def _extra(job: Job) -> dict[str, Any]:
    try:
        return dict(job.handler.final_result(job))
    except Exception:
        log.exception("final_result of task %r raised", job.task)
        return {}


def encode_result(job: Job) -> bytes:
    """The JSON result document, encoded once when the job ends."""
    doc = _TEMPLATE.copy()
    doc["job_id"] = job.id
    doc["task"] = job.task
    doc["status"] = job.status
    doc["reward"] = job.reward
    if job.trajectory is not None:
        doc.update(_trajectory_fields(job.trajectory))
    if job.error is not None:
        doc["error"] = msgspec.structs.asdict(job.error)
    doc["timing"] = msgspec.Raw(timing(job))
    doc["eval"] = job.eval
    doc["metadata"] = job.metadata
    doc["restarts"] = job.restarts
    doc["seq"] = job.seq  # its place in the result log (GET /results, /events)
    for key, value in _extra(job).items():
        doc.setdefault(key, value)  # extras never overwrite contract fields
    try:
        return _encoder.encode(doc)
    except (TypeError, ValueError) as exc:
        log.error("result of job %s is not JSON-encodable (%s); dropping eval details", job.id, exc)
        doc["eval"] = {"error": f"eval details not encodable: {exc}"}
        return _encoder.encode({k: v for k, v in doc.items() if k in _CONTRACT_KEYS})
