"""The math grader against every GSM8K test reference (real public data).

Each reference solution (full text, ``#### x`` last line) must accept its own answer in
several formats and reject perturbed answers.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from prorl_async.grading.math import extract_answer, grade, reference_answer
from tests.data import GSM8K_ROWS, load_gsm8k


@pytest.fixture(scope="module")
def solutions() -> list[str]:
    return [row["answer"] for row in load_gsm8k()]


def _final(solution: str) -> str:
    return solution.rsplit("####", 1)[1].strip()


def _with_thousands(value: str) -> str:
    number = int(value.replace(",", ""))
    return f"{number:,}"


FORMATS: dict[str, Callable[[str], str]] = {
    "as written": lambda x: x,
    "boxed": lambda x: f"\\boxed{{{x}}}",
    "dollar": lambda x: f"${x}",
    "point zero": lambda x: f"{x.replace(',', '')}.0",
    "thousands": _with_thousands,
    "no separators": lambda x: x.replace(",", ""),
    "unicode minus": lambda x: x.replace("-", "\u2212"),
    "unit word": lambda x: f"{x} dollars",
    "inline math": lambda x: f"$\\boxed{{{x}}}$",
}


def _bump_first_digit(value: str) -> str:
    digits = value.replace(",", "")
    sign, body = ("-", digits[1:]) if digits.startswith("-") else ("", digits)
    return sign + str((int(body[0]) + 1) % 10) + body[1:]


PERTURBATIONS: dict[str, Callable[[int], str]] = {
    "plus one": lambda n: str(n + 1),
    "minus one": lambda n: str(n - 1),
    "times ten": lambda n: str(n * 10),
    "sign flip": lambda n: str(-n),
    "dropped last digit": lambda n: str(n // 10) if abs(n) >= 10 else str(n + 2),
    "plus a half": lambda n: f"{n}.5",
}


def test_reference_extraction_matches_hash_line(solutions: list[str]) -> None:
    extracted = [reference_answer(s) for s in solutions]
    assert extracted == [_final(s) for s in solutions]
    assert [extract_answer(s, None) for s in solutions] == extracted


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_reference_accepts_its_own_answer(solutions: list[str], fmt: str) -> None:
    accepted = sum(grade(FORMATS[fmt](_final(s)), reference_answer(s)).correct for s in solutions)
    assert accepted == GSM8K_ROWS


@pytest.mark.parametrize("how", PERTURBATIONS)
def test_every_reference_rejects_a_perturbed_answer(solutions: list[str], how: str) -> None:
    rejected = 0
    for solution in solutions:
        value = int(_final(solution).replace(",", ""))
        assert value != 0  # every perturbation below changes a non-zero value
        rejected += not grade(PERTURBATIONS[how](value), reference_answer(solution)).correct
    assert rejected == GSM8K_ROWS


def test_every_reference_rejects_a_changed_digit(solutions: list[str]) -> None:
    rejected = sum(
        not grade(_bump_first_digit(_final(s)), reference_answer(s)).correct for s in solutions
    )
    assert rejected == GSM8K_ROWS


def test_finish_answer_graded_against_full_solution(solutions: list[str]) -> None:
    """The handler's path: extract from a model transcript, grade against the raw reference."""
    transcript = "Let me think step by step.\nThe total is \\boxed{{{}}} dollars."
    graded = [
        grade(extract_answer(transcript.format(_final(s)), None), reference_answer(s)).correct
        for s in solutions
    ]
    assert sum(graded) == GSM8K_ROWS
