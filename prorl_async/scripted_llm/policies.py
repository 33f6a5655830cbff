"""What the scripted LLM says: pluggable reply policies.

A policy sees the whole conversation as text (the prompt ids decoded with the tokenizer,
special tokens kept) and returns the assistant's reply text. It must be deterministic for
a given conversation so a retried request gets the same answer.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Mapping
from typing import Protocol

__all__ = [
    "POLICIES",
    "EchoPolicy",
    "FinishPolicy",
    "Policy",
    "RandomToolsPolicy",
    "make_policy",
]

_ASSISTANT = "<|im_start|>assistant"
_USER = "<|im_start|>user"


class Policy(Protocol):
    """Decides the reply text of the scripted LLM."""

    def reply(self, conversation: str) -> str:
        """The assistant's next reply to ``conversation`` (decoded prompt, specials kept)."""
        ...


def tool_call(name: str, arguments: Mapping[str, object]) -> str:
    """A tool call in the chat template's ``<tool_call>`` form."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': dict(arguments)})}\n</tool_call>"


def _rng(seed: int, text: str) -> random.Random:
    digest = hashlib.blake2b(f"{seed}\0{text}".encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "big"))


class FinishPolicy:
    """Answers at once by calling ``finish`` with a fixed answer."""

    def __init__(self, seed: int = 0, answer: str = "42") -> None:
        self.answer = answer

    def reply(self, conversation: str) -> str:
        return f"The answer is {self.answer}.\n" + tool_call("finish", {"answer": self.answer})


class EchoPolicy:
    """Repeats the last user message back (useful to see exactly what the model was shown)."""

    def __init__(self, seed: int = 0, answer: str = "42") -> None:
        pass

    def reply(self, conversation: str) -> str:
        last = conversation.rsplit(_USER, 1)[-1] if _USER in conversation else conversation
        return last.split("<|im_end|>", 1)[0].strip()


_COMMANDS = ["ls -la", "pwd", "echo hello", "cat /etc/hostname", "python3 -c 'print(6*7)'"]
_CODE = ["print(1 + 1)", "import math\nprint(math.pi)", "x = [i * i for i in range(5)]\nprint(x)"]
_PATHS = ["/tmp/notes.txt", "/tmp/main.py", "/tmp/README.md"]


class RandomToolsPolicy:
    """Seeded random tool calls among bash, python and str_replace_editor, then ``finish``.

    The number of tool turns (1..``max_turns``) is fixed per conversation by its first user
    message; about ``malformed_rate`` of the calls are deliberately broken (bad JSON, no
    closing tag, unknown tool, missing arguments) to exercise the agent's error paths.
    """

    def __init__(
        self, seed: int = 0, answer: str = "42", max_turns: int = 4, malformed_rate: float = 0.15
    ) -> None:
        self.seed = seed
        self.answer = answer
        self.max_turns = max_turns
        self.malformed_rate = malformed_rate

    def reply(self, conversation: str) -> str:
        done = max(conversation.count(_ASSISTANT) - 1, 0)
        first_user = conversation.split(_ASSISTANT, 1)[0]
        turns = _rng(self.seed, first_user).randint(1, self.max_turns)
        if done >= turns:
            return FinishPolicy(answer=self.answer).reply(conversation)
        rng = _rng(self.seed, conversation)
        if rng.random() < self.malformed_rate:
            return self._malformed(rng)
        return "Let me check.\n" + self._call(rng)

    def _call(self, rng: random.Random) -> str:
        tool = rng.choice(["bash", "python", "str_replace_editor"])
        if tool == "bash":
            return tool_call("bash", {"command": rng.choice(_COMMANDS)})
        if tool == "python":
            return tool_call("python", {"code": rng.choice(_CODE)})
        path = rng.choice(_PATHS)
        if rng.random() < 0.5:
            return tool_call(tool, {"command": "view", "path": path})
        args = {"command": "create", "path": path, "file_text": "hello\n"}
        return tool_call(tool, args)

    def _malformed(self, rng: random.Random) -> str:
        kind = rng.randrange(4)
        if kind == 0:
            return '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"\n</tool_call>'
        if kind == 1:
            return '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}'
        if kind == 2:
            return tool_call("no_such_tool", {"x": 1})
        return '<tool_call>\n{"name": "python"}\n</tool_call>'


PolicyFactory = Callable[..., Policy]

POLICIES: dict[str, PolicyFactory] = {
    "finish": FinishPolicy,
    "echo": EchoPolicy,
    "random_tools": RandomToolsPolicy,
}
"""Built-in policies by name (``--policy NAME``)."""


def make_policy(name: str, *, seed: int = 0, answer: str = "42") -> Policy:
    """Build the named built-in policy; unknown names raise ``ValueError`` listing the choices."""
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {sorted(POLICIES)}") from None
    return factory(seed=seed, answer=answer)
