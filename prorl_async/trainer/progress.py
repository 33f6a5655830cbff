"""A one-line progress bar on stderr, drawn only when stderr is a terminal."""

from __future__ import annotations

import sys
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    def __init__(self, stream: TextIO | None = None, enabled: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self._drawn = False

    def draw(self, ready: int, batch_groups: int, inflight: int, pass_rate: float | None) -> None:
        if not self.enabled:
            return
        width = 30
        filled = min(width, width * ready // max(batch_groups, 1))
        rate = "-" if pass_rate is None else f"{pass_rate:.0%}"
        bar = "#" * filled + "." * (width - filled)
        self.stream.write(
            f"\r[{bar}] {ready}/{batch_groups} groups, {inflight} in flight, pass {rate} "
        )
        self.stream.flush()
        self._drawn = True

    def done(self) -> None:
        if self.enabled and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
