"""Wire types (API.md): request bodies, responses and the result document."""

from __future__ import annotations

import enum
from typing import Annotated, Any, Literal

import msgspec

__all__ = [
    "AddLLMServerRequest",
    "BatchRequest",
    "BatchResponse",
    "BudgetInfo",
    "CallbackInfo",
    "CallbacksInfo",
    "CancelRequest",
    "CancelResponse",
    "ErrorInfo",
    "EventsInfo",
    "JobEvent",
    "JobStatusResponse",
    "PollRequest",
    "PollResponse",
    "Problem",
    "ProcessRequest",
    "RemoveLLMServerRequest",
    "WeightsLoadRequest",
    "WeightsPauseRequest",
    "WeightsResumeRequest",
    "StoreInfo",
    "ResultDoc",
    "ResultsResponse",
    "TenantInfo",
    "StagePoolInfo",
    "Stage",
    "StatusResponse",
    "Timing",
    "WorkersRequest",
]


class Stage(enum.StrEnum):
    """The three stages a job passes; their names key ``/status``, ``/workers`` and
    ``error.stage``."""

    INIT = "init"
    RUN = "run"
    EVAL = "eval"


JobId = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=200,
        pattern=r"^[A-Za-z0-9._:@+=-]+$",
        description="client-chosen id: letters, digits and ._:@+=-",
    ),
]
Seconds = Annotated[float, msgspec.Meta(ge=0)]


class ProcessRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Body of ``POST /process``; one element of ``POST /process/batch``."""

    task: Annotated[str, msgspec.Meta(min_length=1)]
    instance: dict[str, Any] = msgspec.field(default_factory=dict)
    sampling_params: dict[str, Any] = msgspec.field(default_factory=dict)
    job_id: JobId | None = None
    timeout_s: Annotated[float, msgspec.Meta(gt=0)] | None = None
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    # POST the result document here when the job ends (host in [callbacks] allow_hosts).
    callback_url: Annotated[str, msgspec.Meta(min_length=1, max_length=2048)] | None = None


class BatchRequest(msgspec.Struct, forbid_unknown_fields=True):
    jobs: list[ProcessRequest]


class PollRequest(msgspec.Struct, forbid_unknown_fields=True):
    job_ids: list[str]
    wait: Seconds = 0.0


class CancelRequest(msgspec.Struct, forbid_unknown_fields=True):
    job_id: str | None = None
    job_ids: list[str] | None = None


class AddLLMServerRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    address: Annotated[str, msgspec.Meta(min_length=1)]
    weight_version: int | str | None = None
    max_inflight: Annotated[int, msgspec.Meta(ge=1)] | None = None
    api: Literal["vllm", "sglang"] = "vllm"
    weight: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    model: str | None = None


class RemoveLLMServerRequest(msgspec.Struct, forbid_unknown_fields=True):
    address: str


PauseMode = Literal["abort", "keep", "wait"]


class WeightsPauseRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST /weights/pause``: stop generating on these backends (default: all)."""

    mode: PauseMode = "abort"
    backends: list[str] | None = None


class WeightsResumeRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST /weights/resume``: tokens from now on carry ``version``."""

    version: int | str | None = None
    backends: list[str] | None = None


class WeightsLoadRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST /weights/load``: pause, load the checkpoint directory ``path`` on every
    engine in place, resume with ``version``."""

    version: int | str
    path: Annotated[str, msgspec.Meta(min_length=1)]
    mode: PauseMode = "abort"


class SubmitResponse(msgspec.Struct, frozen=True):
    job_id: str
    status: str


class BatchResponse(msgspec.Struct, frozen=True):
    job_ids: list[str]


class JobStatusResponse(msgspec.Struct, frozen=True):
    job_id: str
    status: str


class ErrorInfo(msgspec.Struct, frozen=True):
    stage: Literal["init", "run", "eval"]
    type: str
    message: str


class Timing(msgspec.Struct, frozen=True):
    queued_s: float
    init_s: float
    run_s: float
    eval_s: float
    active_s: float
    backend_wait_s: float = 0.0
    total_s: float = 0.0
    # When the job ended, wall clock (Unix seconds).
    ended_at: float = 0.0


class ResultDoc(msgspec.Struct, frozen=True, kw_only=True):
    """The result document of a terminal job (API.md)."""

    job_id: str
    task: str
    status: str
    reward: float | None
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float]
    num_turns: int
    turns: list[dict[str, Any]]
    weight_versions: list[int | str]
    error: ErrorInfo | None
    timing: Timing
    eval: dict[str, Any]
    metadata: dict[str, Any]
    # Server restarts the job went through before it finished (API.md "Durability").
    restarts: int = 0
    # Its place in the result log (API.md "Results").
    seq: int | None = None
    # One per response_ids entry: the weight version that made it (None: observation).
    response_versions: list[int | str | None] = []


class PollResponse(msgspec.Struct, frozen=True):
    done: list[msgspec.Raw]
    pending: list[str]
    unknown: list[str]


class CancelResponse(msgspec.Struct, frozen=True):
    cancelled: list[str]
    already_finished: list[str]
    not_found: list[str]


class BackendInfo(msgspec.Struct, frozen=True):
    address: str
    inflight: int
    assigned: int
    healthy: bool
    weight_version: int | str | None
    # The engine's context window, read from its /v1/models at registration.
    max_model_len: int | None = None


# Each worker is a task: a bound keeps one resize from stalling the loop (10k: ~50 ms).
_Workers = Annotated[int, msgspec.Meta(ge=1, le=10_000)]


class WorkersRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST /workers``: new concurrency for any subset of the stages."""

    init: _Workers | None = None
    run: _Workers | None = None
    eval: _Workers | None = None


class StagePoolInfo(msgspec.Struct, frozen=True):
    """One stage's workers: the configured size, workers alive (a shrink lets busy ones
    finish first, so ``live`` may exceed it for a while), and those inside a job."""

    configured: int
    live: int
    busy: int


class BudgetInfo(msgspec.Struct, frozen=True):
    """The sandbox budget: ``max`` live sandboxes; ``waiting`` starts queued for a slot."""

    max: int | None
    live: int
    waiting: int
    peak: int
    wait_seconds: float
    warm_ready: int = 0


class StoreInfo(msgspec.Struct, frozen=True):
    """The job store: ``sqlite`` (durable) or ``memory``; its size and cached results."""

    kind: str
    rows: int
    bytes: int
    cache_bytes: int
    # The state dir's free bytes (sampled every second; null for the memory store).
    free_bytes: int | None = None
    # Commits the storage refused or that failed, and a writer process lost.
    errors: int = 0
    # Why the store cannot commit now (the disk, the writer), or null.
    problem: str | None = None


class TenantInfo(msgspec.Struct, frozen=True):
    """One tenant in ``/status``: its jobs by stage, in flight (against its quota), ended."""

    queues: dict[str, int]
    active: dict[str, int]
    inflight: int
    max_inflight: int | None
    weight: float
    admin: bool
    jobs: dict[str, int]
    last_seq: int


class CallbacksInfo(msgspec.Struct, frozen=True):
    """Callback deliveries: ``pending`` in the outbox (durable), ``inflight`` now, and
    since this process started: attempts, deliveries, retries scheduled, failures."""

    enabled: bool
    pending: int
    inflight: int
    attempts: int
    delivered: int
    retried: int
    failed: int


class CallbackInfo(msgspec.Struct, frozen=True, kw_only=True):
    """``GET /jobs/{job_id}/callback``: the delivery of one job's result."""

    job_id: str
    url: str
    state: Literal["pending", "delivered", "failed"]
    attempts: int
    last_error: str | None
    # Wall clock (Unix seconds) of the next attempt while pending.
    next_attempt_at: float | None = None


class EventsInfo(msgspec.Struct, frozen=True):
    """``GET /events`` streams open now, and those cut for not reading."""

    streams: int
    dropped: int


class JobEvent(msgspec.Struct, frozen=True, kw_only=True):
    """The ``data`` of one ``GET /events`` event (``event: job``, ``id:`` its seq)."""

    job_id: str
    status: str
    reward: float | None
    seq: int
    tenant: str


class ResultsResponse(msgspec.Struct, frozen=True):
    """``GET /results``: result documents after the cursor in seq order; ``next`` is the
    cursor to read on from; ``epoch`` changes when the numbering starts over."""

    results: list[msgspec.Raw]
    next: int
    epoch: str


class StatusResponse(msgspec.Struct, frozen=True):
    state: Literal["running", "stopped"]
    queues: dict[str, int]
    active: dict[str, int]
    workers: dict[str, int]
    jobs: dict[str, int]
    sandboxes: int
    poll_waiters: int
    backends: list[BackendInfo]
    backend_waiting: int = 0
    # Job records in the store (live + retained results); bounded by retention.
    records: int = 0
    pools: dict[str, StagePoolInfo] = {}
    sandbox_budget: BudgetInfo | None = None
    # Seconds sandboxes spent alive but waiting: in a stage's queue, inside a stage for an
    # LLM backend (timer paused), or warm and unused ("warm").
    idle_sandbox_seconds: dict[str, float] = {}
    # INIT workers holding a job until RUN will take it soon (just-in-time INIT).
    jit_waiting: int = 0
    autoscale: bool = False
    store: StoreInfo | None = None
    # How each sandbox limit is enforced here, and as which user sandboxed code runs.
    sandbox_enforcement: dict[str, str] = {}
    # The result log: this tenant's last committed seq, and the numbering's epoch.
    last_seq: int = 0
    epoch: str = ""
    # Per tenant (a non-admin sees only its own): queues, in flight, completions.
    tenants: dict[str, TenantInfo] = {}
    callbacks: CallbacksInfo | None = None
    events: EventsInfo | None = None


class Problem(msgspec.Struct, frozen=True):
    type: str
    title: str
    status: int
    detail: str
