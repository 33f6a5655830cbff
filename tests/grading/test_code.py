"""Unit tests for code-solution extraction and the test-program builders."""

from __future__ import annotations

import asyncio
import sys

import pytest

from prorl_async.grading.code import (
    REPORT_MARKER,
    StdioCase,
    build_function_test,
    build_stdio_runner,
    check_stdio_report,
    extract_solution,
    fenced_blocks,
    holds_code,
    normalize_output,
    outputs_match,
)

# --------------------------------------------------------------------------- extraction

TRANSCRIPT = """I'll write it.
```text
not code
```
```python
def f():
    return 1
```
Better:
```py
def f():
    return 2
```
Output:
```
2
```
"""


def test_last_python_block_wins_over_later_plain_block() -> None:
    assert extract_solution(TRANSCRIPT, None) == "def f():\n    return 2\n"


def test_last_block_of_any_language_when_no_python_block() -> None:
    text = "```bash\necho hi\n```\nthen\n```\nprint(3)\n```\n"
    assert extract_solution(text, None) == "print(3)\n"


def test_no_fence_means_no_solution() -> None:
    assert extract_solution("def f(): return 1", None) is None
    assert extract_solution("", None) is None


def test_finish_answer_with_code_wins() -> None:
    assert extract_solution(TRANSCRIPT, "def g():\n    return 3") == "def g():\n    return 3\n"


def test_finish_answer_fenced_block_is_unwrapped() -> None:
    answer = "Final:\n```python\nprint(input())\n```"
    assert extract_solution(TRANSCRIPT, answer) == "print(input())\n"


@pytest.mark.parametrize("answer", ["done", "42", "I have finished the task.", "", "   ", "a.b"])
def test_finish_answer_without_code_falls_back_to_text(answer: str) -> None:
    assert extract_solution(TRANSCRIPT, answer) == "def f():\n    return 2\n"


def test_unclosed_final_fence_still_counts() -> None:
    blocks = fenced_blocks("```python\nx = 1\n")
    assert [(b.lang, b.code, b.closed) for b in blocks] == [("python", "x = 1\n", False)]


def test_longer_fence_holds_shorter_one() -> None:
    blocks = fenced_blocks("````markdown\n```python\nx\n```\n````\n")
    assert [b.code for b in blocks] == ["```python\nx\n```\n"]


def test_tilde_fence() -> None:
    assert extract_solution("~~~python\nprint(1)\n~~~\n", None) == "print(1)\n"


def test_empty_blocks_are_skipped() -> None:
    assert extract_solution("```python\nprint(1)\n```\n```python\n```\n", None) == "print(1)\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("print(input())", True),
        ("x = 1", True),
        ("    return a + b", True),
        ("import os", True),
        ("done", False),
        ("42", False),
        ("'a string'", False),
        ("This is prose.", False),
        ("def broken(:", False),
    ],
)
def test_holds_code(text: str, expected: bool) -> None:
    assert holds_code(text) is expected


# --------------------------------------------------------------------------- function tests

PROMPT = '''import math
from typing import List

HELPER_SCALE = 2


def helper(x: int) -> int:
    return x * HELPER_SCALE


def scaled_sqrt(xs: List[int]) -> List[float]:
    """Square roots of twice each x."""
'''
TEST = """
def check(candidate):
    assert candidate([2, 8]) == [2.0, 4.0]
"""


async def _passes(program: str) -> bool:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-I", "-c", program, stderr=asyncio.subprocess.DEVNULL
    )
    try:
        async with asyncio.timeout(30):
            return await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_completion_is_appended_to_prompt() -> None:
    program = build_function_test(
        PROMPT, "    return [math.sqrt(helper(x)) for x in xs]\n", TEST, "scaled_sqrt"
    )
    assert program.endswith("\ncheck(scaled_sqrt)\n")
    assert await _passes(program)


async def test_full_definition_is_not_preceded_by_the_prompt_definition() -> None:
    solution = "def scaled_sqrt(xs):\n    return [math.sqrt(helper(x)) for x in xs]\n"
    program = build_function_test(PROMPT, solution, TEST, "scaled_sqrt")
    assert program.count("def scaled_sqrt") == 1
    assert "from typing import List" in program and "def helper" in program
    assert await _passes(program)


async def test_full_definition_with_decorator_and_own_imports() -> None:
    solution = (
        "import functools\nimport math\n\n@functools.lru_cache(None)\ndef root(x):\n"
        "    return math.sqrt(x)\n\ndef scaled_sqrt(xs):\n    return [root(2 * x) for x in xs]\n"
    )
    program = build_function_test(PROMPT, solution, TEST, "scaled_sqrt")
    assert program.count("def scaled_sqrt") == 1
    assert await _passes(program)


async def test_wrong_solution_fails() -> None:
    program = build_function_test(PROMPT, "    return xs\n", TEST, "scaled_sqrt")
    assert not await _passes(program)


def test_unparsable_prompt_keeps_its_imports() -> None:
    prompt = "import math\nfrom os import path\ndef f(x:\n"
    program = build_function_test(prompt, "def f(x):\n    return x\n", "", "f")
    assert program.startswith("import math\nfrom os import path\n")
    assert program.count("def f") == 1


def test_unparsable_solution_defining_entry_point_is_detected() -> None:
    program = build_function_test(
        PROMPT, "def scaled_sqrt(xs):\n    return (\n", TEST, "scaled_sqrt"
    )
    assert program.count("def scaled_sqrt") == 1


@pytest.mark.parametrize("entry_point", ["", "1abc", "f()", "class", "a b"])
def test_bad_entry_point_is_named(entry_point: str) -> None:
    with pytest.raises(ValueError, match="entry_point"):
        build_function_test(PROMPT, "    pass\n", TEST, entry_point)


# --------------------------------------------------------------------------- stdin/stdout tests


@pytest.mark.parametrize(
    ("actual", "expected", "same"),
    [
        ("1 2\n3\n", "1 2\n3", True),
        ("1   2  \n3\n\n\n", "1 2\n3\n", True),
        ("1\t2\r\n3\r\n", "1 2\n3\n", True),
        ("  1 2\n3", "1 2\n3", True),
        ("1 2 3\n", "1 2\n3\n", False),
        ("1\n\n3\n", "1\n3\n", False),
        ("12\n", "1 2\n", False),
        ("", "0\n", False),
    ],
)
def test_outputs_match(actual: str, expected: str, same: bool) -> None:
    assert outputs_match(actual, expected) is same


def test_normalize_output() -> None:
    assert normalize_output(" a  b \n\n c\n \n") == ["a b", "", "c"]


async def _run_runner(program: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-I", "-c", program, stdout=asyncio.subprocess.PIPE
    )
    try:
        async with asyncio.timeout(60):
            stdout, _ = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return stdout.decode()


CASES = [StdioCase("1 2\n", "3\n"), StdioCase("10 20\n", "30\n"), StdioCase("-1 1\n", "0\n")]
ADD = "a, b = map(int, input().split())\nprint(a + b)\n"


async def test_stdio_runner_passes_a_correct_solution() -> None:
    report = await _run_runner(build_stdio_runner(ADD, CASES))
    verdict = check_stdio_report(report, CASES)
    assert verdict.ok and (verdict.passed, verdict.total) == (3, 3)


async def test_stdio_runner_tolerates_whitespace_differences() -> None:
    solution = "a, b = map(int, input().split())\nprint('  ', a + b, '  ')\nprint()\n"
    verdict = check_stdio_report(await _run_runner(build_stdio_runner(solution, CASES)), CASES)
    assert verdict.ok


async def test_stdio_runner_reports_wrong_output() -> None:
    solution = "a, b = map(int, input().split())\nprint(a * b)\n"
    verdict = check_stdio_report(await _run_runner(build_stdio_runner(solution, CASES)), CASES)
    assert not verdict.ok
    assert verdict.failure == "case 0: wrong output"


async def test_stdio_runner_reports_a_crash_and_stops() -> None:
    solution = "a, b = map(int, input().split())\nprint(a + b if a != 10 else 1 // 0)\n"
    report = await _run_runner(build_stdio_runner(solution, CASES))
    verdict = check_stdio_report(report, CASES)
    assert (verdict.passed, verdict.total) == (1, 3)
    assert verdict.failure is not None
    assert verdict.failure.startswith("case 1: exit status 1: ZeroDivisionError")
    assert report.count('"returncode"') == 2  # case 2 was never started


async def test_stdio_runner_enforces_the_time_limit() -> None:
    solution = "while True:\n    pass\n"
    program = build_stdio_runner(solution, CASES, time_limit_s=0.5)
    verdict = check_stdio_report(await _run_runner(program), CASES)
    assert verdict.failure is not None and verdict.failure.startswith("case 0: timed out")


async def test_stdio_runner_solution_with_quotes_and_unicode() -> None:
    solution = "print(\"\"\"It's ok — ünïcode\"\"\")\nprint('''\"''')\n"
    cases = [StdioCase("", "It's ok — ünïcode\n\"\n")]
    verdict = check_stdio_report(await _run_runner(build_stdio_runner(solution, cases)), cases)
    assert verdict.ok, verdict


@pytest.mark.parametrize(
    "report", ["", "garbage", REPORT_MARKER + "{not json", REPORT_MARKER + '[{"x": 1}]']
)
def test_unreadable_report_fails_cleanly(report: str) -> None:
    verdict = check_stdio_report(report, CASES)
    assert not verdict.ok and verdict.failure


def test_short_report_counts_missing_cases_as_failed() -> None:
    run = '{"stdout": "3\\n", "stderr": "", "returncode": 0, "timed_out": false, "elapsed_s": 0.1}'
    verdict = check_stdio_report(f"noise\n{REPORT_MARKER}[{run}]\n", CASES)
    assert (verdict.passed, verdict.failure) == (1, "case 1: not run")


@pytest.mark.parametrize(("cases", "limit"), [([], 1.0), (CASES, 0.0), (CASES, -1.0)])
def test_stdio_runner_rejects_bad_arguments(cases: list[StdioCase], limit: float) -> None:
    with pytest.raises(ValueError, match="cases|time_limit_s"):
        build_stdio_runner(ADD, cases, time_limit_s=limit)
