"""Answer grading for the ``math`` task and solution harnesses for the ``code`` task."""

from __future__ import annotations

from prorl_async.grading.math import GradeResult, extract_answer, grade, reference_answer

__all__ = ["GradeResult", "extract_answer", "grade", "reference_answer"]
