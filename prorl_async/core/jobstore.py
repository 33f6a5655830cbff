"""The job-store interface the pipeline, the service and the routes use (here, beside
the pipeline; ``store/`` implements it in memory and in SQLite)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import msgspec

from prorl_async.core.errors import ProblemError
from prorl_async.core.job import Job
from prorl_async.core.resultlog import ResultLog
from prorl_async.notify.sender import Outbox
from prorl_async.schemas import StoreInfo
from prorl_async.tenancy.config import DEFAULT_TENANT

# What ``/status`` and ``/metrics`` report about the store.
StoreStats = StoreInfo

__all__ = ["JobStore", "StoreStats", "StoreUnavailable", "UnfinishedRecord"]


class StoreUnavailable(ProblemError):
    """The store cannot commit now: its storage refuses writes (``cause`` "storage": 507,
    a full or failing disk) or its writer has not committed for ``commit_timeout_s``
    (``cause`` "writer": 503). What was written stays queued and is committed once it
    can be; nothing the store answered for is lost. ``detail`` names the state dir, its
    free space, or the writer process; the answer carries ``Retry-After``."""

    def __init__(self, cause: str, detail: str, *, retry_after: float = 5.0) -> None:
        super().__init__(detail, headers={"Retry-After": str(max(1, round(retry_after)))})
        self.cause = cause
        if cause == "storage":
            self.status, self.title = 507, "Insufficient Storage"
        else:
            self.status, self.title = 503, "Service Unavailable"
        self.extra = {"cause": cause}


class UnfinishedRecord(msgspec.Struct, frozen=True):
    """A job accepted by an earlier server process that never reached a terminal state."""

    job_id: str
    request: bytes
    restarts: int
    tenant: str = DEFAULT_TENANT


class JobStore(Protocol):
    """Live jobs, terminal result documents for the retention time, cancelled-id tombstones.

    ``get`` returns a live ``Job`` (a store may also return terminal ones); ``status``
    answers for every id the store knows, live or terminal; ``results`` gives the result
    documents of those of the ids that are terminal (reading them from disk, if a store
    must, off the event loop). ``log`` is the result log (``core.resultlog``): a
    store commits each terminal job's entry once its result is durable; ``outbox``
    keeps the callbacks to deliver (written with the result); ``tenant_of`` and
    ``seq_of`` answer for every id the store knows.

    ``sync`` waits for what was written so far to be durable, at most ``commit_timeout_s``;
    it raises ``StoreUnavailable`` when the store cannot commit (``problem`` says so
    beforehand, as ``/healthz`` and submits ask); ``check`` (every second, off the
    request path) samples the state dir's free space and makes an idle writer show
    that it still answers.
    """

    kind: str

    @property
    def log(self) -> ResultLog: ...
    @property
    def outbox(self) -> Outbox: ...

    def open(self) -> list[UnfinishedRecord]: ...
    def get(self, job_id: str) -> Job | None: ...
    def status(self, job_id: str) -> str | None: ...
    def tenant_of(self, job_id: str) -> str | None: ...
    def seq_of(self, job_id: str) -> int | None: ...
    async def results(
        self, job_ids: Sequence[str], *, partial: bool = False
    ) -> dict[str, bytes]: ...
    def add(self, job: Job) -> None: ...
    def finished(self, job: Job) -> None: ...
    def delete(self, job_id: str) -> bool: ...
    def tombstone(self, job_id: str) -> None: ...
    def is_tombstoned(self, job_id: str) -> bool: ...
    def unfinished(self) -> list[Job]: ...
    def unfinished_count(self) -> int: ...
    def __len__(self) -> int: ...
    def expire(self, now: float | None = None, limit: int | None = None) -> int: ...
    def counts(self) -> dict[str, int]: ...
    def stats(self) -> StoreStats: ...
    def freeze(self) -> None: ...
    def flush(self) -> None: ...
    async def sync(self) -> None: ...
    def problem(self) -> StoreUnavailable | None: ...
    async def check(self) -> None: ...
    async def committing(self, timeout: float) -> None: ...
    async def aclose(self) -> None: ...
