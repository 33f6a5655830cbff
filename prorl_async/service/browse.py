"""What the web pages (``api/ui``) read of the service: results newest first across the
tenants a viewer may see, one result with its owner checked, and token texts.

The pages follow the API's tenant rules with one difference the issue asks for: an admin
sees every tenant's jobs (the API shows an admin only its own).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Protocol

from prorl_async.core.errors import NotFound
from prorl_async.core.jobstore import JobStore
from prorl_async.core.resultlog import LogEntry
from prorl_async.core.shared import Shared
from prorl_async.llm.weights import WeightUpdates
from prorl_async.schemas import JobStatusResponse
from prorl_async.tenancy import Tenant, Tenants

__all__ = ["Browsable", "Listed", "ResultBrowser"]


class Browsable(Protocol):
    """The parts of ``RolloutService`` the browser reads."""

    store: JobStore
    shared: Shared
    tenants: Tenants


# One row of a listing: the tenant that owns it and its log entry.
Listed = tuple[str, LogEntry]


class ResultBrowser:
    """Read-only views of results for the web pages, each under a viewer's rights."""

    def __init__(self, svc: Browsable) -> None:
        self._svc = svc

    def visible_tenants(self, viewer: Tenant) -> list[str]:
        """The tenants whose jobs ``viewer`` sees: all for an admin, else its own."""
        if not viewer.admin:
            return [viewer.name]
        names = [*self._svc.tenants.names(), *self._svc.store.log.tenants()]
        return sorted(dict.fromkeys(names))

    def recent(
        self, viewer: Tenant, before: int | None, limit: int, tenant: str | None = None
    ) -> list[Listed]:
        """Up to ``limit`` results with seq < ``before`` (None: the newest), newest first,
        of the tenants ``viewer`` sees (``tenant``: only that one of them)."""
        names = self.visible_tenants(viewer)
        if tenant is not None:
            names = [n for n in names if n == tenant]
        log = self._svc.store.log
        runs = [[(name, e) for e in log.before(name, before, limit)] for name in names]
        merged = heapq.merge(*runs, key=lambda row: -row[1].seq)
        return [row for _, row in zip(range(limit), merged, strict=False)]

    async def documents(self, job_ids: Sequence[str]) -> dict[str, bytes]:
        """The result documents of those of ``job_ids`` still held."""
        return await self._svc.store.results(job_ids)

    def owner(self, job_id: str, viewer: Tenant) -> str:
        """The tenant of ``job_id``; ``NotFound`` if unknown or not ``viewer``'s to see."""
        store = self._svc.store
        owner = store.tenant_of(job_id)
        if store.status(job_id) is None or owner is None:
            raise NotFound(f"job_id: unknown job {job_id!r}")
        if not viewer.admin and owner != viewer.name:
            raise NotFound(f"job_id: unknown job {job_id!r}")
        return owner

    async def result(self, job_id: str, viewer: Tenant) -> bytes | JobStatusResponse:
        """The job's result document, or its status while it runs (``owner`` rules)."""
        self.owner(job_id, viewer)
        body = (await self._svc.store.results([job_id])).get(job_id)
        if body is not None:
            return body
        status = self._svc.store.status(job_id)
        if status is None:
            raise NotFound(f"job_id: unknown job {job_id!r}")
        return JobStatusResponse(job_id=job_id, status=status)

    def token_texts(self, ids: Sequence[int]) -> list[str] | None:
        """Each token's text with the server's tokenizer (None before it is loaded)."""
        tok = self._svc.shared.tokenizer
        return None if tok is None else tok.token_texts(ids)

    def decode(self, ids: Sequence[int]) -> str | None:
        """``ids`` as text, special tokens kept (None before the tokenizer is loaded)."""
        tok = self._svc.shared.tokenizer
        return None if tok is None else tok.decode(ids)

    def weights(self) -> WeightUpdates | None:
        """The engines' weight state (None while the backend pool is not running)."""
        pool = self._svc.shared.pool
        return None if pool is None else pool.weights
