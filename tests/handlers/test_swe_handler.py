"""The ``swe`` task end to end through HTTP: real server, real bwrap sandboxes, real git and
pytest, and a scripted LLM (TEST DOUBLE) that views, runs the tests, edits and reruns them."""

from __future__ import annotations

import asyncio
import base64
import io
import re
import tarfile
from typing import Any

import pytest

from handlers.swe import SweHandler, parse_test_outcomes
from prorl_async.client import UnprocessableError
from prorl_async.core.job import Job
from prorl_async.sandbox import RuntimeConfig, SandboxSpec, get_runtime
from prorl_async.sandbox.handle import SandboxHandle
from prorl_async.scripted_llm import ScriptedLLM
from prorl_async.scripted_llm.policies import tool_call
from tests.conftest import require
from tests.helpers import Server, ServerFactory

BUGGY = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"
REPO = {
    "calc/__init__.py": "",
    "calc/ops.py": BUGGY,
    "tests/test_ops.py": (
        "from calc.ops import add, mul\n\n\ndef test_add():\n    assert add(1, 2) == 3\n\n\n"
        "def test_mul():\n    assert mul(2, 3) == 6\n"
    ),
}
TEST_COMMAND = "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python -m pytest -q -p no:cacheprovider"
F2P = ["tests/test_ops.py::test_add"]
P2P = ["tests/test_ops.py::test_mul"]
GOOD = [("return a - b", "return a + b")]
_RESPONSE = re.compile(r"<tool_response>\n?(.*?)\n?</tool_response>", re.DOTALL)


def bwrap_ok() -> bool:
    try:
        get_runtime("bwrap")
    except Exception:
        return False
    return True


class FixPolicy:
    """TEST DOUBLE model: view the file, run the tests, apply ``edits``, rerun, finish."""

    def __init__(
        self, edits: list[tuple[str, str]], path: str = "calc/ops.py", bash: str = ""
    ) -> None:
        self.edits, self.path, self.bash = edits, path, bash
        self.seen: list[str] = []

    def reply(self, conversation: str) -> str:
        observed = _RESPONSE.findall(conversation)
        self.seen = observed
        step = conversation.count("<|im_start|>assistant") - 1
        plan = [tool_call("str_replace_editor", {"command": "view", "path": "calc/ops.py"})]
        plan.append(tool_call("bash", {"command": TEST_COMMAND}))
        for old, new in self.edits:
            args = {"command": "str_replace", "path": self.path, "old_str": old}
            plan.append(tool_call("str_replace_editor", {**args, "new_str": new}))
        if self.bash:
            plan.append(tool_call("bash", {"command": self.bash}))
        plan.append(tool_call("bash", {"command": TEST_COMMAND}))
        plan.append(tool_call("finish", {"answer": "fixed"}))
        return plan[min(step, len(plan) - 1)]


def instance(**extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "repo": {"files": REPO},
        "problem_statement": "add() returns the wrong result: add(1, 2) should be 3.",
        "test_command": TEST_COMMAND,
        "fail_to_pass": F2P,
        "pass_to_pass": P2P,
    }
    body.update(extra)
    return body


def archive(files: dict[str, str], symlink: str | None = None) -> str:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path, text in files.items():
            info = tarfile.TarInfo(f"./{path}")
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
        if symlink is not None:
            link = tarfile.TarInfo(symlink)
            link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tar.addfile(link)
    return base64.b64encode(buf.getvalue()).decode()


async def rollout(
    srv: Server, policy: FixPolicy, inst: dict[str, Any], **kw: Any
) -> dict[str, Any]:
    async with ScriptedLLM(policy=policy) as llm:
        await srv.client.add_llm_server(llm.address)
        job_id = await srv.client.submit(kw.pop("task", "swe"), inst, **kw)
        doc = await srv.client.result(job_id, wait=90)
    assert doc is not None
    return doc


async def no_sandboxes(srv: Server) -> None:
    status = await srv.client.status()
    assert status["sandboxes"] == 0
    assert srv.service.shared.runtime is None or srv.service.shared.runtime.live == 0


@pytest.mark.parametrize(
    ("form", "start"), [("files", "eager"), ("archive", "eager"), ("files", "on_first_use")]
)
async def test_correct_fix_scores_one(make_server: ServerFactory, form: str, start: str) -> None:
    # on_first_use: INIT's checkout uploads through sandbox.client, which starts it there.
    require(bwrap_ok(), "bwrap sandboxes unavailable")
    policy = FixPolicy(GOOD)
    inst = instance() if form == "files" else instance(repo=None, repo_archive=archive(REPO))
    async with make_server(runtime="bwrap", sandbox_start=start) as srv:
        doc = await rollout(srv, policy, inst)
        await no_sandboxes(srv)
    assert doc["status"] == "done", doc["error"]
    assert doc["reward"] == 1.0
    ev = doc["eval"]
    assert ev["fail_to_pass"] == {F2P[0]: "PASSED"} and ev["pass_to_pass"] == {P2P[0]: "PASSED"}
    assert ev["patch_applied"] and ev["patch_method"] == "git apply"
    assert "-    return a - b\n+    return a + b" in ev["patch"]
    assert doc["num_turns"] == 5
    # The policy really saw the tools' output: the file, the failing run, then the passing one.
    assert "return a - b" in policy.seen[0]
    assert "FAILED" in policy.seen[1] and "1 failed, 1 passed" in policy.seen[1]
    assert "2 passed" in policy.seen[3]


@pytest.mark.parametrize(
    ("edits", "f2p", "p2p"),
    [
        ([("return a - b", "return abs(a - b)")], "FAILED", "PASSED"),  # wrong fix
        (GOOD + [("return a * b", "return a ** b")], "PASSED", "FAILED"),  # breaks mul
        ([], "FAILED", "PASSED"),  # no change at all
    ],
    ids=["wrong-fix", "breaks-pass-to-pass", "empty-patch"],
)
async def test_bad_fixes_score_zero(
    make_server: ServerFactory, edits: list[tuple[str, str]], f2p: str, p2p: str
) -> None:
    require(bwrap_ok(), "bwrap sandboxes unavailable")
    async with make_server(runtime="bwrap") as srv:
        doc = await rollout(srv, FixPolicy(edits), instance())
        await no_sandboxes(srv)
    assert doc["status"] == "done", doc["error"]
    assert doc["reward"] == 0.0
    assert doc["eval"]["tests"] == {F2P[0]: f2p, P2P[0]: p2p}
    assert doc["eval"]["patch_method"] == ("empty" if not edits else "git apply")


async def test_editing_the_tests_does_not_pay(make_server: ServerFactory) -> None:
    require(bwrap_ok(), "bwrap sandboxes unavailable")
    cheat = FixPolicy([("assert add(1, 2) == 3", "assert True")], path="tests/test_ops.py")
    conftest = "printf 'import pytest\\npytest.skip(allow_module_level=True)\\n' > conftest.py"
    cheat_more = FixPolicy([], bash=conftest)
    async with make_server(runtime="bwrap") as srv:
        docs = [await rollout(srv, policy, instance()) for policy in (cheat, cheat_more)]
    assert "2 passed" in cheat.seen[3]  # the edited test passes in the model's own sandbox
    for doc in docs:
        assert doc["status"] == "done", doc["error"]
        assert doc["reward"] == 0.0 and doc["eval"]["fail_to_pass"] == {F2P[0]: "FAILED"}
    assert "+    assert True" in docs[0]["eval"]["patch"]
    assert "conftest.py" in docs[1]["eval"]["patch"]


async def test_a_change_the_model_committed_is_still_captured(make_server: ServerFactory) -> None:
    require(bwrap_ok(), "bwrap sandboxes unavailable")
    commit = "git -c user.name=m -c user.email=m@x commit -qam 'my fix' && git log --oneline"
    async with make_server(runtime="bwrap") as srv:
        doc = await rollout(srv, FixPolicy(GOOD, bash=commit), instance())
    assert doc["status"] == "done", doc["error"]
    assert doc["reward"] == 1.0
    assert "+    return a + b" in doc["eval"]["patch"]


async def test_an_oversized_change_scores_zero(make_server: ServerFactory) -> None:
    require(bwrap_ok(), "bwrap sandboxes unavailable")
    big = "head -c 3000000 /dev/zero | tr '\\0' x | fold -w 100 > big.txt"
    async with make_server(runtime="bwrap") as srv:
        doc = await rollout(srv, FixPolicy(GOOD, bash=big), instance())
        await no_sandboxes(srv)
    assert doc["status"] == "done", doc["error"]
    assert doc["reward"] == 0.0 and doc["eval"]["patch_applied"] is False
    assert "limit 2097152" in doc["eval"]["patch_error"]


async def test_patch_that_does_not_apply_scores_zero(tmp_path: Any) -> None:
    require(bwrap_ok(), "bwrap sandboxes unavailable")
    handler = SweHandler()
    task = handler.validate(instance())
    bogus = "--- a/calc/ops.py\n+++ b/calc/ops.py\n@@ -1,1 +1,1 @@\n-nothing like this\n+x\n"
    runtime = get_runtime("bwrap", RuntimeConfig(state_dir=str(tmp_path)))
    async with await runtime.start(SandboxSpec()) as sandbox:
        report = await handler.evaluate(sandbox, task, bogus)
    await runtime.aclose()
    assert report["reward"] == 0.0 and report["patch_applied"] is False
    assert "patch does not apply" in report["patch_error"]  # git apply, then patch -p1:
    assert "Hunk #1 FAILED" in report["patch_error"]
    assert set(report["tests"].values()) == {"NOT_RUN"}


async def test_fuzzy_patch_falls_back_to_patch_p1(tmp_path: Any) -> None:
    require(bwrap_ok(), "bwrap sandboxes unavailable")
    handler = SweHandler()
    task = handler.validate(instance())
    # The trailing context line is wrong: git apply refuses, patch -p1 applies it with fuzz.
    fuzzy = (
        "--- a/calc/ops.py\n+++ b/calc/ops.py\n@@ -1,3 +1,3 @@\n def add(a, b):\n"
        "-    return a - b\n+    return a + b\n not the real context\n"
    )
    runtime = get_runtime("bwrap", RuntimeConfig(state_dir=str(tmp_path)))
    async with await runtime.start(SandboxSpec()) as sandbox:
        report = await handler.evaluate(sandbox, task, fuzzy)
    await runtime.aclose()
    assert report["patch_applied"] and report["patch_method"] == "patch -p1"
    assert report["reward"] == 1.0


class CrashingSwe(SweHandler):
    """The swe handler with a crash injected after each stage's real work (TEST DOUBLE)."""

    name = "swe_crash"

    async def init(self, job: Job) -> None:
        await super().init(job)
        self._crash(job, "init")

    async def run(self, job: Job) -> None:
        await super().run(job)
        self._crash(job, "run")

    async def evaluate(self, sandbox: SandboxHandle, task: Any, patch: str) -> dict[str, Any]:
        report = await super().evaluate(sandbox, task, patch)
        self.eval_sandbox = sandbox
        if self.crash_in == "eval":
            raise RuntimeError("injected crash in eval")
        return report

    def _crash(self, job: Job, stage: str) -> None:
        if self.crash_in == stage:
            raise RuntimeError(f"injected crash in {stage}")

    crash_in = ""
    eval_sandbox: SandboxHandle | None = None


@pytest.mark.parametrize("stage", ["init", "run", "eval"])
async def test_crash_in_each_stage_gives_a_failed_result(
    make_server: ServerFactory, stage: str
) -> None:
    require(bwrap_ok(), "bwrap sandboxes unavailable")
    crashing = CrashingSwe()
    crashing.crash_in = stage
    async with make_server(runtime="bwrap", handlers=(crashing,)) as srv:
        doc = await rollout(srv, FixPolicy(GOOD), instance(), task="swe_crash")
        await no_sandboxes(srv)
    assert doc["status"] == "failed" and doc["reward"] is None
    assert doc["error"] == {
        "stage": stage,
        "type": "RuntimeError",
        "message": f"injected crash in {stage}",
    }
    assert doc["num_turns"] == (0 if stage == "init" else 5)
    if stage == "eval":
        assert crashing.eval_sandbox is not None and crashing.eval_sandbox.closed


async def test_cancel_mid_run_leaves_nothing(make_server: ServerFactory) -> None:
    require(bwrap_ok(), "bwrap sandboxes unavailable")
    async with ScriptedLLM(policy=FixPolicy(GOOD)) as llm, make_server(runtime="bwrap") as srv:
        await srv.client.add_llm_server(llm.address)
        llm.hold()
        job_id = await srv.client.submit("swe", instance())
        async with asyncio.timeout(30):
            await llm.wait_requests(1)  # RUN has started: its sandbox is live
        assert (await srv.client.status())["sandboxes"] == 1
        out = await srv.client.cancel(job_id)
        assert (await srv.client.status())["sandboxes"] == 0
        llm.release()
        doc = await srv.client.result(job_id, wait=30)
        await no_sandboxes(srv)
    assert out["cancelled"] == [job_id]
    assert doc is not None and doc["status"] == "cancelled"


BAD_INSTANCES = [
    (instance(repo_archive=archive(REPO)), "exactly one of `repo` and `repo_archive`"),
    (instance(repo=None), "exactly one of `repo` and `repo_archive`"),
    (instance(repo={"files": {"../evil.py": "x"}}), "instance.repo.files: path '../evil.py'"),
    (instance(repo={"files": {".git/config": "x"}}), "inside .git"),
    (instance(repo={"files": {}}), "has no files"),
    (instance(repo=None, repo_archive="!!not base64"), "instance.repo_archive: not valid base64"),
    (instance(repo=None, repo_archive=base64.b64encode(b"junk").decode()), "not a readable"),
    (instance(repo=None, repo_archive=archive(REPO, symlink="link")), "'link' is not a regular"),
    (instance(repo=None, repo_archive=archive({"/etc/x": "x"})), "must be relative"),
    (instance(fail_to_pass=[]), "instance.fail_to_pass"),
    (instance(pass_to_pass=["a\nb"]), "instance.pass_to_pass[0]"),
    (instance(test_command=""), "instance.test_command"),
    (instance(surprise=1), "surprise"),
]


@pytest.mark.parametrize(("inst", "detail"), BAD_INSTANCES)
async def test_bad_instances_are_422_naming_the_field(
    make_server: ServerFactory, inst: dict[str, Any], detail: str
) -> None:
    async with make_server() as srv:
        with pytest.raises(UnprocessableError) as info:
            await srv.client.submit("swe", inst)
    assert detail in info.value.detail


def test_outcomes_are_read_from_pytest_summary_lines() -> None:
    output = (
        "PASSED tests/t.py::test_a\n"
        "FAILED tests/t.py::test_ab - assert 1 == 2\n"
        "ERROR tests/t.py::test_c[x - y] - fixture missing\n"
        "XFAIL tests/t.py::test_d - known\n"
        "passed tests/t.py::test_e\n"
    )
    ids = ["tests/t.py::test_a", "tests/t.py::test_ab", "tests/t.py::test_c[x - y]"]
    ids += ["tests/t.py::test_d", "tests/t.py::test_e"]
    assert parse_test_outcomes(output, ids) == {
        "tests/t.py::test_a": "PASSED",
        "tests/t.py::test_ab": "FAILED",
        "tests/t.py::test_c[x - y]": "ERROR",
        "tests/t.py::test_d": "XFAIL",
        "tests/t.py::test_e": "MISSING",
    }
