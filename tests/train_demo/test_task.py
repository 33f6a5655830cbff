"""The train-demo problems: seeded, a fixed held-out set never drawn for training."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from handlers.math import MathHandler, grade_trajectory
from prorl_async.llm.agent_loop import Trajectory
from prorl_async.train_demo.task import (
    OPERANDS,
    Problem,
    answer_text,
    held_out_problems,
    instance,
    is_held_out,
    problems,
    training_problems,
)

ROOT = Path(__file__).resolve().parents[2]


def test_problems_are_seeded() -> None:
    assert problems(7, 50) == problems(7, 50)
    assert problems(7, 50) != problems(8, 50)
    assert problems(7, 50)[:10] == problems(7, 10)
    assert all(
        isinstance(p, Problem) and p.a in OPERANDS and p.b in OPERANDS for p in problems(1, 500)
    )


def test_held_out_is_a_fixed_tenth_disjoint_from_training() -> None:
    train, held = set(training_problems()), set(held_out_problems())
    assert not train & held
    assert len(train | held) == len(OPERANDS) ** 2
    assert 0.09 <= len(held) / len(OPERANDS) ** 2 <= 0.11
    assert held == {Problem(a, b) for a in OPERANDS for b in OPERANDS if is_held_out(a, b)}


def test_held_out_problems_are_held_out_in_both_orders() -> None:
    held = set(held_out_problems())
    assert all(Problem(p.b, p.a) in held for p in held)


def test_training_draws_never_hit_the_held_out_set() -> None:
    for seed in range(20):
        assert not any(is_held_out(*p) for p in problems(seed, 1000))


def test_the_split_is_the_same_in_a_fresh_interpreter() -> None:
    code = (
        "from prorl_async.train_demo.task import held_out_problems, problems\n"
        "print(held_out_problems()[:20], problems(3, 20))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={"PYTHONHASHSEED": "12345", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == f"{held_out_problems()[:20]} {problems(3, 20)}"


def test_the_task_module_needs_only_the_standard_library() -> None:
    """The learner imports it in the engine's venv, which lacks the server's dependencies."""
    code = (
        "import sys, prorl_async.train_demo.task\n"
        "heavy = {'tokenizers', 'aiohttp', 'msgspec', 'jinja2', 'handlers'} & set(sys.modules)\n"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_instances_validate_and_the_trained_answer_is_graded_correct() -> None:
    handler = MathHandler()
    for a, b in [(0, 0), (99, 99), (7, 58)]:
        inst = handler.validate(instance(a, b))
        assert (inst.problem, inst.answer, inst.max_turns) == (f"What is {a} + {b}?", str(a + b), 1)
        reply = Trajectory(turns=[{"role": "assistant", "text": answer_text(a, b) + "<|im_end|>"}])
        assert grade_trajectory(reply, inst.answer)["correct"]
        wrong = Trajectory(turns=[{"role": "assistant", "text": answer_text(a, b + 1)}])
        assert not grade_trajectory(wrong, inst.answer)["correct"]
