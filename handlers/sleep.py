"""Built-in ``sleep`` task: set durations per stage, for smoke tests, load tests, benchmarks."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

import msgspec

from prorl_async import AgentHandler, Job

NonNeg = Annotated[float, msgspec.Meta(ge=0)]


class SleepInstance(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    init_s: NonNeg = 0.0
    run_s: NonNeg = 0.0
    eval_s: NonNeg = 0.0
    fail_in: Literal["init", "run", "eval"] | None = None
    reward: float = 1.0
    # A synthetic trajectory of this many tokens (half prompt, half response) in the
    # result, to load-test large result documents; 0 keeps the result small.
    result_tokens: Annotated[int, msgspec.Meta(ge=0, le=1_000_000)] = 0


class SleepFailure(RuntimeError):
    """The failure a ``sleep`` job was asked to raise."""


class SleepHandler(AgentHandler):
    """Each stage awaits its duration (cancellable) and raises where ``fail_in`` says."""

    name = "sleep"
    instance_type = SleepInstance

    async def _stage(self, job: Job, stage: str, seconds: float) -> None:
        inst: SleepInstance = job.instance
        if seconds > 0:
            await asyncio.sleep(seconds)
        if inst.fail_in == stage:
            raise SleepFailure(f"sleep task asked to fail in {stage}")

    async def init(self, job: Job) -> None:
        await self._stage(job, "init", job.instance.init_s)

    async def run(self, job: Job) -> None:
        await self._stage(job, "run", job.instance.run_s)
        if job.instance.result_tokens:
            job.trajectory = SyntheticTrajectory(job.instance.result_tokens)

    async def eval(self, job: Job) -> None:
        await self._stage(job, "eval", job.instance.eval_s)
        job.reward = job.instance.reward


class SyntheticTrajectory:
    """A made-up trajectory of ``tokens`` ids with logprobs, the size of a real long one."""

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens

    def to_result(self) -> dict[str, Any]:
        half = self.tokens // 2
        response = self.tokens - half
        return {
            "prompt_ids": [(i * 7919) % 151_000 for i in range(half)],
            "response_ids": [(i * 104_729) % 151_000 for i in range(response)],
            "response_mask": [1] * response,
            "response_logprobs": [-((i % 97) / 31) for i in range(response)],
            "turns": [{"role": "assistant", "text": "", "tokens": response}],
        }
