"""Answer grading for the ``math`` task and solution harnesses for the ``code`` task."""

from __future__ import annotations

from prorl_async.grading.code import (
    StdioCase,
    StdioCaseRun,
    StdioVerdict,
    build_function_test,
    build_stdio_runner,
    check_stdio_report,
    extract_solution,
    outputs_match,
)
from prorl_async.grading.math import GradeResult, extract_answer, grade, reference_answer

__all__ = [
    "GradeResult",
    "StdioCase",
    "StdioCaseRun",
    "StdioVerdict",
    "build_function_test",
    "build_stdio_runner",
    "check_stdio_report",
    "extract_answer",
    "extract_solution",
    "grade",
    "outputs_match",
    "reference_answer",
]
