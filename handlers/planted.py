"""Built-in ``planted`` task: an outcome planted per prompt, for trainer tests and benchmarks.

Instance::

    {"outcome": "right"|"wrong"|"random", "p_right": 0.5, "seed": 0,
     "run_s": 0.0, "sigma": 0.0, "hang": false, "init_fail_rate": 0.0, "llm": true}

RUN waits a lognormal time (median ``run_s``, shape ``sigma``: a heavy tail like real
response lengths), then, with ``llm``, runs one agent-loop turn against the server's LLM
backend (real tokens and a real ``weight_version``). EVAL gives reward 1.0 or 0.0: always
for ``right``/``wrong``; for ``random`` a coin of probability ``p_right`` fixed per sample.

The sample key is ``metadata.prorl_trainer.sample_key`` when present (the trainer's
``RolloutManager`` sets it, the same for every retry of one sample), else the job id; the
RUN time and the ``random`` outcome depend only on it, so the right answer of every check is
known. ``init_fail_rate`` fails INIT (an infrastructure failure) per *job id*, so a retry
under a new id may succeed. ``hang`` never finishes RUN (until cancelled or timed out).
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from statistics import NormalDist
from typing import Annotated, Any, Literal

import msgspec

from prorl_async import AgentHandler, Job, run_agent

__all__ = ["PlantedHandler", "PlantedInstance", "planted_reward", "unit"]

Prob = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
NonNeg = Annotated[float, msgspec.Meta(ge=0.0)]


class PlantedInstance(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    outcome: Literal["right", "wrong", "random"] = "right"
    p_right: Prob = 0.5
    seed: int = 0
    run_s: NonNeg = 0.0
    sigma: NonNeg = 0.0
    hang: bool = False
    init_fail_rate: Prob = 0.0
    llm: bool = True


class PlantedInfraError(RuntimeError):
    """The INIT failure a ``planted`` job was asked to inject."""


def unit(*parts: object) -> float:
    """A deterministic number in [0, 1) from ``parts``."""
    digest = hashlib.blake2b("\0".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def planted_reward(inst: PlantedInstance, sample_key: str) -> float:
    """The reward a sample of this instance gets (the known right answer of a test)."""
    if inst.outcome == "random":
        return 1.0 if unit(inst.seed, sample_key, "outcome") < inst.p_right else 0.0
    return 1.0 if inst.outcome == "right" else 0.0


def run_seconds(inst: PlantedInstance, sample_key: str) -> float:
    """Lognormal RUN time of one sample: median ``run_s``, shape ``sigma``."""
    u = min(max(unit(inst.seed, sample_key, "latency"), 1e-9), 1 - 1e-9)
    return inst.run_s * math.exp(inst.sigma * NormalDist().inv_cdf(u))


def sample_key(job: Job) -> str:
    meta = job.metadata.get("prorl_trainer")
    if isinstance(meta, dict) and isinstance(meta.get("sample_key"), str):
        return str(meta["sample_key"])
    return job.id


class _NoTools:
    specs: list[dict[str, Any]] = []

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        raise RuntimeError(f"the planted task has no tool {name!r}")


class PlantedHandler(AgentHandler):
    """Planted outcome, lognormal RUN time, optional injected INIT failures or a hang."""

    name = "planted"
    instance_type = PlantedInstance

    async def init(self, job: Job) -> None:
        inst: PlantedInstance = job.instance
        if unit(inst.seed, job.id, "init") < inst.init_fail_rate:
            raise PlantedInfraError(f"planted INIT failure for job {job.id}")

    async def run(self, job: Job) -> None:
        inst: PlantedInstance = job.instance
        if inst.hang:
            await asyncio.Event().wait()
        key = sample_key(job)
        seconds = run_seconds(inst, key)
        if seconds > 0:
            await asyncio.sleep(seconds)
        if inst.llm:
            messages = [{"role": "user", "content": f"Planted task {key}."}]
            await run_agent(job, messages=messages, tools=_NoTools(), max_turns=1)

    async def eval(self, job: Job) -> None:
        job.reward = planted_reward(job.instance, sample_key(job))
