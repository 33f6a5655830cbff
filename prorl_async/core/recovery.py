"""Start-up after a crash: what to do with the jobs a dead server accepted and never finished.

``requeue`` (the default) puts each back in the INIT queue under the same id, its
``restarts`` count one higher; ``fail`` finishes each as ``failed`` with
``error.type`` ``ServerRestart``. Either way every accepted id keeps answering.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from prorl_async.core.errors import Unprocessable
from prorl_async.core.handler import AgentHandler
from prorl_async.core.job import Job
from prorl_async.core.jobstore import UnfinishedRecord
from prorl_async.schemas import ErrorInfo, ProcessRequest

if TYPE_CHECKING:
    from prorl_async.config import ServerConfig
    from prorl_async.core.pipeline import Pipeline

__all__ = ["Admission", "recover"]

log = logging.getLogger(__name__)


class Admission(Protocol):
    """What recovery needs of the service (``RolloutService``): its config, its pipeline,
    and admitting a stored request again as a submit would."""

    @property
    def config(self) -> ServerConfig: ...
    @property
    def pipeline(self) -> Pipeline: ...
    def prepare(self, req: ProcessRequest) -> tuple[AgentHandler, Any]: ...
    def build_job(
        self, req: ProcessRequest, handler: AgentHandler, instance: Any, job_id: str
    ) -> Job: ...


_decoder = msgspec.json.Decoder(ProcessRequest)


class _Unrunnable(AgentHandler):
    """Stands in for a handler that is no longer registered: its job is failed, never run."""

    async def run(self, job: Job) -> None:
        raise RuntimeError("task is not registered")


def recover(service: Admission, records: list[UnfinishedRecord]) -> None:
    """Requeue or fail every unfinished job of an earlier process, per ``on_restart``."""
    if not records:
        return
    mode = service.config.on_restart
    for rec in records:
        _recover_one(service, rec, mode)
    log.warning("%d unfinished jobs of a previous run: %s", len(records), _verb(mode))


def _verb(mode: str) -> str:
    return "requeued in INIT" if mode == "requeue" else "failed with ServerRestart"


def _recover_one(service: Admission, rec: UnfinishedRecord, mode: str) -> None:
    req, problem = _decode(rec)
    handler: AgentHandler = _Unrunnable()
    instance: Any = None
    if req is not None:
        try:
            handler, instance = service.prepare(req)
        except Unprocessable as exc:
            problem = f"request no longer accepted after restart: {exc.detail}"
    job = _job(service, rec, req, handler, instance)
    if mode == "requeue" and problem is None:
        service.pipeline.submit(job)
        return
    message = problem or "the server restarted while the job was unfinished (on_restart=fail)"
    service.pipeline.fail_now(job, ErrorInfo("init", "ServerRestart", message))


def _decode(rec: UnfinishedRecord) -> tuple[ProcessRequest | None, str | None]:
    try:
        return _decoder.decode(rec.request), None
    except msgspec.DecodeError as exc:
        return None, f"stored request unreadable after restart: {exc}"


def _job(
    service: Admission,
    rec: UnfinishedRecord,
    req: ProcessRequest | None,
    handler: AgentHandler,
    instance: Any,
) -> Job:
    req = req if req is not None else ProcessRequest(task="unknown")
    job = service.build_job(req, handler, instance, rec.job_id)
    job.restarts = rec.restarts + 1
    job.tenant = rec.tenant
    return job
