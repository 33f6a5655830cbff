"""The scripted LLM's latency model and live concurrency statistics.

A request first waits for a decoding slot (``capacity`` of them, like an engine's
``max_num_seqs``), then takes ``ttft_s`` plus ``per_token_s`` for each generated token,
stretched by ``slowdown`` for every other request decoding at the same time (a batch
of n runs each token ``1 + slowdown * (n - 1)`` times slower).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import msgspec

__all__ = ["LatencyModel", "Stats"]


class LatencyModel(msgspec.Struct, kw_only=True):
    """Timing knobs; all zero (the default) answers as fast as possible."""

    ttft_s: float = 0.0
    per_token_s: float = 0.0
    slowdown: float = 0.0
    capacity: int | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_s", "per_token_s", "slowdown"):
            if getattr(self, name) < 0:
                raise ValueError(f"latency {name} must be >= 0, got {getattr(self, name)}")
        if self.capacity is not None and self.capacity < 1:
            raise ValueError(f"latency capacity must be >= 1, got {self.capacity}")

    def duration(self, tokens: int, decoding: int) -> float:
        """Seconds to produce ``tokens`` while ``decoding`` requests (this one included) run."""
        stretch = 1.0 + self.slowdown * max(decoding - 1, 0)
        return self.ttft_s + tokens * self.per_token_s * stretch


class Stats(msgspec.Struct, kw_only=True):
    """Live counters of the scripted LLM (read them; the server updates them)."""

    arrived: int = 0
    """Generation requests received (including faulted ones)."""
    served: int = 0
    """Generation requests answered 200."""
    active: int = 0
    """Generation requests being handled now (queued for a slot or decoding)."""
    peak_active: int = 0
    decoding: int = 0
    """Requests holding a decoding slot now."""
    peak_decoding: int = 0

    def reset_peaks(self) -> None:
        self.peak_active, self.peak_decoding = self.active, self.decoding


class Decoder:
    """Runs the latency model: slots, timing and the concurrency counters."""

    def __init__(self, latency: LatencyModel, stats: Stats) -> None:
        self.latency = latency
        self.stats = stats
        self._free = asyncio.Condition()

    @asynccontextmanager
    async def active(self) -> AsyncIterator[None]:
        """Count one request as being handled for the duration of the block."""
        s = self.stats
        s.active += 1
        s.peak_active = max(s.peak_active, s.active)
        try:
            yield
        finally:
            s.active -= 1

    async def decode(
        self,
        tokens: int,
        step: Callable[[], Awaitable[None]] | None = None,
        abort: asyncio.Event | None = None,
    ) -> int:
        """Take a slot, spend the modelled time, give the slot back; returns the tokens made.

        With ``step`` (awaited before each token: a frozen engine blocks there) and
        ``abort`` (set: stop now), the time is spent token by token and an abort returns
        how many tokens were made by then.
        """
        async with self._free:
            await self._free.wait_for(self._has_slot)
            self.stats.decoding += 1
        s = self.stats
        s.peak_decoding = max(s.peak_decoding, s.decoding)
        try:
            if step is None:
                delay = self.latency.duration(tokens, s.decoding)
                if delay > 0:
                    await asyncio.sleep(delay)
                return tokens
            return await self._stepwise(tokens, step, abort)
        finally:
            s.decoding -= 1
            async with self._free:
                self._free.notify()

    async def _stepwise(
        self, tokens: int, step: Callable[[], Awaitable[None]], abort: asyncio.Event | None
    ) -> int:
        lat = self.latency
        if lat.ttft_s > 0:
            await asyncio.sleep(lat.ttft_s)
        per = lat.per_token_s * (1.0 + lat.slowdown * max(self.stats.decoding - 1, 0))
        for made in range(tokens):
            await step()
            if abort is not None and abort.is_set():
                return made
            if per > 0:
                await asyncio.sleep(per)
        return tokens

    def _has_slot(self) -> bool:
        cap = self.latency.capacity
        return cap is None or self.stats.decoding < cap
