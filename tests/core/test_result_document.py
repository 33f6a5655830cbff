"""The result document of an ended job (``core.result.encode_result``), built directly."""

from __future__ import annotations

from typing import Any

import msgspec

from prorl_async.config import ServerConfig
from prorl_async.core.handler import AgentHandler
from prorl_async.core.job import Job
from prorl_async.core.result import encode_result
from prorl_async.core.shared import Shared
from prorl_async.schemas import ErrorInfo

CONTRACT = [
    "job_id",
    "task",
    "status",
    "reward",
    "prompt_ids",
    "response_ids",
    "response_mask",
    "response_logprobs",
    "response_versions",
    "num_turns",
    "turns",
    "weight_versions",
    "error",
    "timing",
    "eval",
    "metadata",
    "restarts",
    "seq",
]


class _Handler(AgentHandler):
    name = "t"

    def __init__(self, extra: dict[str, Any]) -> None:
        self.extra = extra

    async def run(self, job: Job) -> None:
        raise AssertionError("only the result document is built")

    def final_result(self, job: Job) -> dict[str, Any]:
        return self.extra


class _Trajectory:
    def to_result(self) -> dict[str, Any]:
        return {"prompt_ids": [1, 2], "response_ids": [3], "turns": [{"role": "assistant"}]}


def _job(extra: dict[str, Any], eval_: dict[str, Any]) -> Job:
    job = Job(
        job_id="j-1",
        task="t",
        handler=_Handler(extra),
        instance=None,
        sampling_params={},
        timeout_s=5.0,
        metadata={"m": 1},
        shared=Shared(ServerConfig()),
    )
    job.status, job.reward, job.eval, job.seq = "failed", 0.5, eval_, 7
    job.error = ErrorInfo("run", "X", "boom")
    job.trajectory = _Trajectory()
    job.finished_at = job.submitted_at + 1.0
    return job


def test_document_has_the_contract_keys_in_order_then_the_extras() -> None:
    doc = msgspec.json.decode(encode_result(_job({"extra": 1, "status": "x"}, {"k": 2})))
    assert list(doc) == [*CONTRACT, "extra"]
    assert doc["status"] == "failed"  # an extra never overwrites a contract field
    assert doc["prompt_ids"] == [1, 2] and doc["num_turns"] == 1
    assert doc["error"] == {"stage": "run", "type": "X", "message": "boom"}
    assert doc["eval"] == {"k": 2} and doc["seq"] == 7


def test_unencodable_eval_keeps_the_contract_and_drops_the_extras() -> None:
    doc = msgspec.json.decode(encode_result(_job({"extra": 1}, {"bad": object()})))
    assert list(doc) == CONTRACT
    assert "not encodable" in doc["eval"]["error"]
    assert doc["job_id"] == "j-1" and doc["reward"] == 0.5
