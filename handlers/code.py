"""Built-in ``code`` task: write a Python program, scored by hidden tests in a fresh sandbox.

Instance, one of two styles (exactly one)::

    stdin/stdout: {"problem": str, "tests": [{"input": str, "output": str}, ...]}
    function:     {"prompt": str, "test": str, "entry_point": str}     (HumanEval's format)

plus optional ``time_limit_s`` (per stdin/stdout case, or for the whole function test
program; default 10), ``max_turns`` and ``system``.

INIT starts a sandbox; RUN runs the agent loop with ``python``, ``bash`` and
``str_replace_editor`` (plus ``finish``) and picks the solution: the code given to
``finish``, else the last fenced python block the model wrote, else ``solution.py`` in
the workspace. EVAL runs the hidden tests in a FRESH sandbox (RUN's is gone by then, and
the model never saw the tests) through :func:`evaluate`; reward 1.0 when all pass.
"""

from __future__ import annotations

import shlex
import uuid
from typing import Annotated, Any, Literal

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
from prorl_async.grading.code import (
    REPORT_MARKER,
    StdioCase,
    StdioCaseRun,
    build_function_test,
    build_stdio_runner,
    check_stdio_report,
    extract_solution,
    outputs_match,
)
from prorl_async.sandbox import Runtime, Sandbox, SandboxHandle, SandboxLimits, SandboxSpec
from prorl_async.stages import StageScope

__all__ = [
    "CodeHandler",
    "CodeInstance",
    "evaluate",
    "evaluate_in",
    "solution_from_trajectory",
]

DEFAULT_SYSTEM = (
    "You are a programmer working in a Linux sandbox with `python`, `bash` and "
    "`str_replace_editor` tools. Write the solution, run it on examples to check it, then "
    "call `finish` with the complete solution code in a ```python block."
)
TOOLS = ["python", "bash", "str_replace_editor"]
SOLUTION_FILE = "solution.py"
STDIO_FIELDS = ("problem", "tests")
FUNCTION_FIELDS = ("prompt", "test", "entry_point")
_MAX_TESTS = 10_000
_DETAIL_CHARS = 2000
# Slack over the sum of per-case limits for the runner process as a whole.
_RUNNER_SLACK_S = 30.0

Style = Literal["stdio", "function"]


class CodeInstance(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A coding problem in stdin/stdout style or function (HumanEval) style."""

    problem: str | None = None
    tests: Annotated[list[StdioCase], msgspec.Meta(max_length=_MAX_TESTS)] | None = None
    prompt: str | None = None
    test: str | None = None
    entry_point: str | None = None
    time_limit_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 10.0
    max_turns: Annotated[int, msgspec.Meta(ge=1, le=1000)] | None = None
    system: str = DEFAULT_SYSTEM

    @property
    def style(self) -> Style:
        """``stdio`` when the instance has stdin/stdout tests, else ``function``."""
        return "stdio" if self.tests is not None else "function"

    def check(self) -> None:
        """Raise ``InstanceError`` unless exactly one style is given in full."""
        stdio = [f for f in STDIO_FIELDS if getattr(self, f) is not None]
        function = [f for f in FUNCTION_FIELDS if getattr(self, f) is not None]
        if stdio and function:
            raise InstanceError(
                f"instance: give either stdin/stdout fields {list(STDIO_FIELDS)} or function "
                f"fields {list(FUNCTION_FIELDS)}, not both (got {stdio + function})"
            )
        if not stdio and not function:
            raise InstanceError(
                f"instance: no task given: add stdin/stdout fields {list(STDIO_FIELDS)} "
                f"or function fields {list(FUNCTION_FIELDS)}"
            )
        _require_all(self, STDIO_FIELDS if stdio else FUNCTION_FIELDS)
        if self.tests is not None and not self.tests:
            raise InstanceError("instance.tests: needs at least one test case")
        if self.entry_point is not None and not _is_identifier(self.entry_point):
            raise InstanceError(
                f"instance.entry_point: {self.entry_point!r} is not a Python identifier"
            )


def _require_all(inst: CodeInstance, fields: tuple[str, ...]) -> None:
    for name in fields:
        value = getattr(inst, name)
        if value is None:
            given = [f for f in fields if getattr(inst, f) is not None]
            raise InstanceError(f"instance.{name}: required along with {given}")
        if isinstance(value, str) and not value.strip():
            raise InstanceError(f"instance.{name}: must not be blank")


def _is_identifier(name: str) -> bool:
    try:
        build_function_test("", "", "", name)
    except ValueError:
        return False
    return True


# --------------------------------------------------------------------------- solution


def solution_from_trajectory(trajectory: Trajectory | None) -> tuple[str | None, str]:
    """The solution code and where it came from (``finish``, ``text`` or ``none``)."""
    if trajectory is None:
        return None, "none"
    if trajectory.answer is not None:
        from_finish = extract_solution("", trajectory.answer)
        if from_finish is not None:
            return from_finish, "finish"
    texts = [str(t.get("text") or "") for t in trajectory.turns if t["role"] == "assistant"]
    from_text = extract_solution("\n".join(texts), None)
    return (from_text, "text") if from_text is not None else (None, "none")


async def _solution_file(sandbox: SandboxHandle) -> str | None:
    probe = await sandbox.exec(f"test -f {SOLUTION_FILE}", timeout=10.0)
    if probe.exit_code != 0:
        return None
    text = await sandbox.read_file(SOLUTION_FILE)
    return text if text.strip() else None


# --------------------------------------------------------------------------- evaluation


def _result(style: Style, passed: int, total: int, failure: str | None) -> dict[str, Any]:
    return {
        "style": style,
        "passed": passed,
        "total": total,
        "fraction": passed / total if total else 0.0,
        "all_passed": total > 0 and passed == total,
        "failure": None if failure is None else failure[:_DETAIL_CHARS],
    }


def _no_solution(inst: CodeInstance) -> dict[str, Any]:
    total = len(inst.tests or []) if inst.style == "stdio" else 1
    return _result(inst.style, 0, total, "no solution found")


def _tail(text: str, lines: int = 5) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


async def _run_function(
    sandbox: Sandbox, inst: CodeInstance, solution: str, workdir: str
) -> dict[str, Any]:
    assert inst.prompt is not None and inst.test is not None and inst.entry_point is not None
    program = build_function_test(inst.prompt, solution, inst.test, inst.entry_point)
    path = f"{workdir}/check.py"
    await sandbox.write_files({path: program})
    done = await sandbox.exec(f"python3 -I {shlex.quote(path)}", timeout=inst.time_limit_s)
    if done.timed_out:
        return _result("function", 0, 1, f"timed out after {inst.time_limit_s} s")
    if done.exit_code != 0:
        return _result("function", 0, 1, f"exit status {done.exit_code}: {_tail(done.stderr)}")
    return _result("function", 1, 1, None)


async def _run_stdio(
    sandbox: Sandbox, inst: CodeInstance, solution: str, workdir: str
) -> dict[str, Any]:
    cases = inst.tests or []
    runner = build_stdio_runner(solution, cases, time_limit_s=inst.time_limit_s)
    path, report = f"{workdir}/runner.py", f"{workdir}/report.txt"
    await sandbox.write_files({path: runner})
    # The report goes to a file: a long report must not be cut by the exec output cap.
    budget = inst.time_limit_s * len(cases) * 1.5 + _RUNNER_SLACK_S
    command = f"python3 -I {shlex.quote(path)} > {shlex.quote(report)}"
    done = await sandbox.exec(command, timeout=budget)
    if done.timed_out or done.exit_code != 0:
        why = "timed out" if done.timed_out else f"exit status {done.exit_code}"
        return _result("stdio", 0, len(cases), f"test runner {why}: {_tail(done.stderr)}")
    text = await sandbox.read_file(report)
    verdict = check_stdio_report(text, cases)
    return _result("stdio", _count_passed(text, cases), verdict.total, verdict.failure)


_RUNS = msgspec.json.Decoder(list[StdioCaseRun])


def _count_passed(report: str, cases: list[StdioCase]) -> int:
    """Cases whose run exited cleanly with the expected output, wherever they are in the list.

    (``check_stdio_report`` stops at the first failure; the fraction counts them all.)
    """
    line = next((x for x in reversed(report.splitlines()) if x.startswith(REPORT_MARKER)), None)
    if line is None:
        return 0
    try:
        runs = _RUNS.decode(line[len(REPORT_MARKER) :])
    except msgspec.DecodeError:
        return 0
    return sum(
        1
        for case, run in zip(cases, runs, strict=False)
        if not run.timed_out and run.returncode == 0 and outputs_match(run.stdout, case.output)
    )


async def evaluate_in(
    sandbox: Sandbox, instance: CodeInstance, solution: str | None
) -> dict[str, Any]:
    """Run ``instance``'s hidden tests against ``solution`` inside ``sandbox``.

    Each call works in its own fresh directory of the workspace, so one sandbox may
    serve many evaluations in turn. The result is the job's ``eval`` document:
    ``style``, ``passed``, ``total``, ``fraction``, ``all_passed``, ``failure``.
    """
    if solution is None or not solution.strip():
        return _no_solution(instance)
    workdir = f"_eval_{uuid.uuid4().hex[:12]}"
    if instance.style == "stdio":
        return await _run_stdio(sandbox, instance, solution, workdir)
    return await _run_function(sandbox, instance, solution, workdir)


async def evaluate(
    runtime: Runtime,
    instance: CodeInstance,
    solution: str | None,
    *,
    limits: SandboxLimits | None = None,
    scope: StageScope | None = None,
) -> dict[str, Any]:
    """Run the hidden tests against ``solution`` in a fresh sandbox of ``runtime``
    (``scope``: the job's stage it is for, ``job.scope``)."""
    if solution is None or not solution.strip():
        return _no_solution(instance)  # nothing to run: no sandbox needed
    spec = SandboxSpec(limits=limits if limits is not None else SandboxLimits())
    async with await runtime.start(spec, scope) as sandbox:
        return await evaluate_in(sandbox, instance, solution)


# --------------------------------------------------------------------------- handler


def _user_message(inst: CodeInstance) -> str:
    if inst.style == "stdio":
        return (
            f"{inst.problem}\n\nWrite a Python 3 program that reads the input from standard "
            "input and prints the answer to standard output."
        )
    return (
        "Complete this Python function. Your code must define "
        f"`{inst.entry_point}` (the prompt's imports are kept).\n\n```python\n{inst.prompt}```"
    )


class CodeHandler(AgentHandler):
    """The ``code`` task: agent loop with coding tools, hidden tests in a fresh sandbox."""

    name = "code"
    instance_type = CodeInstance

    def validate(self, instance: dict[str, Any]) -> Any:
        inst: CodeInstance = super().validate(instance)
        inst.check()
        return inst

    async def init(self, job: Job) -> None:
        spec = SandboxSpec(limits=job.shared.config.sandbox_limits)
        job.state["sandbox"] = await start_sandbox(job, spec)

    async def run(self, job: Job) -> None:
        inst: CodeInstance = job.instance
        sandbox: SandboxHandle = job.state["sandbox"]
        messages = [
            {"role": "system", "content": inst.system},
            {"role": "user", "content": _user_message(inst)},
        ]
        tools = SandboxTools(sandbox, TOOLS, job)
        trajectory = await run_agent(job, messages=messages, tools=tools, max_turns=inst.max_turns)
        solution, source = solution_from_trajectory(trajectory)
        if solution is None:
            solution = await _solution_file(sandbox)
            source = "file" if solution is not None else "none"
        job.state["solution"], job.state["solution_source"] = solution, source

    async def eval(self, job: Job) -> None:
        runtime = job.shared.runtime
        if runtime is None:
            raise RuntimeError("no sandbox runtime is configured on this server")
        result = await evaluate(
            runtime,
            job.instance,
            job.state.get("solution"),
            limits=job.shared.config.sandbox_limits,
            scope=job.scope,
        )
        result["solution_source"] = job.state.get("solution_source", "none")
        job.eval = result
        job.reward = 1.0 if result["all_passed"] else 0.0
