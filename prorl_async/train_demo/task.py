"""The train-demo task: ``What is A + B?`` for A, B in 0..99, with a fixed held-out split.

A seeded tenth of the unordered pairs {A, B} is held out, both orders of each, so a held-out
problem is never trained on, not even with its operands swapped. Standard library only: the
learner imports this module in the engine's venv, which lacks the server's dependencies.
"""

from __future__ import annotations

import functools
import random
from typing import Any, NamedTuple

__all__ = [
    "HELD_OUT_FRACTION",
    "MAX_TURNS",
    "OPERANDS",
    "SPLIT_SEED",
    "Problem",
    "answer_text",
    "held_out_problems",
    "instance",
    "is_held_out",
    "problem_text",
    "problems",
    "training_problems",
]

OPERANDS = range(100)
HELD_OUT_FRACTION = 0.1
# Fixed forever: changing it would move problems between the two sets of earlier runs.
SPLIT_SEED = 40
MAX_TURNS = 1


class Problem(NamedTuple):
    """One problem, ``a + b``."""

    a: int
    b: int


def _unordered(a: int, b: int) -> tuple[int, int]:
    return (a, b) if a <= b else (b, a)


@functools.cache
def _held_out_pairs() -> frozenset[tuple[int, int]]:
    pairs = [(a, b) for a in OPERANDS for b in OPERANDS if a <= b]
    random.Random(SPLIT_SEED).shuffle(pairs)
    return frozenset(pairs[: round(len(pairs) * HELD_OUT_FRACTION)])


def is_held_out(a: int, b: int) -> bool:
    """Whether ``a + b`` (or ``b + a``) belongs to the held-out set."""
    return _unordered(a, b) in _held_out_pairs()


@functools.cache
def _split() -> tuple[tuple[Problem, ...], tuple[Problem, ...]]:
    every = [Problem(a, b) for a in OPERANDS for b in OPERANDS]
    # Shuffled once, so any prefix of either set is a uniform sample of it.
    random.Random(SPLIT_SEED + 1).shuffle(every)
    held = tuple(p for p in every if is_held_out(*p))
    return tuple(p for p in every if not is_held_out(*p)), held


def training_problems() -> tuple[Problem, ...]:
    """Every problem not held out, in a fixed shuffled order."""
    return _split()[0]


def held_out_problems() -> tuple[Problem, ...]:
    """Every held-out problem, in a fixed shuffled order (a prefix is a uniform sample)."""
    return _split()[1]


def problems(seed: int, n: int) -> list[Problem]:
    """``n`` training problems drawn uniformly with replacement, the same for the same seed."""
    return random.Random(seed).choices(training_problems(), k=n)


def problem_text(a: int, b: int) -> str:
    """The user turn: ``What is A + B?``."""
    return f"What is {a} + {b}?"


def answer_text(a: int, b: int) -> str:
    r"""The trained reply before ``<|im_end|>``: ``\boxed{C}``."""
    return f"\\boxed{{{a + b}}}"


def instance(a: int, b: int) -> dict[str, Any]:
    """The ``math`` handler's instance for ``a + b`` (its default system prompt)."""
    return {"problem": problem_text(a, b), "answer": str(a + b), "max_turns": MAX_TURNS}
