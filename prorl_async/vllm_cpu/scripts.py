"""Scripted replies for a random model: which token a designated request must produce next.

A scripts file (JSON, path in ``$PRORL_VLLM_SCRIPTS``) maps a request ``seed`` to the
assistant turns of one conversation, as text:

    {"9001": ["<tool_call>\\n{\\"name\\": \\"python\\", ...}\\n</tool_call>", "the answer"]}

A request whose seed is listed is a turn of that conversation: its index is the number of
assistant headers (``<|im_start|>assistant\\n``) in the prompt before the last one, and the
turn's text (tokenized by the engine's own tokenizer, then ``<|im_end|>``) is forced token by
token. A prompt that already holds part of the turn after its last header (a generation
continued after an interruption) continues the script where it stopped. Once the turn's
tokens run out, ``<|im_end|>`` is forced. Requests with other seeds are left alone.

No torch here: ``scripting`` applies these decisions to vLLM's logits.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["ENV_VAR", "ScriptBook", "Turn", "header_end"]

ENV_VAR = "PRORL_VLLM_SCRIPTS"

Encode = Callable[[str], list[int]]


def header_end(prompt: Sequence[int], header: Sequence[int]) -> tuple[int, int]:
    """(assistant headers in ``prompt``, index just past the last one; 0 when none)."""
    n, count, end = len(header), 0, 0
    first = header[0]
    for i, tok in enumerate(prompt):
        if tok == first and list(prompt[i : i + n]) == list(header):
            count, end = count + 1, i + n
    return count, end


class Turn:
    """The forced tokens of one request: ``ids`` from position ``offset`` of the turn on."""

    __slots__ = ("ids", "offset", "eos")

    def __init__(self, ids: list[int], offset: int, eos: int) -> None:
        self.ids, self.offset, self.eos = ids, offset, eos

    def next_token(self, generated: int) -> int:
        """The token to force after ``generated`` tokens of this request."""
        pos = self.offset + generated
        return self.ids[pos] if pos < len(self.ids) else self.eos


class ScriptBook:
    """The scripts file, re-read when it changes (tests add scripts while the engine runs)."""

    def __init__(self, encode: Encode, header: Sequence[int], eos: int, path: str | None) -> None:
        self.encode, self.header, self.eos = encode, list(header), eos
        self.path = path if path is not None else os.environ.get(ENV_VAR)
        self._version: tuple[int, int, int] | None = None
        self._scripts: dict[int, list[str]] = {}
        self._encoded: dict[tuple[int, int], list[int]] = {}

    def _refresh(self) -> None:
        if not self.path:
            return
        try:
            st = Path(self.path).stat()
        except OSError:
            return
        # Inode too: a file replaced twice within one timestamp tick is still seen as new.
        version = (st.st_ino, st.st_mtime_ns, st.st_size)
        if version == self._version:
            return
        try:
            raw = json.loads(Path(self.path).read_text())
        except (OSError, ValueError):
            return  # half-written: keep the last good table, read again next time
        self._scripts = {int(k): [str(t) for t in v] for k, v in raw.items()}
        self._encoded.clear()
        self._version = version

    def turn(self, seed: int | None, prompt: Sequence[int]) -> Turn | None:
        """The forced turn for a request, or ``None`` when its seed has no script."""
        if seed is None:
            return None
        self._refresh()
        script = self._scripts.get(seed)
        if script is None:
            return None
        count, end = header_end(prompt, self.header)
        index = max(count - 1, 0)
        if index >= len(script):
            return Turn([], 0, self.eos)
        key = (seed, index)
        if key not in self._encoded:
            self._encoded[key] = self.encode(script[index]) + [self.eos]
        return Turn(self._encoded[key], len(prompt) - end, self.eos)
