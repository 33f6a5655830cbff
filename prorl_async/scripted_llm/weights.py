"""The double's weights, paused and loaded the way the engines do it (TEST DOUBLE).

vLLM (dev mode) and SGLang both let a trainer pause generation, load a checkpoint in place
and resume. The double follows their routes and behaviour closely enough to test a server
against:

- pause ``abort`` ends every request in flight with what it has made (``finish_reason``
  ``abort``); ``keep`` (SGLang ``in_place``) freezes them until the resume; ``wait``
  returns once they have finished. Paused, new requests wait for the resume.
- a load names a directory (it must exist); its path salts the synthetic logprobs, so
  tokens made after a load differ from those made before, as with real new weights. It
  takes ``load_s`` seconds (default 0), time for a test to stop the engine mid-load.
- SGLang's ``/update_weight_version`` aborts every request in flight unless it is sent
  ``abort_all_requests: false``; ``/update_weights_from_disk`` only with ``true``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

__all__ = ["EngineWeights", "WeightsRefused"]


class WeightsRefused(ValueError):
    """A load the double refuses (no such directory); the message says why."""


class EngineWeights:
    """Which weights the double serves, and its pause state."""

    def __init__(self, load_s: float = 0.0) -> None:
        if not load_s >= 0:
            raise ValueError(f"load_s must be >= 0, got {load_s}")
        self.load_s = load_s
        self.loading: str | None = None
        """The checkpoint being loaded now (``None``: no load under way)."""
        self.path: str | None = None
        """The checkpoint loaded last (``None``: the weights it started with)."""
        self.version: str | None = None
        self.paused = False
        self.loads: list[str] = []
        self._open = asyncio.Event()  # cleared while paused: new requests wait
        self._open.set()
        self._running = asyncio.Event()  # cleared while frozen (keep / in_place)
        self._running.set()
        self._abort = asyncio.Event()  # set (then replaced) to abort what is in flight
        self._idle = asyncio.Event()
        self._idle.set()
        self.inflight = 0
        self.aborted = 0

    @property
    def salt(self) -> str:
        return self.path or ""

    # -- requests ------------------------------------------------------------------------

    async def admit(self) -> asyncio.Event:
        """Wait while paused, then count the request in flight; returns its abort event."""
        await self._open.wait()
        self.inflight += 1
        self._idle.clear()
        return self._abort

    def finished(self) -> None:
        self.inflight -= 1
        if self.inflight == 0:
            self._idle.set()

    async def step(self) -> None:
        """Before each token: wait while frozen."""
        await self._running.wait()

    # -- control ---------------------------------------------------------------------------

    def abort_all(self) -> None:
        if self.inflight:
            self.aborted += self.inflight
        self._abort.set()
        self._abort = asyncio.Event()

    async def pause(self, mode: str) -> None:
        """``abort``, ``keep``/``in_place``, ``wait`` (vLLM) or ``retract`` (SGLang: as abort)."""
        self.paused = True
        self._open.clear()
        if mode in ("keep", "in_place"):
            self._running.clear()
        elif mode == "wait":
            await self._idle.wait()
        else:
            self.abort_all()

    def resume(self) -> None:
        self.paused = False
        self._running.set()
        self._open.set()

    async def reload(self, path: str, version: str | None = None) -> None:
        """:meth:`load`, taking ``load_s`` seconds as reading a checkpoint does."""
        self.loading = path
        try:
            await asyncio.sleep(self.load_s)  # the double's load time, not synchronisation
            self.load(path, version)
        finally:
            self.loading = None

    def state(self) -> dict[str, object]:
        """What ``GET /scripted/weights`` answers (the double's own route)."""
        return {
            "path": self.path,
            "version": self.version,
            "paused": self.paused,
            "loading": self.loading,
            "loads": self.loads,
        }

    def load(self, path: str, version: str | None = None) -> None:
        if not Path(path).is_dir():
            raise WeightsRefused(f"no such directory: {path!r}")
        self.path = path
        self.loads.append(path)
        if version is not None:
            self.version = version
