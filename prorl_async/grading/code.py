"""Pure helpers for the ``code`` task: find the solution, build the program that tests it.

Nothing here runs code. The handler executes the programs built here in its sandbox and
reads their exit status (function tests) or their report (stdin/stdout tests).
"""

from __future__ import annotations

import ast
import json
import keyword
import re
import textwrap
from collections.abc import Sequence

import msgspec

__all__ = [
    "FencedBlock",
    "StdioCase",
    "StdioCaseRun",
    "StdioVerdict",
    "build_function_test",
    "build_stdio_runner",
    "check_stdio_report",
    "extract_solution",
    "fenced_blocks",
    "holds_code",
    "normalize_output",
    "outputs_match",
]

_PYTHON_LANGS = frozenset({"python", "py", "python3", "py3"})
_OPEN_FENCE = re.compile(r"^ {0,3}(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[^`\s]*)[^`]*$")


class FencedBlock(msgspec.Struct, frozen=True):
    """One fenced code block of a Markdown text; ``closed`` is false when the text ended first."""

    lang: str
    code: str
    closed: bool = True


def fenced_blocks(text: str) -> list[FencedBlock]:
    """Every fenced (```` ``` ```` or ``~~~``) block of ``text``, in order."""
    blocks: list[FencedBlock] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opening = _OPEN_FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        fence, lang = opening.group("fence"), opening.group("lang").lower()
        end = _closing_fence(lines, i + 1, fence)
        body = "\n".join(lines[i + 1 : end])
        blocks.append(FencedBlock(lang, body + "\n" if body else "", end < len(lines)))
        i = end + 1
    return blocks


def _closing_fence(lines: list[str], start: int, fence: str) -> int:
    closing = re.compile(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
    for j in range(start, len(lines)):
        if closing.match(lines[j]):
            return j
    return len(lines)


def holds_code(text: str) -> bool:
    """Whether ``text`` parses as Python that does something (not a bare word or number)."""
    try:
        tree = ast.parse(textwrap.dedent(text))
    except (SyntaxError, ValueError):
        return False
    trivial = (ast.Constant, ast.Name, ast.Attribute)
    return any(not (isinstance(s, ast.Expr) and isinstance(s.value, trivial)) for s in tree.body)


def _last_block(text: str) -> str | None:
    blocks = [b for b in fenced_blocks(text) if b.code.strip()]
    python = [b for b in blocks if b.lang in _PYTHON_LANGS]
    chosen = python or blocks
    return chosen[-1].code if chosen else None


def extract_solution(text: str, finish_answer: str | None) -> str | None:
    """The model's solution code.

    The ``finish`` tool's answer when it holds code (its last fenced block if it has
    one); otherwise the last fenced ```` ```python ```` block of ``text``, else its last
    fenced block of any language, else ``None``.
    """
    if finish_answer is not None and finish_answer.strip():
        fenced = _last_block(finish_answer)
        if fenced is not None:
            return fenced
        if holds_code(finish_answer):
            return finish_answer.strip("\n") + "\n"
    return _last_block(text) if text else None


# --------------------------------------------------------------------------- function tests


def _check_identifier(entry_point: str) -> None:
    if not entry_point.isidentifier() or keyword.iskeyword(entry_point):
        raise ValueError(f"entry_point {entry_point!r} is not a Python identifier")


def _definition_line(source: str, name: str) -> int | None:
    """0-based first line (decorators included) of the top-level definition of ``name``."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        match = re.search(rf"^(?:async[ \t]+)?def[ \t]+{re.escape(name)}\b", source, re.MULTILINE)
        return source.count("\n", 0, match.start()) if match else None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if node.name == name:
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                return first - 1
    return None


def _preamble(prompt: str, entry_point: str) -> str:
    """What the prompt holds before the entry point: imports, constants, helpers."""
    line = _definition_line(prompt, entry_point)
    lines = prompt.splitlines(keepends=True)
    if line is not None:
        return "".join(lines[:line])
    imports = re.compile(r"^(?:import|from)[ \t]+\S")
    return "".join(x for x in lines if imports.match(x))


def build_function_test(prompt: str, solution: str, test: str, entry_point: str) -> str:
    """The program whose clean exit means ``solution`` passes (HumanEval convention).

    ``solution`` is either a completion of ``prompt`` (the function body) or a full
    program defining ``entry_point``; in the latter case the prompt's own definition is
    not repeated but what precedes it (imports, helpers) is kept.
    """
    _check_identifier(entry_point)
    if _definition_line(solution, entry_point) is not None:
        program = _preamble(prompt, entry_point) + "\n" + solution
    else:
        program = prompt + solution
    return f"{program}\n{test}\ncheck({entry_point})\n"


# --------------------------------------------------------------------------- stdin/stdout tests


class StdioCase(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One stdin/stdout test: feed ``input``, expect ``output``."""

    input: str
    output: str


class StdioCaseRun(msgspec.Struct, frozen=True):
    """What the runner saw for one case (``returncode`` is None when it timed out)."""

    stdout: str
    stderr: str
    returncode: int | None
    timed_out: bool
    elapsed_s: float


class StdioVerdict(msgspec.Struct, frozen=True):
    """The outcome of a stdin/stdout test run; ``failure`` describes the first failed case."""

    passed: int
    total: int
    failure: str | None = None

    @property
    def ok(self) -> bool:
        """Whether every case passed."""
        return self.total > 0 and self.passed == self.total


def normalize_output(text: str) -> list[str]:
    """Lines of ``text`` with runs of whitespace collapsed and blank lines at the end dropped."""
    lines = [" ".join(line.split()) for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def outputs_match(actual: str, expected: str) -> bool:
    """Whitespace-insensitive line-by-line comparison of a program's output."""
    return normalize_output(actual) == normalize_output(expected)


REPORT_MARKER = "__PRORL_STDIO_REPORT__"
_MAX_CAPTURE = 1 << 16
_RUNNER = """\
import json, os, subprocess, sys, tempfile, time
SOLUTION = {solution}
INPUTS = json.loads({inputs})
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "solution.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(SOLUTION)
    runs = []
    for data in INPUTS:
        start = time.monotonic()
        try:
            done = subprocess.run([sys.executable, path], input=data.encode(), cwd=tmp,
                                  capture_output=True, timeout={time_limit_s!r})
            out, err, code, late = done.stdout, done.stderr, done.returncode, False
        except subprocess.TimeoutExpired as exc:
            out, err, code, late = exc.stdout or b"", exc.stderr or b"", None, True
        runs.append({{"stdout": out[:{cap}].decode(errors="replace"),
                     "stderr": err[-4096:].decode(errors="replace"), "returncode": code,
                     "timed_out": late, "elapsed_s": time.monotonic() - start}})
        if late or code != 0:
            break  # a crash or a timeout fails the whole test; spare the other cases
print({marker!r} + json.dumps(runs), flush=True)
"""


def build_stdio_runner(
    solution: str, cases: Sequence[StdioCase], *, time_limit_s: float = 5.0
) -> str:
    """A self-contained Python program that runs ``solution`` once per case on its input.

    It prints one line, ``REPORT_MARKER`` followed by a JSON list of ``StdioCaseRun``,
    for :func:`check_stdio_report`. Each case gets ``time_limit_s`` of wall time.
    """
    if not cases:
        raise ValueError("cases must hold at least one stdin/stdout test")
    if not time_limit_s > 0:
        raise ValueError(f"time_limit_s must be positive, got {time_limit_s!r}")
    inputs = json.dumps([case.input for case in cases])
    return _RUNNER.format(
        solution=repr(solution),
        inputs=repr(inputs),
        time_limit_s=float(time_limit_s),
        cap=_MAX_CAPTURE,
        marker=REPORT_MARKER,
    )


_RUNS = msgspec.json.Decoder(list[StdioCaseRun])


def _describe(index: int, run: StdioCaseRun) -> str | None:
    if run.timed_out:
        return f"case {index}: timed out after {run.elapsed_s:.2f} s"
    if run.returncode != 0:
        tail = run.stderr.strip().splitlines()[-1:] or [""]
        return f"case {index}: exit status {run.returncode}: {tail[0]}"
    return None


def check_stdio_report(report: str, cases: Sequence[StdioCase]) -> StdioVerdict:
    """Compare the runner's report (its whole stdout) with the expected outputs."""
    line = next((x for x in reversed(report.splitlines()) if x.startswith(REPORT_MARKER)), None)
    if line is None:
        return StdioVerdict(0, len(cases), "runner printed no report")
    try:
        runs = _RUNS.decode(line[len(REPORT_MARKER) :])
    except msgspec.DecodeError as exc:
        return StdioVerdict(0, len(cases), f"unreadable runner report: {exc}")
    passed = 0
    for index, (case, run) in enumerate(zip(cases, runs, strict=False)):
        failure = _describe(index, run)
        if failure is None and not outputs_match(run.stdout, case.output):
            failure = f"case {index}: wrong output"
        if failure is not None:
            return StdioVerdict(passed, len(cases), failure)
        passed += 1
    if passed < len(cases):
        return StdioVerdict(passed, len(cases), f"case {passed}: not run")
    return StdioVerdict(passed, len(cases))
