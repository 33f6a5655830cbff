"""The manager's dispatcher: admission, dispatch to servers, and what each result means.

Everything here runs on one event loop and mutates state only between awaits, so the
registry, the servers' in-flight maps and the ready queue always agree.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prorl_async.trainer.errors import TrainerError
from prorl_async.trainer.filters import GroupFilter
from prorl_async.trainer.group import Group, active_seconds, generated_tokens, weight_versions
from prorl_async.trainer.loop import Waker
from prorl_async.trainer.metrics import ManagerMetrics
from prorl_async.trainer.registry import GroupState, Registry, Sample
from prorl_async.trainer.retry import Backoff, classify_result, transport_class
from prorl_async.trainer.servers import ServerPool, ServerState
from prorl_async.trainer.staleness import Staleness

__all__ = ["Dispatcher", "Settings", "result_cost"]


@dataclass(frozen=True, kw_only=True)
class Settings:
    """The knobs the dispatcher needs (validated by the manager)."""

    group_size: int
    batch_groups: int
    max_inflight_groups: int
    group_filter: GroupFilter
    max_infra_retries: int
    carry: bool = True


class Dispatcher:
    """State of one manager and the reactions to every event."""

    def __init__(
        self,
        settings: Settings,
        prompts: Iterator[dict[str, Any]],
        pool: ServerPool,
        staleness: Staleness,
        run: str,
    ) -> None:
        self.cfg = settings
        self.prompts = prompts
        self.pool = pool
        self.staleness = staleness
        self.reg = Registry(run)
        self.ready: deque[Group] = deque()
        self.resubmit: deque[GroupState] = deque()
        self.metrics = ManagerMetrics()
        self.backoff = Backoff()
        self.index = 0
        self.exhausted = False
        # False between batches with on_batch_full="cancel": servers idle while the trainer trains
        self.hungry = True
        # RolloutManager.hold() calls open: no group starts (evaluations on the same engines)
        self.holds = 0
        self.error: BaseException | None = None
        self.wake = Waker()
        self.progress = asyncio.Event()
        self.last_result = time.monotonic()

    def notify(self) -> None:
        self.wake.set()
        self.progress.set()

    # -- admission ---------------------------------------------------------------------

    def admit(self) -> None:
        """Start groups while the batch needs them and staleness allows it."""
        while self._wants_group():
            group = self._next_group()
            if group is None:
                return
            self.reg.add_group(group)

    def _wants_group(self) -> bool:
        # with carry, work for the next batch is never lost: look one batch ahead so RUN
        # slots do not drain while the last groups of this batch finish
        ahead = self.cfg.batch_groups if self.cfg.carry else 0
        need = self.cfg.batch_groups + ahead - len(self.ready)
        if need <= 0 or not self.hungry or self.holds:
            return False
        live = len(self.reg.groups)
        rate = (self.metrics.kept + 1) / (self.metrics.kept + self.metrics.filtered + 1)
        target = min(self.cfg.max_inflight_groups, math.ceil(need / rate))
        return live < target and self.admits(live)

    def admits(self, live: int) -> bool:
        """The staleness bound counts the unconsumed groups: ready and running."""
        return self.staleness.admits(len(self.ready) + live)

    def _next_group(self) -> GroupState | None:
        if self.resubmit:
            return self.resubmit.popleft()
        if self.exhausted:
            return None
        try:
            job = next(self.prompts)
        except StopIteration:
            self.exhausted = True
            self.progress.set()
            return None
        uid = f"p{self.index}"
        self.index += 1
        return GroupState(uid, _checked_job(job, uid), self.cfg.group_size)

    # -- dispatch ----------------------------------------------------------------------

    async def dispatch(self) -> None:
        """Send pending samples to servers with room in their window (``manager.window``),
        one batch call per server."""
        plan = self._plan(time.monotonic())
        if plan:
            await asyncio.gather(*(self._submit(self.pool.servers[u], s) for u, s in plan.items()))

    def _plan(self, now: float) -> dict[str, list[Sample]]:
        """Place every due sample a server can take; the rest wait, the earliest on the timer.

        Never sets ``wake``: what this pass re-queues (a sample moved off a quarantined
        server) it places in this same pass, so a pass never asks for another one by itself.
        """
        plan: dict[str, list[Sample]] = {}
        waiting: deque[Sample] = deque()
        while self.reg.pending:
            sample = self.reg.pending.popleft()
            if self.reg.by_job.get(sample.job_id) is not sample:
                continue  # its group was dropped, or it was moved under a new job id
            if sample.not_before > now:
                waiting.append(sample)
                self.wake.at(sample.not_before, now)
            elif self._moved_off_quarantine(sample):
                continue  # its new attempt is at the end of the queue drained here
            elif (server := self._server_for(sample)) is None:
                waiting.append(sample)
            else:
                server.add(sample)
                plan.setdefault(server.url, []).append(sample)
        self.reg.pending = waiting
        return plan

    def _moved_off_quarantine(self, sample: Sample) -> bool:
        """Its answer was lost and its server is gone: a new id elsewhere (appended)."""
        pinned = None if sample.pin is None else self.pool.servers[sample.pin]
        if pinned is None or not pinned.quarantined:
            return False
        pinned.orphans.add(sample.job_id)
        self.retry(sample, pinned.url, "quarantine", None, count=False, wake=False)
        return True

    def _server_for(self, sample: Sample) -> ServerState | None:
        if sample.pin is None:
            return self.pool.pick(sample.avoid)
        pinned = self.pool.servers[sample.pin]
        return pinned if pinned.free > 0 else None

    async def _submit(self, server: ServerState, samples: list[Sample]) -> None:
        try:
            await server.client.submit_batch([self._body(s) for s in samples])
        except Exception as exc:
            kind = transport_class(exc)
            if kind is None:
                raise TrainerError(f"{server.url} rejected a job: {exc}") from exc
            self._submit_failed(server, samples, exc, kind)
            return
        now = time.monotonic()
        for sample in samples:
            sample.submitted_at = now
        self.metrics.submitted += len(samples)
        server.dirty.set()

    def _submit_failed(
        self, server: ServerState, samples: list[Sample], exc: BaseException, kind: str
    ) -> None:
        self.server_failed(server, exc)  # on quarantine this moves the samples elsewhere
        for sample in samples:
            if server.inflight.pop(sample.job_id, None) is None:
                continue
            if kind == "connection":
                self.metrics.retries[f"submit_{kind}"] += 1
                # the answer may be lost after the server took the job: the same id on the
                # same server is idempotent, so nothing can run twice
                sample.pin = server.url
                sample.not_before = time.monotonic() + self.backoff.delay(server.failures, exc)
                self.reg.pending.append(sample)
                self.wake.at(sample.not_before)
            else:
                self.retry(sample, server.url, f"submit_{kind}", exc)

    def _body(self, sample: Sample) -> dict[str, Any]:
        job, group = sample.group.job, sample.group
        mine = {
            "run": self.reg.run,
            "prompt_uid": group.uid,
            "sample": sample.k,
            "attempt": sample.attempt,
            "sample_key": f"{group.uid}-{sample.k}",
        }
        body = {k: v for k, v in job.items() if k != "metadata"}
        body["metadata"] = {**(job.get("metadata") or {}), "prorl_trainer": mine}
        body["job_id"] = sample.job_id
        return body

    # -- failures ----------------------------------------------------------------------

    def retry(
        self,
        sample: Sample,
        server: str,
        kind: str,
        exc: BaseException | None,
        count: bool = True,
        wake: bool = True,
    ) -> None:
        """Resubmit one sample under a new id, elsewhere, after a backoff (``count``).

        ``count=False`` (a move off a quarantined server) goes at once: it wakes the feed
        loop, unless ``wake=False`` (the caller is the pass that will place it).
        """
        self.reg.forget(sample)
        pinned = None if sample.pin is None else self.pool.servers.get(sample.pin)
        if pinned is not None:  # a lost answer: that server may be running it
            pinned.orphans.add(sample.job_id)
            pinned.dirty.set()
        if sample.group.uid not in self.reg.groups:
            return
        failures = sample.infra_failures + (1 if count else 0)
        self.metrics.retries[kind] += 1
        if failures > self.cfg.max_infra_retries:
            self.fail_group(sample.group, "failed")
            return
        new = self.reg.new_attempt(sample.group, sample.k, failures)
        new.avoid = server
        self.reg.pending.append(new)
        if count:
            new.not_before = time.monotonic() + self.backoff.delay(failures, exc)
            self.wake.at(new.not_before)
        elif wake:
            self.wake.set()

    def server_failed(self, server: ServerState, exc: BaseException) -> None:
        """A transport failure; the third in a row quarantines the server."""
        if not server.transport_failed():
            return
        moved = list(server.inflight.values())
        server.orphans.update(server.inflight)
        server.inflight.clear()
        for sample in moved:
            self.retry(sample, server.url, "quarantine", exc, count=False)
        self.notify()

    def fail_group(self, group: GroupState, cause: str) -> None:
        """Give up on a group (retries exhausted, deadline): counted, never scored."""
        self._drop_live(group)
        self.metrics.failed += 1
        self.metrics.failed_by[cause] += 1
        self._waste_results(group, "failed")
        self.reg.release(group.uid)
        self.notify()

    def _drop_live(self, group: GroupState) -> list[Sample]:
        live = self.reg.drop_group(group)
        for sample in live:
            server = self.pool.servers.get(sample.server or "")
            if server is None:
                continue
            # in flight there, or waiting to be sent again after a lost answer (pinned):
            # either way the server may be running it
            if server.inflight.pop(sample.job_id, None) is not None or sample.pin == server.url:
                server.orphans.add(sample.job_id)
                server.dirty.set()
        return live

    def _waste_results(self, group: GroupState, cause: str) -> None:
        for result in group.results:
            if result is not None:
                self.metrics.waste(cause, generated_tokens(result), active_seconds(result))

    # -- results -----------------------------------------------------------------------

    def on_done(self, server: ServerState, result: dict[str, Any]) -> None:
        job_id = str(result.get("job_id"))
        sample = server.inflight.pop(job_id, None)
        if sample is None and (pinned := self.reg.by_job.get(job_id)) is not None:
            # Waiting to be sent again under the same id (its submission's answer was
            # lost), but the server had taken it: its result passes the cursor only once.
            sample = pinned if pinned.pin == server.url else None
        if sample is None or self.reg.by_job.get(job_id) is not sample:
            return  # an answer we no longer wait for (cancelled, moved, duplicate)
        now = time.monotonic()
        self.metrics.results += 1
        # A fast job's result may come before its submit call returned.
        server.stats.completed_one(now - (sample.submitted_at or now))
        self.wake.set()
        if classify_result(result) == "infra":
            self.retry(sample, server.url, f"result_{result.get('status')}", None)
            return  # not progress: with nothing but failures, next_batch() stalls
        self.last_result = now
        self.reg.forget(sample)
        group = sample.group
        group.results[sample.k] = result
        if group.complete:
            self.reg.groups.pop(group.uid, None)
            self.judge(group)

    def on_lost(self, server: ServerState, job_id: str) -> None:
        """The server does not know a job we submitted there (restarted, expired)."""
        sample = server.inflight.pop(job_id, None)
        if sample is not None and self.reg.by_job.get(job_id) is sample:
            server.orphans.add(job_id)
            self.retry(sample, server.url, "lost", None)

    def judge(self, state: GroupState) -> None:
        """A complete group: stale -> resubmitted; filtered -> counted; else ready."""
        group = state.to_group()
        if self.staleness.is_stale(group.min_weight_version):
            self.restale(group)
        elif not self.cfg.group_filter(group):
            self.metrics.filtered += 1
            self.metrics.waste("filtered", group.tokens, _group_s(group))
            self.reg.release(group.prompt_uid)
        else:
            self.metrics.kept += 1
            self.ready.append(group)
        self.notify()

    def restale(self, group: Group) -> None:
        """Regenerate only the samples that are too old; the fresh ones stay in the group."""
        self.metrics.stale += 1
        state = GroupState(group.prompt_uid, group.job, self.cfg.group_size)
        state.submissions = group.attempts
        for k, result in enumerate(group.results):
            versions = weight_versions(result)
            if self.staleness.is_stale(min(versions) if versions else None):
                self.metrics.waste("stale", *result_cost(result))
            else:
                state.results[k] = result
        self.resubmit.append(state)

    def take_batch(self) -> list[Group] | None:
        """Pop ``batch_groups`` fresh groups from the ready queue, or ``None`` if not enough.

        The caller hands the batch out, or puts it back if it cannot deliver it.
        """
        fresh: deque[Group] = deque()
        for group in self.ready:
            if self.staleness.is_stale(group.min_weight_version):
                self.metrics.kept -= 1
                self.restale(group)
            else:
                fresh.append(group)
        self.ready = fresh
        if len(fresh) < self.cfg.batch_groups:
            return None
        return [fresh.popleft() for _ in range(self.cfg.batch_groups)]

    def put_back(self, batch: list[Group]) -> None:
        self.ready.extendleft(reversed(batch))

    def hand_out(self, batch: list[Group]) -> None:
        for group in batch:
            self._returned(group)
        self.staleness.batch_handed_out()

    def _returned(self, group: Group) -> None:
        lag = self.staleness.lag(group.min_weight_version)
        if lag is not None:
            self.metrics.version_lag[lag] += 1
        self.metrics.returned += 1
        self.metrics.useful_tokens += group.tokens
        self.reg.release(group.prompt_uid)

    def cancel_live(self) -> tuple[list[GroupState], dict[str, str]]:
        """Remove every unfinished group (for ``on_batch_full="cancel"`` and close).

        Their finished results count as ``cancelled`` waste; returns the groups and
        ``{job_id: server_url}`` of the samples to cancel on the servers.
        """
        groups = list(self.reg.groups.values())
        ids: dict[str, str] = {}
        for group in groups:
            self.metrics.cancelled += 1
            self._waste_results(group, "cancelled")
            ids.update({s.job_id: s.server for s in self._drop_live(group) if s.server})
        return groups, ids


def _checked_job(job: Any, uid: str) -> dict[str, Any]:
    where = f"prompts[{uid[1:]}]"
    if not isinstance(job, dict):
        raise TrainerError(f"{where}: a job must be a dict, got {type(job).__name__}")
    for key in ("task", "instance"):
        if key not in job:
            raise TrainerError(f"{where}: missing {key!r}")
    if "job_id" in job:
        raise TrainerError(f"{where}: 'job_id' is chosen by the manager; leave it out")
    return job


def result_cost(result: dict[str, Any]) -> tuple[int, float]:
    """(generated tokens, active seconds) a result cost."""
    return generated_tokens(result), active_seconds(result)


def _group_s(group: Group) -> float:
    return sum(active_seconds(r) for r in group.results)
