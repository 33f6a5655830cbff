"""Who a request is (bearer token -> tenant), and what each tenant has in flight.

Without any token every request is the admin tenant ``default``. The single token
(``PRORL_TOKEN``, ``--token-file``) is the admin tenant ``default`` beside those of a
tokens file. In-flight counts (queued + running) back the ``max_inflight`` quotas;
the pipeline reports each job's start and end (``job_added``, ``job_ended``).
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from prorl_async.tenancy.config import DEFAULT_TENANT, TenantConfig

__all__ = ["Tenant", "Tenants"]

_BEARER = b"Bearer "


@dataclass(frozen=True, slots=True)
class Tenant:
    """A tenant as requests see it."""

    name: str
    admin: bool = False
    weight: float = 1.0
    max_inflight: int | None = None


class _TenantJob(Protocol):
    @property
    def tenant(self) -> str: ...
    @property
    def status(self) -> str: ...


class Tenants:
    """The configured tenants, token lookup, quotas and per-tenant job counts."""

    def __init__(
        self, tenants: Mapping[str, TenantConfig], single_token: str | None = None
    ) -> None:
        self.auth_required = bool(tenants) or bool(single_token)
        self.by_name: dict[str, Tenant] = {}
        # Keyed by the token's SHA-256: a lookup's timing says nothing usable about a token.
        self._by_digest: dict[bytes, Tenant] = {}
        if single_token or not tenants:
            self._add(Tenant(DEFAULT_TENANT, admin=True), single_token)
        for name, cfg in tenants.items():
            tenant = Tenant(name, cfg.admin, cfg.weight, cfg.max_inflight)
            self._add(tenant, cfg.token)
        self.inflight: Counter[str] = Counter()
        self.ended: defaultdict[str, Counter[str]] = defaultdict(Counter)

    def _add(self, tenant: Tenant, token: str | None) -> None:
        self.by_name[tenant.name] = tenant
        if token:
            self._by_digest[_digest(token.encode())] = tenant

    # -- identity ------------------------------------------------------------------------

    def authenticate(self, authorization: str) -> Tenant | None:
        """The tenant of an ``Authorization`` header value, or None (answer 401)."""
        if not self.auth_required:
            return self.by_name[DEFAULT_TENANT]
        # Undecodable header bytes arrive as surrogates; they must fail, not raise.
        raw = authorization.encode("utf-8", "surrogateescape")
        if not raw.startswith(_BEARER):
            return None
        return self._by_digest.get(_digest(raw[len(_BEARER) :]))

    def get(self, name: str) -> Tenant:
        """A tenant by name; one no longer configured (its jobs outlived a restart) is plain."""
        return self.by_name.get(name) or Tenant(name)

    def weight(self, name: str) -> float:
        tenant = self.by_name.get(name)
        return 1.0 if tenant is None else tenant.weight

    def load(self, name: str) -> int:
        """Jobs of ``name`` queued or running (the fair-share queue's ``Shares``)."""
        return self.inflight[name]

    # -- quotas and counts ---------------------------------------------------------------

    def over_quota(self, name: str, count: int) -> str | None:
        """Why ``count`` more jobs of tenant ``name`` would pass its ``max_inflight``, or None."""
        quota = self.get(name).max_inflight
        have = self.inflight[name]
        if quota is None or have + count <= quota:
            return None
        return (
            f"tenant {name!r} has {have} jobs queued or running; {count} more would pass "
            f"its max_inflight={quota}"
        )

    def job_added(self, job: _TenantJob) -> None:
        self.inflight[job.tenant] += 1

    def job_ended(self, job: _TenantJob) -> None:
        self.inflight[job.tenant] -= 1
        self.ended[job.tenant][job.status] += 1

    def job_withdrawn(self, job: _TenantJob) -> None:
        """A job taken back before its admission was acknowledged: never counted as ended."""
        self.inflight[job.tenant] -= 1

    def names(self) -> list[str]:
        """Configured tenants and any other that has had jobs here."""
        return list(dict.fromkeys([*self.by_name, *self.inflight, *self.ended]))


def _digest(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()
