"""A job: one rollout moving through INIT -> RUN -> EVAL."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from prorl_async.schemas import ErrorInfo, ProcessRequest, Stage
from prorl_async.stages.scope import StageScope
from prorl_async.tenancy.config import DEFAULT_TENANT
from prorl_async.util.timer import PausableTimer

if TYPE_CHECKING:
    from contextlib import AbstractAsyncContextManager

    from prorl_async.core.shared import Shared

__all__ = ["EVAL", "INIT", "RUN", "TERMINAL", "Job", "Stage", "TaskHandler", "TrajectoryLike"]

T = TypeVar("T")


def _always() -> bool:
    return True


TERMINAL = frozenset({"done", "failed", "cancelled", "timed_out"})
# The stages for per-job code: an enum member looked up on its class (``Stage.INIT``)
# costs ~1,000 instructions more than a module global in CPython 3.11.
INIT, RUN, EVAL = Stage.INIT, Stage.RUN, Stage.EVAL
_QUEUED = {s: f"queued_{s._value_}" for s in Stage}


class TrajectoryLike(Protocol):
    """What a handler's trajectory must offer for the result document."""

    def to_result(self) -> dict[str, Any]: ...


class TaskHandler(Protocol):
    """What the pipeline asks of a job's handler (``core.handler.AgentHandler`` is the
    interface task plugins implement; declared here so ``job`` need not import it)."""

    name: ClassVar[str]

    async def init(self, job: Job) -> None: ...
    async def run(self, job: Job) -> None: ...
    async def eval(self, job: Job) -> None: ...
    def init_exception(self, job: Job, exc: BaseException) -> None: ...
    def run_exception(self, job: Job, exc: BaseException) -> None: ...
    def eval_exception(self, job: Job, exc: BaseException) -> None: ...
    def final_result(self, job: Job) -> dict[str, Any]: ...


class Job:
    """Mutable state of one rollout. Handlers read ``instance`` and write ``reward``,
    ``eval``, ``trajectory`` and ``state``; the pipeline owns everything else."""

    # Slots: CPython 3.11 shares an instance dict's keys only up to 30 attributes; past
    # that each job's dict was grown and rehashed while ``__init__`` filled it (measured
    # with callgrind: ~11k instructions a job). Per-handler data goes in ``state``.
    __slots__ = (
        "id",
        "task",
        "handler",
        "instance",
        "sampling_params",
        "metadata",
        "shared",
        "status",
        "timer",
        "reward",
        "eval",
        "trajectory",
        "state",
        "error",
        "result",
        "request",
        "restarts",
        "tenant",
        "seq",
        "callback_url",
        "cancel_requested",
        "stage_task",
        "scope",
        "stage_cancels",
        "stage_done",
        "stage_active",
        "stage_wall",
        "queued_s",
        "submitted_at",
        "finished_at",
        "_queued_since",
        "queue_stage",
        "_resources",
        "_live",
        "_waiters",
    )

    def __init__(
        self,
        *,
        job_id: str,
        task: str,
        handler: TaskHandler,
        instance: Any,
        sampling_params: dict[str, Any],
        timeout_s: float,
        metadata: dict[str, Any],
        shared: Shared,
    ) -> None:
        self.id = job_id
        self.task = task
        self.handler = handler
        self.instance = instance
        self.sampling_params = sampling_params
        self.metadata = metadata
        self.shared = shared
        self.status = "queued_init"
        self.timer = PausableTimer(timeout_s)
        self.reward: float | None = None
        self.eval: dict[str, Any] = {}
        self.trajectory: TrajectoryLike | None = None
        self.state: dict[str, Any] = {}
        self.error: ErrorInfo | None = None
        self.result: bytes | None = None
        # The accepted request (a durable store writes it so a restart can run it again).
        self.request: ProcessRequest | None = None
        # How many server restarts this job went through (requeued each time).
        self.restarts = 0
        # Whose job it is (tenancy), its place in the result log once it ended, and
        # where its result is POSTed (the request's callback_url).
        self.tenant = DEFAULT_TENANT
        self.seq: int | None = None
        self.callback_url: str | None = None
        self.cancel_requested = False
        # The worker task running the job's stage now; a cancel cancels it (counted in
        # stage_cancels, which the worker takes back) and waits for stage_done.
        self.stage_task: asyncio.Task[Any] | None = None
        # The stage the job is in while a stage runs (None between stages): handed to
        # what takes a shared resource for the job (``Runtime.start(spec, job.scope)``).
        self.scope: StageScope | None = None
        self.stage_cancels = 0
        self.stage_done: asyncio.Future[None] | None = None
        self.stage_active: dict[Stage, float] = {}
        self.stage_wall: dict[Stage, float] = {}
        self.queued_s = 0.0
        self.submitted_at = time.monotonic()
        self.finished_at = 0.0
        self._queued_since: float | None = time.monotonic()
        self.queue_stage: Stage | None = None
        self._resources: AsyncExitStack | None = None
        # For each thing held: whether it runs anything now (see ``hold``).
        self._live: list[Callable[[], bool]] | None = None
        self._waiters: list[asyncio.Event] | None = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    # -- resources -------------------------------------------------------------------------

    async def hold(
        self, cm: AbstractAsyncContextManager[T], *, live: Callable[[], bool] | None = None
    ) -> T:
        """Enter ``cm`` (a sandbox, a kernel...) and keep it until the job releases it.

        Whatever a job holds is released right after RUN (before EVAL), after a
        failed stage, and on cancel or timeout. ``live`` says whether ``cm`` runs
        anything now (default: it does once held); a sandbox started on first use passes
        its own, so that the job's waits count as idle sandbox time only once it runs.
        """
        if self._resources is None:
            self._resources = AsyncExitStack()
        entered = await self._resources.enter_async_context(cm)
        if self._live is None:
            self._live = []
        self._live.append(_always if live is None else live)
        return entered

    @property
    def holds_resources(self) -> bool:
        """Whether the job holds anything (to release after RUN or on failure)."""
        return self._resources is not None

    @property
    def holds_live(self) -> bool:
        """Whether something the job holds runs now: its waits are idle sandbox-seconds
        (a sandbox started on first use does not before that use)."""
        live = self._live
        return live is not None and any(is_live() for is_live in live)

    async def release(self) -> None:
        """Close everything the job holds, last acquired first. Idempotent."""
        stack, self._resources = self._resources, None
        self._live = None
        if stack is not None:
            await stack.aclose()

    # -- queue time ------------------------------------------------------------------------

    def enter_queue(self, stage: Stage) -> None:
        self.status = _QUEUED[stage]
        self._queued_since = time.monotonic()

    def leave_queue(self) -> None:
        if self._queued_since is not None:
            self.queued_s += time.monotonic() - self._queued_since
            self._queued_since = None

    # -- completion waiters ----------------------------------------------------------------

    def add_waiter(self, event: asyncio.Event) -> None:
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(event)

    def remove_waiter(self, event: asyncio.Event) -> None:
        if self._waiters is not None:
            try:
                self._waiters.remove(event)
            except ValueError:
                pass

    def wake_waiters(self) -> None:
        waiters, self._waiters = self._waiters, None
        for event in waiters or ():
            event.set()
