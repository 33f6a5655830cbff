"""Text helpers shared by the tools: ANSI stripping and bounded head+tail capture."""

from __future__ import annotations

import re
from collections.abc import Callable

__all__ = ["CappedText", "cap_text", "clean_terminal_text", "strip_ansi"]

# CSI sequences, OSC sequences (ended by BEL or ST), and two-byte escapes.
_ANSI = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b[PX^_][^\x1b]*\x1b\\"
    r"|\x1b[ -/]*[0-~]"
)
# C0 controls a model should never see (tab, newline and carriage return stay).
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def strip_ansi(text: str) -> str:
    """Remove terminal escape sequences and stray control characters."""
    return _CONTROL.sub("", _ANSI.sub("", text))


def clean_terminal_text(text: str) -> str:
    """What a terminal would show: no escapes, ``\\r\\n`` -> ``\\n``, ``\\r`` overwrites."""
    text = strip_ansi(text).replace("\r\n", "\n")
    if "\r" not in text:
        return text
    lines = []
    for line in text.split("\n"):
        parts = [p for p in line.split("\r") if p]
        lines.append(parts[-1] if parts else "")
    return "\n".join(lines)


def _marker(omitted: int) -> str:
    return f"\n[... {omitted} characters omitted ...]\n"


def cap_text(text: str, cap: int) -> str:
    """Keep the first and last ``cap // 2`` characters of ``text`` around a marker."""
    if len(text) <= cap:
        return text
    half = cap // 2
    tail = text[len(text) - (cap - half) :] if cap - half else ""
    return text[:half] + _marker(len(text) - half - len(tail)) + tail


class CappedText:
    """Accumulates a stream of text in bounded memory: a head, a tail, and a count.

    ``limit`` is how much of each end to keep; anything in between is dropped as
    it arrives (only its length is remembered), so a command printing gigabytes
    costs at most ``2 * limit`` characters.
    """

    __slots__ = ("limit", "_head", "_tail", "_dropped")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._head = ""
        self._tail = ""
        self._dropped = 0

    def __len__(self) -> int:
        return len(self._head) + self._dropped + len(self._tail)

    def append(self, chunk: str) -> None:
        if len(self._head) < self.limit and not self._tail:
            room = self.limit - len(self._head)
            self._head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self._tail += chunk
            excess = len(self._tail) - self.limit
            if excess > 0:
                self._dropped += excess
                self._tail = self._tail[excess:]

    def drop_suffix(self, count: int) -> None:
        """Forget the last ``count`` characters (e.g. a sentinel line)."""
        cut = min(count, len(self._tail))
        self._tail = self._tail[: len(self._tail) - cut]
        if count > cut:
            self._head = self._head[: max(0, len(self._head) - (count - cut))]

    def text(self, cap: int, clean: Callable[[str], str] = clean_terminal_text) -> str:
        """The cleaned text, capped to ``cap`` characters of head and tail plus a marker."""
        if not self._dropped:
            return cap_text(clean(self._head + self._tail), cap)
        half = cap // 2
        head = clean(self._head)
        tail = clean(self._tail)
        kept_head, kept_tail = head[:half], tail[max(0, len(tail) - (cap - half)) :]
        omitted = self._dropped + len(head) - len(kept_head) + len(tail) - len(kept_tail)
        return kept_head + _marker(omitted) + kept_tail
