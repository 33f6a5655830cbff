"""Built-in ``math`` task: solve a problem with a Python kernel, graded against a reference.

Instance::

    {"problem": str, "answer": str, "max_turns": int?, "system": str?}

``answer`` is a plain final answer (``"18"``, ``"\\frac{1}{3}"``) or a worked solution whose
final answer is a GSM8K ``#### 18`` line or a ``\\boxed{...}``. INIT starts a sandbox;
RUN runs the agent loop with the ``python`` tool (plus ``finish``); EVAL grades the answer
given to ``finish`` (else the last ``\\boxed{}`` or ``#### x`` of the last assistant turn)
with :func:`prorl_async.grading.math.grade`: reward 1.0 when it matches, 0.0 otherwise.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

import msgspec

from prorl_async import (
    AgentHandler,
    InstanceError,
    Job,
    SandboxTools,
    Trajectory,
    run_agent,
    start_sandbox,
)
from prorl_async.grading.math import extract_answer, grade, normalize, reference_answer
from prorl_async.sandbox import SandboxSpec

__all__ = ["MathHandler", "MathInstance", "grade_trajectory", "last_assistant_text"]

DEFAULT_SYSTEM = (
    "You are solving a math problem. You have a `python` tool: a persistent IPython kernel, "
    "use it for any calculation. When you are sure, call `finish` with the final answer "
    "alone (a number or a short expression, no units or words)."
)
TOOLS = ["python"]
# Echoed raw answers are cut to this many characters in the eval details.
_SHOWN = 256
# Special tokens the engine leaves at the end of a reply (``<|im_end|>``, ``<|endoftext|>``).
_TRAILING_SPECIALS = re.compile(r"(?:\s*<\|[^<>|\s]{1,40}\|>)+\s*$")


class MathInstance(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One math problem and its reference answer."""

    problem: Annotated[str, msgspec.Meta(min_length=1)]
    answer: Annotated[str, msgspec.Meta(min_length=1)]
    max_turns: Annotated[int, msgspec.Meta(ge=1, le=1000)] | None = None
    system: str = DEFAULT_SYSTEM


def last_assistant_text(trajectory: Trajectory | None) -> str:
    """Text of the last assistant turn, without the engine's trailing special tokens."""
    if trajectory is None:
        return ""
    for turn in reversed(trajectory.turns):
        if turn["role"] == "assistant":
            return _TRAILING_SPECIALS.sub("", str(turn.get("text") or ""))
    return ""


def grade_trajectory(trajectory: Trajectory | None, reference: str) -> dict[str, Any]:
    """The ``eval`` details of one rollout: what was compared, how, and whether it matched."""
    finish_answer = trajectory.answer if trajectory is not None else None
    predicted = extract_answer(last_assistant_text(trajectory), finish_answer)
    ref = reference_answer(reference)
    result = grade(predicted, ref)
    return {
        "correct": result.correct,
        "method": result.method,
        "predicted": None if predicted is None else predicted[:_SHOWN],
        "reference": ref[:_SHOWN],
        "predicted_normalized": result.predicted_normalized,
        "reference_normalized": result.reference_normalized,
        "answer_source": _answer_source(finish_answer, predicted),
        "finish": trajectory.finish if trajectory is not None else None,
    }


def _answer_source(finish_answer: str | None, predicted: str | None) -> str:
    if predicted is None:
        return "none"
    return "finish" if finish_answer is not None and finish_answer.strip() else "text"


class MathHandler(AgentHandler):
    """The ``math`` task: a real agent loop with a Python tool, graded by the math grader."""

    name = "math"
    instance_type = MathInstance

    def validate(self, instance: dict[str, Any]) -> Any:
        inst: MathInstance = super().validate(instance)
        if not inst.problem.strip():
            raise InstanceError("instance.problem: must not be blank")
        if not normalize(reference_answer(inst.answer)):
            raise InstanceError(
                f"instance.answer: no final answer can be read from {inst.answer[:80]!r}"
            )
        return inst

    async def init(self, job: Job) -> None:
        spec = SandboxSpec(limits=job.shared.config.sandbox_limits)
        job.state["sandbox"] = await start_sandbox(job, spec)

    async def run(self, job: Job) -> None:
        inst: MathInstance = job.instance
        messages = [
            {"role": "system", "content": inst.system},
            {"role": "user", "content": inst.problem},
        ]
        tools = SandboxTools(job.state["sandbox"], TOOLS, job)
        await run_agent(job, messages=messages, tools=tools, max_turns=inst.max_turns)

    async def eval(self, job: Job) -> None:
        trajectory = job.trajectory if isinstance(job.trajectory, Trajectory) else None
        job.eval = grade_trajectory(trajectory, job.instance.answer)
        job.reward = 1.0 if job.eval["correct"] else 0.0
