"""The callback sender: POSTs each finished job's result document to its ``callback_url``.

Deliveries come from an ``Outbox`` (the job store's, durable in SQLite: a row is
written in the same transaction as the job's result, so a crash loses none), fetched
in batches, at most ``concurrency`` in flight, each attempt bounded by ``timeout_s``.
A failed attempt (no answer, or a non-2xx answer) is retried with exponential backoff
until ``retry_for_s`` after the job ended; a ``410 Gone`` answer stops at once. A
receiver that fails is probed one attempt at a time (``breaker.CircuitBreaker``) while its other
deliveries wait in the outbox. The sender runs beside the pipeline and holds only the
deliveries fetched: a receiver that is down or answers 500 costs one attempt per
backoff step and grows nothing but outbox rows on disk.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import deque
from collections.abc import Callable, Collection
from typing import Any, Protocol

import aiohttp
import msgspec

from prorl_async.notify.breaker import CircuitBreaker, host_of
from prorl_async.notify.config import CallbacksConfig
from prorl_async.notify.signing import SIGNATURE_HEADER, sign
from prorl_async.schemas import CallbackInfo
from prorl_async.util.version import __version__

__all__ = ["RESULT_GONE", "CallbackSender", "Delivery", "Outbox"]

log = logging.getLogger(__name__)

# The error of a delivery whose result expired or was deleted first (its row is dropped).
RESULT_GONE = "result no longer held"
_MAX_WAIT_S = 60.0  # longest sleep between outbox reads while deliveries are pending


class Delivery(msgspec.Struct, frozen=True):
    """One pending delivery: the job, its target, attempts made, when the job ended (wall)."""

    job_id: str
    url: str
    attempts: int
    created_at: float


class Outbox(Protocol):
    """Where pending deliveries are kept (implemented by the job stores)."""

    # Called when a delivery becomes readable by ``due`` (after its commit, if any).
    waker: Callable[[], None] | None

    async def due(
        self, now: float, limit: int, skip: Collection[str]
    ) -> tuple[list[Delivery], float | None]:
        """Up to ``limit`` pending deliveries due at ``now`` (not in ``skip``), and when
        the next one not yet due is (wall clock; None if none is pending)."""
        ...

    async def body(self, job_id: str) -> bytes | None: ...
    def settle(
        self, job_id: str, *, state: str, attempts: int, next_at: float, error: str | None
    ) -> None: ...
    def retime(self, host: str, at: float) -> None:
        """Every pending delivery to ``host`` is next due at ``at`` (wakes once committed)."""
        ...

    async def info(self, job_id: str) -> CallbackInfo | None: ...
    def counts(self) -> dict[str, int]:
        """``{"pending": n}``: deliveries not yet delivered or failed."""
        ...


class CallbackSender:
    """Delivers the outbox's pending callbacks until closed."""

    def __init__(self, outbox: Outbox, config: CallbacksConfig) -> None:
        self.outbox = outbox
        self.config = config
        self._secret = (config.secret or "").encode()
        # Since this process started: attempts made, and their outcomes.
        self.stats = {"attempts": 0, "delivered": 0, "retried": 0, "failed": 0}
        self._inflight: set[str] = set()
        self._fetched: deque[Delivery] = deque()  # due, not yet started
        self._breakers: dict[str, CircuitBreaker] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._main: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._rng = random.Random()

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    def start(self) -> None:
        """Start delivering (once). Without an allowlist nothing is ever queued."""
        if self._main is not None or not self.config.enabled:
            return
        self.outbox.waker = self._wake.set
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self.config.concurrency),
            headers={"User-Agent": f"prorl-async/{__version__}"},
        )
        self._main = asyncio.create_task(self._run(), name="callback-sender")

    async def aclose(self) -> None:
        """Stop; deliveries cut short stay pending in the outbox (sent after a restart)."""
        main, self._main = self._main, None
        tasks = [t for t in (main, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        self.outbox.waker = None
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    # -- the loop ------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            self._wake.clear()  # before reading: a wake-up during the read is kept
            more, next_at = False, None
            if not self._fetched and self._free() > 0:
                limit = 2 * self.config.concurrency
                batch, next_at = await self.outbox.due(time.time(), limit, set(self._inflight))
                self._fetched.extend(batch)
                more = len(batch) == limit
            started = self._dispatch(time.time())
            if self._fetched or self._free() <= 0 or (more and not started):
                await self._sleep(None)  # until a slot frees or held rows are re-timed
            elif not more:
                await self._sleep(None if next_at is None else next_at - time.time())

    def _free(self) -> int:
        return self.config.concurrency - len(self._inflight)

    def _dispatch(self, now: float) -> int:
        """Start what the free slots and the breakers allow; returns how many started."""
        started = 0
        while self._fetched and self._free() > 0:
            d = self._fetched.popleft()
            breaker = self._breaker(d.url)
            if now > d.created_at + self.config.retry_for_s:
                self._settle(d, "failed", d.attempts, breaker.last_error or "retry window ended")
            elif breaker.admits(now):
                self._spawn(d, breaker)
                started += 1
            else:
                self._hold(breaker, breaker.hold_until(now))
        return started

    def _breaker(self, url: str) -> CircuitBreaker:
        host = host_of(url)
        breaker = self._breakers.get(host)
        if breaker is None:
            if len(self._breakers) > 1024:  # forget healthy receivers
                self._breakers = {h: g for h, g in self._breakers.items() if g.failures}
            breaker = self._breakers[host] = CircuitBreaker(host)
        return breaker

    def _hold(self, breaker: CircuitBreaker, until: float) -> None:
        """The host's deliveries wait until ``until`` (one outbox write per change)."""
        if breaker.retimed != until:
            breaker.retimed = until
            self.outbox.retime(breaker.host, until)

    async def _sleep(self, seconds: float | None) -> None:
        """Until woken (a new delivery, a settled one) or ``seconds`` pass (a retry is due)."""
        limit = _MAX_WAIT_S if seconds is None else min(max(seconds, 0.0), _MAX_WAIT_S)
        try:
            async with asyncio.timeout(limit):
                await self._wake.wait()
        except TimeoutError:
            pass

    def _spawn(self, delivery: Delivery, breaker: CircuitBreaker) -> None:
        self._inflight.add(delivery.job_id)
        # Taken now, not in the task: the next delivery of this pass must see the probe.
        round_, probe = breaker.started(time.time(), self.config.timeout_s)
        task = asyncio.create_task(
            self._deliver(delivery, breaker, round_, probe), name=f"callback:{delivery.job_id}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- one delivery --------------------------------------------------------------------

    async def _deliver(
        self, delivery: Delivery, breaker: CircuitBreaker, round_: int, probe: bool
    ) -> None:
        try:
            body = await self.outbox.body(delivery.job_id)
            if body is None:
                breaker.probing = breaker.probing and not probe
                self._settle(delivery, "failed", delivery.attempts, RESULT_GONE)
                return
            attempts = delivery.attempts + 1
            self.stats["attempts"] += 1
            error, final = await self._post(delivery, body, attempts)
            now = time.time()
            if error is None or final:
                if breaker.answered():
                    self._hold(breaker, now)  # the held deliveries go now
                self._settle(delivery, "delivered" if error is None else "failed", attempts, error)
                return
            breaker.failed(round_, probe, error, now, self._backoff)
            if breaker.open_at > delivery.created_at + self.config.retry_for_s:
                self._settle(delivery, "failed", attempts, error)
            else:
                self.stats["retried"] += 1
                self._settle(delivery, "pending", attempts, error, breaker.open_at)
            self._hold(breaker, breaker.open_at)
        finally:
            self._inflight.discard(delivery.job_id)
            self._wake.set()

    def _settle(
        self, d: Delivery, state: str, attempts: int, error: str | None, next_at: float = 0.0
    ) -> None:
        if state != "pending":
            self.stats[state] += 1
            level = logging.DEBUG if state == "delivered" else logging.WARNING
            log.log(
                level,
                "callback of job %s to %s %s after %d attempts (%s)",
                d.job_id,
                d.url,
                state,
                attempts,
                error or "ok",
            )
        self.outbox.settle(d.job_id, state=state, attempts=attempts, next_at=next_at, error=error)

    async def _post(self, d: Delivery, body: bytes, attempt: int) -> tuple[str | None, bool]:
        """(error or None, whether the error is final) of one attempt."""
        assert self._session is not None
        headers = {
            "Content-Type": "application/json",
            SIGNATURE_HEADER: sign(self._secret, body),
            "X-Prorl-Job-Id": d.job_id,
            "X-Prorl-Attempt": str(attempt),
        }
        try:
            async with asyncio.timeout(self.config.timeout_s):
                async with self._session.post(
                    d.url, data=body, headers=headers, allow_redirects=False
                ) as resp:
                    await resp.content.read(65536)  # let the connection be reused
                    status = resp.status
        except TimeoutError:
            return f"no answer within {self.config.timeout_s:g} s", False
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            return f"{type(exc).__name__}: {exc}"[:500], False
        if 200 <= status < 300:
            return None, False
        return f"HTTP {status}", status == 410

    def _backoff(self, attempts: int) -> float:
        cfg = self.config
        step = min(cfg.backoff_s * 2.0 ** (attempts - 1), cfg.max_backoff_s)
        return step * (0.5 + self._rng.random() / 2)

    def summary(self) -> dict[str, Any]:
        """Pending deliveries (durable), those in flight, and this process's attempts,
        deliveries, retries scheduled and failures."""
        return {**self.outbox.counts(), "inflight": self.inflight, **self.stats}
