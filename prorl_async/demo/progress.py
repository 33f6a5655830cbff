"""A self-drawn progress line on stderr (redrawn in place on a terminal, sparse otherwise)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]

_WIDTH = 30


class Progress:
    """``update(done, failed)`` redraws ``[#####.....] 12/40 jobs  failed 1  3.2 s``."""

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()
        self.started = time.monotonic()
        self._last_quarter = -1
        self._drawn = False

    def line(self, done: int, failed: int) -> str:
        filled = _WIDTH * done // self.total if self.total else _WIDTH
        bar = "#" * filled + "." * (_WIDTH - filled)
        elapsed = time.monotonic() - self.started
        return f"[{bar}] {done}/{self.total} jobs  failed {failed}  {elapsed:.1f} s"

    def update(self, done: int, failed: int = 0) -> None:
        if self.tty:
            self.stream.write("\r" + self.line(done, failed))
            self._drawn = True
        else:
            # Piped output: one line per quarter, not a wall of carriage returns.
            quarter = 4 * done // self.total if self.total else 4
            if quarter == self._last_quarter:
                return
            self._last_quarter = quarter
            self.stream.write(self.line(done, failed) + "\n")
        self.stream.flush()

    def close(self) -> None:
        """End the in-place line so what follows starts on a fresh one."""
        if self.tty and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
