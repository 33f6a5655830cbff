"""One LLM backend, the lease a job holds on it, and the routing rule.

The pool that owns backends and hands out leases is in ``pool.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal

import msgspec

from prorl_async.llm.engines import EngineApi
from prorl_async.llm.generation import Generation
from prorl_async.util.timer import PausableTimer

__all__ = [
    "Backend",
    "BackendError",
    "Lease",
    "Picker",
    "PoolConfig",
    "least_inflight",
]


class BackendError(Exception):
    """An LLM call failed for good (retries exhausted, no backend left, or refused).

    The pipeline reports it as ``error.stage = "run"``. ``address`` is the backend of the
    last attempt when there was one; ``__cause__`` is the underlying engine error.
    """

    def __init__(self, message: str, *, address: str | None = None) -> None:
        super().__init__(message)
        self.address = address


class PoolConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Knobs of the backend pool (loadable from the server's TOML config)."""

    failure_threshold: int = 3
    """Consecutive failures (connection error, timeout, 5xx) that mark a backend unhealthy."""
    probe_interval_s: float = 1.0
    """Seconds between ``GET /health`` probes of an unhealthy backend."""
    probe_timeout_s: float = 2.0
    retries: int = 3
    """Extra attempts of one LLM call after a retryable failure (so ``retries + 1`` in all)."""
    retry_backoff_s: float = 0.05
    """Pause before retrying on the same backend (doubles per attempt); none when moving."""
    request_timeout_s: float | None = 600.0
    """Limit on one LLM request; ``None`` waits forever."""
    register_timeout_s: float = 10.0
    """How long ``add_llm_server`` waits for the engine's ``/v1/models`` answer."""
    weights_timeout_s: float = 120.0
    """Limit on each engine's part of each step of a weight operation (its pause, its
    load, its resume with the version; a ``wait`` pause: the larger of this and
    ``request_timeout_s``). Past it the operation answers 504 naming the engine, which is
    marked unhealthy and given the current weights before it serves again."""
    on_interrupt: Literal["continue", "regenerate"] = "continue"
    """A turn a weight update aborted: ``continue`` it from the tokens it made (nothing
    thrown away; the turn's tokens may come from two versions), or ``regenerate`` it whole
    under the new weights (one version per turn; the partial tokens are thrown away)."""
    model: str | None = None
    """vLLM ``model`` field for backends registered without one; ``None`` asks ``/v1/models``."""
    batch_prompts: int = 1
    """Most prompts one vLLM request carries: calls to one backend with the same sampling
    made together go as one ``/v1/completions`` with a list of prompts (less of the
    engine's API server's CPU per call; each call waits for the longest of its batch).
    1 (the default) sends each call alone. See ``prorl_async.llm.batching``."""

    def __post_init__(self) -> None:
        if self.failure_threshold < 1:
            raise ValueError(f"failure_threshold must be >= 1, got {self.failure_threshold}")
        if self.batch_prompts < 1:
            raise ValueError(f"batch_prompts must be >= 1, got {self.batch_prompts}")
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, got {self.retries}")
        for name in (
            "probe_interval_s",
            "probe_timeout_s",
            "request_timeout_s",
            "register_timeout_s",
            "weights_timeout_s",
        ):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        if self.retry_backoff_s < 0:
            raise ValueError(f"retry_backoff_s must be >= 0, got {self.retry_backoff_s}")


class Backend:
    """One registered engine server and its live routing counters."""

    __slots__ = (
        "address",
        "api",
        "weight_version",
        "max_inflight",
        "weight",
        "model",
        "max_model_len",
        "inflight",
        "assigned",
        "healthy",
        "failures",
        "probe_failures",
        "open_calls",
        "paused",
        "resumed",
        "idle",
        "weights_path",
        "loaded_at",
        "last_load_s",
    )

    def __init__(self, address: str, *, api: EngineApi = "vllm") -> None:
        _check_address(address)
        self.address = address
        self.api: EngineApi = api
        self.weight_version: int | str | None = None
        self.max_inflight: int | None = None
        self.weight = 1.0
        self.model: str | None = None
        self.max_model_len: int | None = None
        """The engine's context window (from ``/v1/models``; ``None``: not reported)."""
        self.inflight = 0
        """Jobs holding a lease on this backend now."""
        self.assigned = 0
        """Leases ever given out on this backend (only a tie-breaker for routing)."""
        self.healthy = True
        self.failures = 0
        """Consecutive failed calls."""
        self.probe_failures = 0
        """Consecutive failed health probes while calls were open."""
        self.open_calls: dict[asyncio.Timeout, PausableTimer | None] = {}
        """Calls waiting for this engine's answer (with their job's timer); a stalled
        engine's are expired at once, a frozen one's timers paused."""
        self.idle = asyncio.Event()
        """Set while no call is open."""
        self.idle.set()
        self.paused = False
        """Paused for a weight update: no call is sent until it resumes."""
        self.resumed = asyncio.Event()
        self.resumed.set()
        self.weights_path: str | None = None
        """The checkpoint it serves (``/v1/models`` root at registration, then each load)."""
        self.loaded_at: float | None = None
        """Wall-clock time of the last weight load (``None``: never loaded here)."""
        self.last_load_s: float | None = None

    def configure(
        self,
        *,
        api: EngineApi,
        weight_version: int | str | None,
        max_inflight: int | None,
        weight: float,
        model: str | None,
        max_model_len: int | None = None,
    ) -> None:
        """Apply registration fields (validated); re-registration also resets health."""
        if api not in ("vllm", "sglang"):
            raise ValueError(f"api must be 'vllm' or 'sglang', got {api!r}")
        if max_inflight is not None and (isinstance(max_inflight, bool) or max_inflight < 1):
            raise ValueError(f"max_inflight must be a positive integer, got {max_inflight!r}")
        if not weight > 0:
            raise ValueError(f"weight must be > 0, got {weight!r}")
        if api != self.api or model is not None:
            self.model = model
        self.api, self.weight_version = api, weight_version
        self.max_inflight, self.weight = max_inflight, float(weight)
        if max_model_len is not None:
            self.max_model_len = max_model_len
        self.healthy, self.failures, self.probe_failures = True, 0, 0

    def has_room(self) -> bool:
        return self.max_inflight is None or self.inflight < self.max_inflight

    def available(self) -> bool:
        """May take a new job now: healthy, not paused for weights, below max_inflight."""
        return self.healthy and not self.paused and self.has_room()

    def snapshot(self) -> dict[str, Any]:
        """Exactly the API.md ``/status`` backend fields."""
        return {
            "address": self.address,
            "inflight": self.inflight,
            "assigned": self.assigned,
            "healthy": self.healthy,
            "weight_version": self.weight_version,
            "max_model_len": self.max_model_len,
        }

    def __repr__(self) -> str:
        return (
            f"Backend({self.address!r}, inflight={self.inflight}, assigned={self.assigned}, "
            f"healthy={self.healthy}, weight_version={self.weight_version!r})"
        )


def _check_address(address: str) -> None:
    if not isinstance(address, str) or not address.startswith(("http://", "https://")):
        raise ValueError(
            f"address must be an http(s) URL like http://host:port/v1, got {address!r}"
        )


_Call = Callable[["Lease", list[int], int, dict[str, Any]], Awaitable[Generation]]


class Lease:
    """A job's hold on one backend for its RUN stage; implements ``Generator``.

    Calls on one lease are sequential (one conversation). After a failover the lease
    holds the new backend; :attr:`backend` is always the one the next call goes to.
    """

    __slots__ = ("_call", "_held", "_last", "timer", "_busy")

    def __init__(self, call: _Call, backend: Backend, timer: PausableTimer | None) -> None:
        self._call = call
        self._held: Backend | None = backend
        self._last = backend
        self.timer = timer
        self._busy = False

    @property
    def backend(self) -> Backend:
        return self._last

    @property
    def address(self) -> str:
        return self._last.address

    @property
    def max_model_len(self) -> int | None:
        """The context window of the engine the next call goes to (``None``: unknown)."""
        return self._last.max_model_len

    async def generate(
        self, prompt_ids: list[int], max_tokens: int, sampling: dict[str, Any]
    ) -> Generation:
        """Complete ``prompt_ids`` on the held backend, failing over when it is down."""
        if self._held is None:
            raise RuntimeError("this lease has ended")
        if self._busy:
            raise RuntimeError("a lease makes one LLM call at a time")
        self._busy = True
        try:
            return await self._call(self, prompt_ids, max_tokens, sampling)
        finally:
            self._busy = False

    def _hold(self, backend: Backend) -> None:
        self._held = self._last = backend

    def _release_hold(self) -> Backend | None:
        held, self._held = self._held, None
        return held


Picker = Callable[[Sequence[Backend]], Backend]
"""Chooses one backend among non-empty candidates that are healthy and have room."""


def least_inflight(candidates: Sequence[Backend]) -> Backend:
    """Fewest jobs in flight now per unit of weight; ties to the least assigned in total."""
    return min(candidates, key=lambda b: (b.inflight / b.weight, b.assigned))
