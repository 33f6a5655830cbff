"""A heartbeat on the event loop, and a thread that fails the test when the loop stops.

A coroutine that never yields blocks every timeout, watchdog and cancellation on its loop:
``asyncio.wait_for`` cannot fire. The thread notices that the heartbeat stopped ticking
and raises ``LoopBlocked`` in the main thread (where the blocked code runs), so the test
fails with a message instead of hanging until the whole session is killed.
"""

from __future__ import annotations

import _thread
import asyncio
import contextlib
import signal
import threading
import time
from collections.abc import AsyncIterator
from types import FrameType


class LoopBlocked(AssertionError):
    """The event loop ran no heartbeat for too long: some step never yields."""


class Heartbeat:
    def __init__(self) -> None:
        self.ticks = 0
        self.last = time.monotonic()

    async def run(self, tick_s: float) -> None:
        while True:
            self.ticks += 1
            self.last = time.monotonic()
            await asyncio.sleep(tick_s)


def _watch(beat: Heartbeat, stop: threading.Event, stuck_s: float) -> None:
    while not stop.wait(0.5):
        if time.monotonic() - beat.last > stuck_s:
            _thread.interrupt_main(signal.SIGUSR1)
            return


@contextlib.asynccontextmanager
async def loop_watch(stuck_s: float = 30.0, tick_s: float = 0.02) -> AsyncIterator[Heartbeat]:
    """Tick a heartbeat; raise ``LoopBlocked`` in the loop's thread after ``stuck_s`` without."""

    def blocked(signum: int, frame: FrameType | None) -> None:
        raise LoopBlocked(f"the event loop ran no heartbeat for {stuck_s:.0f} s")

    beat = Heartbeat()
    previous = signal.signal(signal.SIGUSR1, blocked)
    stop = threading.Event()
    task = asyncio.create_task(beat.run(tick_s))
    thread = threading.Thread(target=_watch, args=(beat, stop, stuck_s), daemon=True)
    thread.start()
    try:
        yield beat
    finally:
        stop.set()
        thread.join()
        task.cancel()
        await asyncio.wait({task})
        signal.signal(signal.SIGUSR1, previous)
