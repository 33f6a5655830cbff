"""The demo's scripted model (a TEST DOUBLE for a real LLM): solves tasks by real tool use.

Every demo prompt carries a marker ``[demo <key>]``; the policy looks the key up in the
scripts the task generator made and plays that script one tool call per turn, reading the
tool outputs (inside ``<tool_response>``) from the conversation it is shown:

- math: computes with the ``python`` tool and finishes with the number the tool printed;
- code: writes ``solution.py`` with the editor, runs it on the public example with ``bash``,
  then finishes with the code;
- swe: views the buggy file, runs the tests with ``bash``, fixes the bug with
  ``str_replace_editor``, reruns the tests, finishes.

What a script knows is what a model would have to work out: the program that computes the
answer, the solution code, the planted bug's fix. That knowledge comes from the generator
(this is a scripted double); the hidden tests and reference answers are never given to it.
A script marked ``wrong`` errs like a model would: an off-by-one answer, a buggy solution, a
wrong fix, so rewards vary.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from prorl_async.scripted_llm.policies import tool_call

__all__ = ["CodeScript", "DemoPolicy", "MathScript", "Script", "SweScript", "marker"]

_ASSISTANT = "<|im_start|>assistant"
_MARKER = re.compile(r"\[demo ([a-z]+-\d+)\]")
_RESPONSE = re.compile(r"<tool_response>\n?(.*?)\n?</tool_response>", re.DOTALL)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_SUMMARY = re.compile(r"^=*\s*(\d+ (?:failed|passed)[^=\n]*?)\s*=*$", re.MULTILINE)
SOLUTION_FILE = "solution.py"


def marker(key: str) -> str:
    """The tag put in a prompt so the policy can find the task's script."""
    return f"[demo {key}]"


@dataclass(frozen=True)
class MathScript:
    """Compute with ``code`` in the python tool; answer what it printed (+1 when wrong)."""

    code: str
    wrong: bool = False

    def reply(self, step: int, seen: list[str]) -> str:
        if step == 0:
            return "Let me compute it.\n" + tool_call("python", {"code": self.code})
        numbers = _NUMBER.findall(seen[-1]) if seen else []
        if not numbers:
            return "I could not compute it.\n" + tool_call("finish", {"answer": "unknown"})
        value = numbers[-1]
        answer = str(int(value) + 1) if self.wrong and "." not in value else value
        return f"The tool printed {value}, so the answer is {answer}.\n" + tool_call(
            "finish", {"answer": answer}
        )


@dataclass(frozen=True)
class CodeScript:
    """Write ``solution`` to solution.py, run ``example_command`` with bash, finish."""

    solution: str
    example_command: str

    def reply(self, step: int, seen: list[str]) -> str:
        if step == 0:
            args = {"command": "create", "path": SOLUTION_FILE, "file_text": self.solution}
            return "I will write the solution.\n" + tool_call("str_replace_editor", args)
        if step == 1:
            return "Let me try it on the example.\n" + tool_call(
                "bash", {"command": self.example_command}
            )
        shown = seen[-1].strip().splitlines()[-1:] if seen else []
        answer = f"```python\n{self.solution}```"
        return f"The example printed {shown}. Submitting.\n" + tool_call(
            "finish", {"answer": answer}
        )


@dataclass(frozen=True)
class SweScript:
    """View ``path``, run the tests, replace ``old`` by ``new`` in it, rerun, finish."""

    path: str
    old: str
    new: str
    test_command: str

    def reply(self, step: int, seen: list[str]) -> str:
        if step == 0:
            args = {"command": "view", "path": self.path}
            return "Let me read the code.\n" + tool_call("str_replace_editor", args)
        if step in (1, 3):
            what = "Let me run the tests." if step == 1 else "Rerunning the tests."
            return f"{what}\n" + tool_call("bash", {"command": self.test_command})
        if step == 2:
            args = {"command": "str_replace", "path": self.path, "old_str": self.old}
            found = _summary(seen[-1]) if seen else "no output"
            text = f"The tests say: {found}. Fixing {self.path}.\n"
            return text + tool_call("str_replace_editor", {**args, "new_str": self.new})
        found = _summary(seen[-1]) if seen else "no output"
        return f"The tests now say: {found}.\n" + tool_call("finish", {"answer": "fixed"})


Script = MathScript | CodeScript | SweScript


def _summary(output: str) -> str:
    found = _SUMMARY.findall(output)
    return found[-1] if found else "no summary"


class DemoPolicy:
    """Replies for the demo tasks, keyed by the ``[demo <key>]`` marker in the first prompt."""

    def __init__(self, scripts: dict[str, Script]) -> None:
        self.scripts = scripts

    def reply(self, conversation: str) -> str:
        found = _MARKER.search(conversation.split(_ASSISTANT, 1)[0])
        script = self.scripts.get(found.group(1)) if found else None
        if script is None:
            return "I do not know this task.\n" + tool_call("finish", {"answer": "unknown"})
        step = max(conversation.count(_ASSISTANT) - 1, 0)
        return script.reply(step, _RESPONSE.findall(conversation))
