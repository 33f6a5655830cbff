"""The demo's task mix: math word problems, code problems in both styles, swe bug fixes.

``generate_tasks(n, seed=..., error_rate=...)`` returns ``n`` :class:`DemoTask` in a fixed
rotation of kinds, each with the ``/process`` body to submit and the script the demo policy
plays for it. Whether the scripted model errs on a task is drawn from the seed, so a run is
reproducible and ``round(n * error_rate)`` of the tasks score 0.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from prorl_async.demo import code_tasks, math_tasks, swe_tasks
from prorl_async.demo.policy import Script

__all__ = ["KINDS", "DemoTask", "generate_tasks"]

# One rotation: two math problems per code and swe problem (math is the cheapest to run).
KINDS = ("math", "code-stdio", "swe", "math", "code-function", "swe")


@dataclass(frozen=True)
class DemoTask:
    """One generated task: what to submit, and the script the demo policy follows."""

    key: str
    kind: str
    task: str
    instance: dict[str, Any]
    script: Script
    wrong: bool

    def body(self, timeout_s: float = 120.0) -> dict[str, Any]:
        """The ``/process`` request body; ``metadata`` (echoed in the result) names the task."""
        meta = {"demo_key": self.key, "demo_kind": self.kind, "scripted_error": self.wrong}
        return {
            "task": self.task,
            "instance": self.instance,
            "job_id": f"demo-{self.key}",
            "timeout_s": timeout_s,
            "metadata": meta,
        }


def generate_tasks(
    n: int, *, seed: int = 0, error_rate: float = 0.25, kinds: tuple[str, ...] = KINDS
) -> list[DemoTask]:
    """``n`` tasks cycling through ``kinds``; reproducible for a given ``seed``."""
    if n < 0:
        raise ValueError(f"jobs must be >= 0, got {n}")
    if not 0.0 <= error_rate <= 1.0:
        raise ValueError(f"error_rate must be within [0, 1], got {error_rate}")
    unknown = sorted(set(kinds) - set(_MAKERS))
    if unknown:
        raise ValueError(f"unknown task kinds {unknown}; choose from {sorted(_MAKERS)}")
    rng = random.Random(seed)
    # Exactly round(n * error_rate) tasks are scripted to fail, spread at random.
    wrong = set(rng.sample(range(n), round(n * error_rate)))
    tasks = []
    for i in range(n):
        kind = kinds[i % len(kinds)]
        tasks.append(_MAKERS[kind](f"{kind.split('-')[0]}-{i:04d}", rng, i in wrong))
    return tasks


def _math(key: str, rng: random.Random, wrong: bool) -> DemoTask:
    problem, answer, script = math_tasks.make(key, rng, wrong)
    instance = {"problem": problem, "answer": answer}
    return DemoTask(key, "math", "math", instance, script, wrong)


def _code_stdio(key: str, rng: random.Random, wrong: bool) -> DemoTask:
    instance, script = code_tasks.make_stdio(key, rng, wrong)
    return DemoTask(key, "code-stdio", "code", instance, script, wrong)


def _code_function(key: str, rng: random.Random, wrong: bool) -> DemoTask:
    instance, script = code_tasks.make_function(key, rng, wrong)
    return DemoTask(key, "code-function", "code", instance, script, wrong)


def _swe(key: str, rng: random.Random, wrong: bool) -> DemoTask:
    instance, script = swe_tasks.make(key, rng, wrong)
    return DemoTask(key, "swe", "swe", instance, script, wrong)


_MAKERS = {
    "math": _math,
    "code-stdio": _code_stdio,
    "code-function": _code_function,
    "swe": _swe,
}
