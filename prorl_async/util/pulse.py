"""``Pulse``: wake every current waiter when something changed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["Pulse"]


class Pulse:
    """Wakes every current waiter when something changed (no state, no lost wake-ups for
    waiters that re-check their condition after each wake)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._listeners: list[Callable[[], None]] = []
        self._waiting = 0
        self._soon: asyncio.Handle | None = None

    def on_fire(self, callback: Callable[[], None]) -> None:
        """Also call ``callback`` (synchronously) on every ``fire``."""
        self._listeners.append(callback)

    def fire(self) -> None:
        if self._waiting:  # a new event only when someone waits on the current one
            self._event.set()
            self._event = asyncio.Event()
        for callback in self._listeners:
            callback()

    def fire_soon(self) -> None:
        """``fire`` once at the end of this loop iteration, however many changes come
        before it: jobs moving in bulk wake waiters and listeners once, not per job."""
        if self._soon is None:
            self._soon = asyncio.get_running_loop().call_soon(self._fire_now)

    def _fire_now(self) -> None:
        self._soon = None
        self.fire()

    async def wait(self) -> None:
        self._waiting += 1
        try:
            await self._event.wait()
        finally:
            self._waiting -= 1
