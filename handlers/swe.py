"""Built-in ``swe`` task: fix a bug in a small repository, scored by its pytest tests.

Instance::

    {"repo": {"files": {path: text}}            # or "repo_archive": base64 of a .tar.gz
     "problem_statement": str,
     "test_command": str,                        # a pytest invocation, e.g. "python -m pytest -q"
     "fail_to_pass": [pytest node id, ...],      # at least one
     "pass_to_pass": [pytest node id, ...],
     "max_turns": int?, "test_timeout_s": float?, "system": str?}

INIT writes the repository into a fresh sandbox and commits it with git. RUN gives the model
``bash``, ``str_replace_editor`` and ``finish``; when the loop ends the change it made is
captured as ``git add -A && git diff --cached --binary`` (new files included). EVAL starts a
FRESH sandbox with the original repository, applies that patch (``git apply``, falling back to
``patch -p1``), resets the test files named by the test ids and every ``conftest.py`` to the
original (a patch cannot pass by editing the tests) and runs the tests once. A patch that does
not apply, or is over 2 MiB, scores 0 with the reason in ``eval["patch_error"]``.

How per-test outcomes are read: EVAL runs ``<test_command> <every test id> -rA`` (so
``test_command`` must be pytest, or a script passing its arguments on to pytest) and reads
pytest's short test summary lines (``PASSED tests/test_x.py::test_y``, ``FAILED ... - msg``,
``ERROR``, ``XFAIL``, ``XPASS``). A test counts as passing when its line says ``PASSED`` or
``XFAIL``; a test with no line (collection error, timeout, crash) counts as failing
(``MISSING``). Reward is 1.0 when every ``fail_to_pass`` and every ``pass_to_pass`` test
passes, else 0.0; ``eval`` holds each test's outcome, whether the patch applied, and the
tail of the test output.
"""

from __future__ import annotations

import base64
import binascii
import io
import shlex
import tarfile
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec

from prorl_async import AgentHandler, InstanceError, Job, SandboxTools, run_agent, start_sandbox
from prorl_async.sandbox import SandboxHandle, SandboxSpec, SpecError
from prorl_async.sandbox.spec import check_relative_path

__all__ = ["SweHandler", "SweInstance", "SweTask", "parse_test_outcomes"]

DEFAULT_SYSTEM = (
    "You are a software engineer working in a git repository in a Linux sandbox. Use the "
    "tools to find and fix the bug described by the user, check your fix by running the "
    "tests, then call finish."
)
# Names (never shown to the model) inside .git, so they are neither tracked nor in the diff.
_ARCHIVE = ".git-prorl-repo.tar.gz"
_PATCH = ".git/prorl.patch"
_TEST_LOG = ".git/prorl-tests.log"
_MODEL_PATCH = ".git/prorl-model.patch"
_MAX_PATCH_BYTES = 2 * 1024 * 1024
_MAX_REPO_BYTES = 64 * 1024 * 1024
_OUTPUT_TAIL = 3000
_PASSING = frozenset({"PASSED", "XFAIL"})
_SUMMARY_STATUSES = ("PASSED", "FAILED", "ERROR", "XFAIL", "XPASS")
# Command-line config is "protected", so safe.directory works here without a global gitconfig
# (HOME is the workspace: a ~/.gitconfig would end up in the diff).
_GIT = (
    "git -c safe.directory='*' -c user.name=prorl -c user.email=prorl@localhost "
    "-c commit.gpgsign=false -c core.hooksPath=/dev/null"
)

TestId = Annotated[str, msgspec.Meta(min_length=1, pattern=r"^[^\n\r\0]+$")]


class RepoFiles(msgspec.Struct, forbid_unknown_fields=True):
    """A repository given inline as ``{path: text}``."""

    files: dict[str, str]


class SweInstance(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The wire form of a ``swe`` task instance."""

    problem_statement: Annotated[str, msgspec.Meta(min_length=1)]
    test_command: Annotated[str, msgspec.Meta(min_length=1)]
    fail_to_pass: Annotated[list[TestId], msgspec.Meta(min_length=1)]
    pass_to_pass: list[TestId] = msgspec.field(default_factory=list)
    repo: RepoFiles | None = None
    repo_archive: str | None = None
    max_turns: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 30
    test_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 300.0
    system: str = DEFAULT_SYSTEM


@dataclass(frozen=True, slots=True)
class SweTask:
    """A validated instance plus its repository as a canonical .tar.gz (checked paths only)."""

    instance: SweInstance
    archive: bytes
    file_count: int

    @property
    def test_ids(self) -> list[str]:
        return list(dict.fromkeys(self.instance.fail_to_pass + self.instance.pass_to_pass))

    @property
    def test_files(self) -> list[str]:
        return list(dict.fromkeys(t.split("::", 1)[0] for t in self.test_ids))


def parse_test_outcomes(output: str, test_ids: list[str]) -> dict[str, str]:
    """Each test id's outcome from pytest ``-rA`` summary lines; ``MISSING`` when absent."""
    found: dict[str, str] = {}
    for line in output.splitlines():
        status, _, rest = line.partition(" ")
        if status not in _SUMMARY_STATUSES:
            continue
        for test_id in test_ids:
            if test_id not in found and _names(rest, test_id):
                found[test_id] = status
    return {test_id: found.get(test_id, "MISSING") for test_id in test_ids}


def _names(rest: str, test_id: str) -> bool:
    return rest == test_id or (rest.startswith(test_id) and rest[len(test_id)] == " ")


# -- validation ------------------------------------------------------------------------------


def _check_path(path: str, field: str) -> str:
    clean = path[2:] if path.startswith("./") else path
    try:
        parts = check_relative_path(clean, what=field).parts
    except SpecError as exc:
        raise InstanceError(f"instance.{exc}") from None
    if ".git" in parts or clean.startswith(".git-prorl"):
        raise InstanceError(f"instance.{field}: path {path!r} is inside .git (reserved)")
    return clean


def _archive_from_files(files: dict[str, str]) -> tuple[bytes, int]:
    entries = {_check_path(p, "repo.files"): text.encode() for p, text in files.items()}
    return _pack({p: (data, 0o644) for p, data in entries.items()}), len(entries)


def _archive_from_b64(data: str) -> tuple[bytes, int]:
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise InstanceError("instance.repo_archive: not valid base64") from None
    try:
        entries = _unpack(raw)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise InstanceError(f"instance.repo_archive: not a readable .tar.gz ({exc})") from None
    return _pack(entries), len(entries)


def _unpack(raw: bytes) -> dict[str, tuple[bytes, int]]:
    entries: dict[str, tuple[bytes, int]] = {}
    total = 0
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:gz") as tar:
        for member in tar:
            if member.isdir():
                continue
            if not member.isfile():
                raise InstanceError(
                    f"instance.repo_archive: member {member.name!r} is not a regular file "
                    "(links and devices are not allowed)"
                )
            total += member.size
            if total > _MAX_REPO_BYTES:
                raise InstanceError(f"instance.repo_archive: unpacks to over {_MAX_REPO_BYTES} B")
            extracted = tar.extractfile(member)
            data = extracted.read() if extracted is not None else b""
            entries[_check_path(member.name, "repo_archive")] = (data, member.mode & 0o755)
    return entries


def _pack(entries: dict[str, tuple[bytes, int]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path, (data, mode) in sorted(entries.items()):
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), mode | 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


# -- sandbox steps ---------------------------------------------------------------------------


async def _must(sandbox: SandboxHandle, command: str, what: str, timeout: float = 120.0) -> str:
    result = await sandbox.exec(command, timeout=timeout)
    if result.exit_code != 0:
        output = (result.stdout + result.stderr).strip()[-_OUTPUT_TAIL:]
        raise RuntimeError(f"{what} failed (exit {result.exit_code}): {output}")
    return result.stdout


async def checkout(sandbox: SandboxHandle, task: SweTask) -> str:
    """Unpack the repository into the workspace, commit it; the base commit's hash."""
    await sandbox.client.upload(_ARCHIVE, task.archive)
    command = (
        f"tar --no-same-owner -xzf {_ARCHIVE} && rm -f {_ARCHIVE} && {_GIT} init -q && "
        f"{_GIT} add -A && {_GIT} commit -q --allow-empty -m 'original repository' && "
        f"{_GIT} rev-parse HEAD"
    )
    return (await _must(sandbox, command, "setting up the repository with git")).strip()


async def capture_patch(sandbox: SandboxHandle, base: str) -> str:
    """The model's change against the base commit (new files included, even if it committed).

    Raises ``PatchTooLarge`` beyond ``_MAX_PATCH_BYTES``.
    """
    command = f"{_GIT} add -A && {_GIT} diff --cached --binary {base} > {_MODEL_PATCH}"
    await _must(sandbox, command, "git diff of the model's change")
    data = await sandbox.client.download(_MODEL_PATCH)
    if len(data) > _MAX_PATCH_BYTES:
        raise PatchTooLarge(f"the change is a {len(data)}-byte patch (limit {_MAX_PATCH_BYTES})")
    return data.decode(errors="replace")


class PatchTooLarge(ValueError):
    """The model's change is too big to carry to EVAL (scored 0, not a failure)."""


async def restore_tests(sandbox: SandboxHandle, task: SweTask) -> None:
    """Reset the test files named by the test ids and every conftest.py to the original.

    So a patch cannot pass by editing, deleting or adding (conftest.py) tests.
    """
    files = " ".join(shlex.quote(p) for p in task.test_files)
    command = (
        f"{_GIT} ls-files -z -- {files} '*conftest.py' | xargs -0 -r {_GIT} checkout -q HEAD -- "
        f"&& {_GIT} ls-files -z --others -- '*conftest.py' | xargs -0 -r rm -f --"
    )
    await _must(sandbox, command, "restoring the original test files")


async def apply_patch(sandbox: SandboxHandle, patch: str) -> tuple[bool, str]:
    """Apply ``patch`` with ``git apply``, else ``patch -p1``; (applied, how or why not)."""
    if not patch.strip():
        return True, "empty"
    await sandbox.client.upload(_PATCH, patch.encode())
    result = await sandbox.exec(f"{_GIT} apply --whitespace=nowarn {_PATCH}", timeout=60)
    if result.exit_code == 0:
        return True, "git apply"
    fallback = await sandbox.exec(f"patch -p1 --batch --forward < {_PATCH}", timeout=60)
    if fallback.exit_code == 0:
        return True, "patch -p1"
    why = (result.stderr + fallback.stdout + fallback.stderr).strip()[-_OUTPUT_TAIL:]
    return False, why


async def run_tests(sandbox: SandboxHandle, task: SweTask) -> dict[str, Any]:
    """Run the listed tests once; outcomes per test id, exit code, timeout flag, output tail."""
    ids = " ".join(shlex.quote(t) for t in task.test_ids)
    command = f"{task.instance.test_command} {ids} -rA > {_TEST_LOG} 2>&1"
    result = await sandbox.exec(command, timeout=task.instance.test_timeout_s)
    output = (await sandbox.client.download(_TEST_LOG)).decode(errors="replace")
    return {
        "tests": parse_test_outcomes(output, task.test_ids),
        "test_exit_code": result.exit_code,
        "tests_timed_out": result.timed_out,
        "test_output": output[-_OUTPUT_TAIL:],
    }


def score(task: SweTask, outcomes: dict[str, str]) -> float:
    """1.0 when every fail_to_pass and pass_to_pass test passes."""
    return 1.0 if all(outcomes[t] in _PASSING for t in task.test_ids) else 0.0


# -- the handler -----------------------------------------------------------------------------


class SweHandler(AgentHandler):
    """Repository bug fixing (SWE-bench style) with git patches and pytest tests."""

    name = "swe"
    instance_type = SweInstance

    def validate(self, instance: dict[str, Any]) -> SweTask:
        inst: SweInstance = super().validate(instance)
        if (inst.repo is None) == (inst.repo_archive is None):
            raise InstanceError("instance: give exactly one of `repo` and `repo_archive`")
        if inst.repo is not None:
            archive, count = _archive_from_files(inst.repo.files)
        else:
            archive, count = _archive_from_b64(inst.repo_archive or "")
        if count == 0:
            raise InstanceError("instance.repo: the repository has no files")
        return SweTask(inst, archive, count)

    def _spec(self, job: Job) -> SandboxSpec:
        return SandboxSpec(limits=job.shared.config.sandbox_limits)

    async def init(self, job: Job) -> None:
        sandbox = await start_sandbox(job, self._spec(job))
        job.state["sandbox"] = sandbox
        job.state["base"] = await checkout(sandbox, job.instance)

    def prompt(self, task: SweTask, sandbox: SandboxHandle) -> list[dict[str, Any]]:
        inst = task.instance
        user = (
            f"{inst.problem_statement}\n\nThe repository is checked out in "
            f"{sandbox.inner_workspace} (the current directory). Run the tests with:\n"
            f"    {inst.test_command}\nEdit the code to fix the issue, then call finish."
        )
        return [{"role": "system", "content": inst.system}, {"role": "user", "content": user}]

    async def run(self, job: Job) -> None:
        task: SweTask = job.instance
        sandbox: SandboxHandle = job.state["sandbox"]
        tools = SandboxTools(sandbox, ["bash", "str_replace_editor"], job)
        await run_agent(
            job, messages=self.prompt(task, sandbox), tools=tools, max_turns=task.instance.max_turns
        )
        try:
            job.state["patch"] = await capture_patch(sandbox, job.state["base"])
        except PatchTooLarge as exc:
            job.state["patch_error"] = str(exc)

    async def eval(self, job: Job) -> None:
        runtime = job.shared.runtime
        if runtime is None:
            raise RuntimeError("no sandbox runtime is configured on this server")
        task: SweTask = job.instance
        if "patch_error" in job.state:
            job.eval = _not_run(task, "", job.state["patch_error"])
        else:
            async with await runtime.start(self._spec(job), job.scope) as sandbox:
                job.eval = await self.evaluate(sandbox, task, job.state.get("patch", ""))
        job.reward = float(job.eval["reward"])

    async def evaluate(self, sandbox: SandboxHandle, task: SweTask, patch: str) -> dict[str, Any]:
        """EVAL inside a fresh ``sandbox``: check out, apply ``patch``, run the tests, score."""
        await checkout(sandbox, task)
        applied, how = await apply_patch(sandbox, patch)
        if not applied:
            return _not_run(task, patch, how)
        await restore_tests(sandbox, task)
        report: dict[str, Any] = {"patch": patch, "patch_applied": True, "patch_method": how}
        report.update(await run_tests(sandbox, task))
        report["reward"] = score(task, report["tests"])
        report["fail_to_pass"] = {t: report["tests"][t] for t in task.instance.fail_to_pass}
        report["pass_to_pass"] = {t: report["tests"][t] for t in task.instance.pass_to_pass}
        return report


def _not_run(task: SweTask, patch: str, why: str) -> dict[str, Any]:
    return {
        "patch": patch,
        "patch_applied": False,
        "patch_method": None,
        "patch_error": why,
        "tests": {t: "NOT_RUN" for t in task.test_ids},
        "reward": 0.0,
    }
