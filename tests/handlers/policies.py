"""Scripted model policies for the handler tests (TEST DOUBLES for a real LLM).

Each policy reads the decoded conversation the scripted LLM server shows it (ChatML text,
tool outputs inside ``<tool_response>``) and decides its next reply from it, so what it
does next depends on what the tools really returned.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal

from prorl_async.sandbox import bwrap_problem
from prorl_async.scripted_llm import ScriptedLLM
from prorl_async.scripted_llm.policies import Policy, tool_call
from tests.conftest import require
from tests.helpers import Server, ServerFactory

_USER = "<|im_start|>user\n"
_END = "<|im_end|>"
_RESPONSE = re.compile(r"<tool_response>\n?(.*?)\n?</tool_response>", re.DOTALL)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def first_user_message(conversation: str) -> str:
    """The task as the model was shown it (the first user turn)."""
    if _USER not in conversation:
        return ""
    return conversation.split(_USER, 1)[1].split(_END, 1)[0]


def tool_responses(conversation: str) -> list[str]:
    """Every tool output shown to the model so far, in order."""
    return _RESPONSE.findall(conversation)


@dataclass
class PythonSolver:
    """Computes the answer with the ``python`` tool, then reads the printed number back.

    ``programs`` maps a fragment of the problem text to the code that solves it. The
    answer given is the number the tool printed plus ``offset`` (non-zero: a wrong answer),
    through ``finish`` or, with ``via="text"``, as a ``\\boxed{}`` in a final message with no
    tool call.
    """

    programs: dict[str, str]
    offset: int = 0
    via: Literal["finish", "text"] = "finish"

    def _program(self, conversation: str) -> str:
        problem = first_user_message(conversation)
        for fragment, code in self.programs.items():
            if fragment in problem:
                return code
        return "print('I do not know this problem')"

    def reply(self, conversation: str) -> str:
        seen = tool_responses(conversation)
        if not seen:
            code = self._program(conversation)
            return "Let me compute this.\n" + tool_call("python", {"code": code})
        numbers = _NUMBER.findall(seen[-1])
        if not numbers:
            return "I could not compute it.\n" + tool_call("finish", {"answer": "unknown"})
        value = float(numbers[-1]) + self.offset
        answer = str(int(value)) if value.is_integer() else str(value)
        if self.via == "text":
            return f"The computation gives {answer}, so the answer is \\boxed{{{answer}}}."
        return f"The tool printed {numbers[-1]}.\n" + tool_call("finish", {"answer": answer})


@dataclass
class KillToolServer:
    """Kills the sandbox's tool server from inside the Python kernel (its child process)."""

    def reply(self, conversation: str) -> str:
        code = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)"
        return tool_call("python", {"code": code})


@dataclass
class BoxedAnswer:
    """Answers at once, in text (``\\boxed{answer}``), with no tool call."""

    answer: str

    def reply(self, conversation: str) -> str:
        return f"That is \\boxed{{{self.answer}}}."


@dataclass
class PythonSleeper:
    """Calls the ``python`` tool with code that sleeps ``seconds`` (a tool call to cancel)."""

    seconds: float = 60.0

    def reply(self, conversation: str) -> str:
        return tool_call("python", {"code": f"import time; time.sleep({self.seconds})"})


Finish = Literal["fenced", "text", "file"]


@dataclass
class CodeWriter:
    """Writes ``path`` (``solution.py``) with the editor, runs ``run`` with bash, then finishes.

    With ``fix=(old, new)`` the first file written is ``draft``; when its run shows a
    traceback the policy applies the fix with ``str_replace`` and runs it again. ``finish``
    says how the solution is handed in: the code to ``finish`` in a fenced block
    (``fenced``), a fenced block in the final message and ``finish("done")`` (``text``),
    or only the file name (``file``: the handler then reads ``solution.py``).
    """

    draft: str
    run: str
    fix: tuple[str, str] | None = None
    finish: Finish = "fenced"
    path: str = "solution.py"

    @property
    def solution(self) -> str:
        return self.draft if self.fix is None else self.draft.replace(*self.fix)

    def reply(self, conversation: str) -> str:
        seen = tool_responses(conversation)
        if not seen:
            args = {"command": "create", "path": self.path, "file_text": self.draft}
            return "I will write the program.\n" + tool_call("str_replace_editor", args)
        if len(seen) % 2 == 1:  # the file was just written or edited: run it
            return "Now I run it.\n" + tool_call("bash", {"command": self.run})
        if self.fix is not None and "Traceback" in seen[-1] and len(seen) == 2:
            old, new = self.fix
            args = {"command": "str_replace", "path": self.path, "old_str": old, "new_str": new}
            return "It crashed; fixing.\n" + tool_call("str_replace_editor", args)
        return self._finish(seen[-1])

    def _finish(self, last_run: str) -> str:
        block = f"```python\n{self.solution}```"
        said = f"The run printed: {last_run.strip()[:200]}\n"
        if self.finish == "fenced":
            return said + tool_call("finish", {"answer": block})
        if self.finish == "text":
            return f"{said}My solution:\n{block}\n" + tool_call("finish", {"answer": "done"})
        return said + tool_call("finish", {"answer": self.path})


# --------------------------------------------------------------------------- serving


def require_bwrap() -> None:
    """Skip (fail under CI) when bubblewrap cannot create sandboxes here."""
    problem = bwrap_problem()
    require(problem is None, f"bubblewrap cannot create sandboxes here: {problem}")


@asynccontextmanager
async def serve(
    make_server: ServerFactory, policy: Policy, **overrides: Any
) -> AsyncIterator[Server]:
    """A real server on loopback (bwrap sandboxes) whose only backend is a scripted LLM."""
    require_bwrap()
    async with ScriptedLLM(policy=policy) as llm, make_server(runtime="bwrap", **overrides) as srv:
        await srv.client.add_llm_server(llm.address)
        yield srv


async def finished(srv: Server, job_id: str, wait: float = 60.0) -> dict[str, Any]:
    """The job's result document once it is terminal (long-poll, no sleeps)."""
    result = await srv.client.result(job_id, wait=wait)
    assert result is not None, f"job {job_id} not finished after {wait} s"
    return result


def assert_nothing_live(srv: Server) -> None:
    """No sandbox of the server is left open."""
    assert srv.runtime.live == 0
