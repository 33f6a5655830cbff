"""Jobs inside a stage for ``StageStats`` unit tests: real ``PausableTimer``s on a clock
of the test's own."""

from __future__ import annotations

from prorl_async.stages.stats import StageStats
from prorl_async.util.timer import PausableTimer


def entered(
    stats: StageStats, key: object, *, active: float = 0.0, paused: bool = False
) -> PausableTimer:
    """A job that entered the stage ``active`` seconds of active time ago, its timer now
    running or ``paused`` (waiting for a backend, or for a sandbox slot)."""
    now = [0.0]
    timer = PausableTimer(None)
    timer._clock = lambda: now[0]
    timer.resume()
    stats.enter(key, timer)
    now[0] = active
    if paused:
        timer.pause()
    return timer
