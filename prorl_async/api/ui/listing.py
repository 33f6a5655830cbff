"""Rows of result listings (the dashboard's recent results, ``/ui/results``): a summary
of each result document, decoded once and kept while it is recent, and the filters."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence

import msgspec

from prorl_async.core.errors import BadRequest
from prorl_async.service.browse import Listed, ResultBrowser
from prorl_async.tenancy import Tenant

__all__ = ["Filters", "Row", "Rows", "STATUSES"]

STATUSES = ("done", "failed", "cancelled", "timed_out")
_CACHED = 4096
_BATCH = 200
# At most this many results are looked at for one page of a filtered listing.
SCAN_LIMIT = 5000


class _Timing(msgspec.Struct):
    total_s: float = 0.0
    ended_at: float = 0.0


class _Summary(msgspec.Struct):
    """The few fields of a result document a listing shows (the rest is skipped)."""

    job_id: str
    task: str = ""
    status: str = ""
    reward: float | None = None
    num_turns: int = 0
    timing: _Timing | None = None


class Row(msgspec.Struct, frozen=True):
    """One result in a listing (also the dashboard's live JSON)."""

    job_id: str
    tenant: str
    seq: int
    task: str
    status: str
    reward: float | None
    turns: int
    duration_s: float
    ended_at: float


_decoder = msgspec.json.Decoder(_Summary)


class Filters(msgspec.Struct, frozen=True):
    """The listing's query: each field narrows it (None: any)."""

    task: str | None = None
    status: str | None = None
    tenant: str | None = None
    min_reward: float | None = None
    max_reward: float | None = None

    @classmethod
    def parse(cls, query: dict[str, str], viewer: Tenant) -> Filters:
        status = query.get("status") or None
        if status is not None and status not in STATUSES:
            raise BadRequest(f"status: one of {', '.join(STATUSES)}, got {status!r}")
        tenant = (query.get("tenant") or None) if viewer.admin else None
        return cls(
            task=query.get("task") or None,
            status=status,
            tenant=tenant,
            min_reward=_number(query, "min_reward"),
            max_reward=_number(query, "max_reward"),
        )

    def cheap(self, status: str, reward: float | None) -> bool:
        """What the log entry alone decides (the task needs the document)."""
        if self.status is not None and status != self.status:
            return False
        if self.min_reward is not None and (reward is None or reward < self.min_reward):
            return False
        return not (self.max_reward is not None and (reward is None or reward > self.max_reward))


def _number(query: dict[str, str], name: str) -> float | None:
    raw = query.get(name)
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise BadRequest(f"{name}: expected a number, got {raw!r}")
    return value


class Rows:
    """Summaries of results by (job id, seq), decoded once, the latest ``_CACHED`` kept."""

    def __init__(self, browser: ResultBrowser) -> None:
        self.browser = browser
        self._cache: OrderedDict[tuple[str, int], Row] = OrderedDict()

    async def rows(self, listed: Sequence[Listed]) -> list[Row]:
        """The rows of ``listed`` still held, in its order."""
        missing = [e.job_id for _, e in listed if (e.job_id, e.seq) not in self._cache]
        bodies = await self.browser.documents(missing) if missing else {}
        out = []
        for tenant, entry in listed:
            key = (entry.job_id, entry.seq)
            row = self._cache.get(key)
            if row is None and entry.job_id in bodies:
                row = self._summary(tenant, entry.seq, bodies[entry.job_id])
                self._cache[key] = row
                if len(self._cache) > _CACHED:
                    self._cache.popitem(last=False)
            if row is not None:
                out.append(row)
        return out

    def _summary(self, tenant: str, seq: int, body: bytes) -> Row:
        s = _decoder.decode(body)
        timing = s.timing or _Timing()
        return Row(
            job_id=s.job_id,
            tenant=tenant,
            seq=seq,
            task=s.task,
            status=s.status,
            reward=s.reward,
            turns=s.num_turns,
            duration_s=round(timing.total_s, 3),
            ended_at=timing.ended_at,
        )

    async def page(
        self, viewer: Tenant, filters: Filters, before: int | None, size: int
    ) -> tuple[list[Row], int | None]:
        """Up to ``size`` rows matching ``filters`` with seq < ``before``, newest first, and
        the cursor of the next page (None: nothing older)."""
        found: list[Row] = []
        cursor, scanned = before, 0
        while scanned < SCAN_LIMIT:
            listed = self.browser.recent(viewer, cursor, _BATCH, filters.tenant)
            if not listed:
                return found, None
            scanned += len(listed)
            cursor = listed[-1][1].seq
            wanted = [(t, e) for t, e in listed if filters.cheap(e.status, e.reward)]
            for row in await self.rows(wanted):
                if filters.task is None or row.task == filters.task:
                    found.append(row)
                    if len(found) == size:
                        return found, row.seq
        return found, cursor
