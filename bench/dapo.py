"""DAPO dynamic sampling three ways, on the same real servers and the same scripted LLM.

Two ``prorl-async serve`` processes (``--run-workers`` slots each) run the ``planted`` task:
RUN waits a lognormal time (median ``--run-s``, shape ``--sigma``: the heavy tail of response
lengths), then makes one real call to an in-process scripted LLM (TEST DOUBLE for vLLM).
Prompts are planted so a chosen fraction of groups passes ``nonzero_std`` (20/50/80%).
A trainer step of ``--train-s`` seconds follows every batch (weights bumped each step).

- (a) batch-by-batch, as veRL's DAPO recipe does it: generate ``batch_groups`` prompts x n,
  wait for the slowest sample, filter, repeat until enough groups passed, keep the first
  ``batch_groups`` and drop the surplus (``batch = batch[:traj_bsz]``); no generation while
  training.
- (b) cancel-and-regenerate, as the ProRL reference manager does it: groups are submitted
  continuously while the batch fills; at the batch boundary every unfinished group is
  cancelled and its finished samples thrown away (``RolloutManager(on_batch_full="cancel")``).
- (c) this manager with ``carry``: unfinished groups keep running into the next batch and
  generation overlaps the trainer step, within ``max_version_lag=1``.

Printed per pass rate: useful groups/s, the ratio to (a), wasted tokens and sample-seconds
beyond the filter (surplus, cancelled, stale), what the filter drops, the wall time, and
the mean active seconds of the samples returned to the trainer (``kept_s``: a strategy
that keeps only what finished first returns shorter samples than the task produces).

    python -m bench.dapo [--batches 6] [--group-size 4] [--batch-groups 8]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import uvloop

from bench._server import server
from prorl_async.client import RolloutClient
from prorl_async.scripted_llm.server import ScriptedLLM
from prorl_async.trainer import RolloutManager, nonzero_std
from prorl_async.trainer.group import Group, active_seconds


@dataclass
class Outcome:
    groups: int = 0
    seconds: float = 0.0
    waste_tokens: int = 0
    waste_s: float = 0.0
    filtered_tokens: int = 0
    returned_s: list[float] = field(default_factory=list)
    detail: dict[str, Any] = field(default_factory=dict)

    def returned(self, batch: list[Group]) -> None:
        self.groups += len(batch)
        self.returned_s.extend(active_seconds(r) for g in batch for r in g.results)

    @property
    def mean_s(self) -> float:
        return sum(self.returned_s) / len(self.returned_s) if self.returned_s else 0.0

    @property
    def rate(self) -> float:
        return self.groups / self.seconds if self.seconds else 0.0


def prompts(
    pass_rate: float, n: int, run_s: float, sigma: float, seed: int
) -> Iterator[dict[str, Any]]:
    """An endless stream; a ``random`` prompt passes with 1 - 2 / 2**n, the others never."""
    frac = min(pass_rate / (1 - 2 * 0.5**n), 1.0)
    i = 0
    while True:
        i += 1
        # a deterministic low-discrepancy choice keeps the mix exact in every window
        mixed = (i * frac) % 1.0 < frac
        outcome = "random" if mixed else ("right" if i % 2 else "wrong")
        instance = {"outcome": outcome, "seed": seed * 1_000_003 + i, "run_s": run_s}
        yield {"task": "planted", "instance": {**instance, "sigma": sigma}}


# -- (a) batch by batch --------------------------------------------------------------------


async def _generate_round(
    clients: list[RolloutClient], jobs: list[dict[str, Any]], n: int
) -> list[Group]:
    bodies: list[list[dict[str, Any]]] = [[] for _ in clients]
    for i, job in enumerate(jobs):
        for k in range(n):
            key = f"a{id(jobs)}-{i}-{k}"
            meta = {"prorl_trainer": {"sample_key": f"{job['instance']['seed']}-{k}"}}
            body = {**job, "job_id": key, "metadata": meta}
            bodies[(i * n + k) % len(clients)].append(body)
    await asyncio.gather(*(c.submit_batch(b) for c, b in zip(clients, bodies, strict=True)))
    found = await asyncio.gather(
        *(_wait_all(c, [b["job_id"] for b in bs]) for c, bs in zip(clients, bodies, strict=True))
    )
    by_id = {r["job_id"]: r for results in found for r in results}
    return [
        Group(f"a{i}", job, [by_id[f"a{id(jobs)}-{i}-{k}"] for k in range(n)])
        for i, job in enumerate(jobs)
    ]


async def _wait_all(client: RolloutClient, ids: list[str]) -> list[dict[str, Any]]:
    done: list[dict[str, Any]] = []
    pending = list(ids)
    while pending:
        out = await client.poll(pending, wait=5.0)
        done.extend(out["done"])
        pending = out["pending"]
    return done


async def batch_by_batch(urls: list[str], args: argparse.Namespace, pass_rate: float) -> Outcome:
    stream = prompts(pass_rate, args.group_size, args.run_s, args.sigma, seed=1)
    out = Outcome()
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(RolloutClient(u)) for u in urls]
        start = time.monotonic()
        for _ in range(args.batches):
            kept: list[Group] = []
            while len(kept) < args.batch_groups:
                jobs = [next(stream) for _ in range(args.batch_groups)]
                for group in await _generate_round(clients, jobs, args.group_size):
                    if nonzero_std(group):
                        kept.append(group)
                    else:
                        out.filtered_tokens += group.tokens
            for group in kept[args.batch_groups :]:  # veRL truncates to the train batch
                out.waste_tokens += group.tokens
                out.waste_s += sum(active_seconds(r) for r in group.results)
            out.returned(kept[: args.batch_groups])
            await asyncio.sleep(args.train_s)
        out.seconds = time.monotonic() - start
    return out


# -- (b) and (c): the manager --------------------------------------------------------------


async def managed(
    urls: list[str],
    llm: str,
    args: argparse.Namespace,
    pass_rate: float,
    mode: Literal["carry", "cancel"],
) -> Outcome:
    stream = prompts(pass_rate, args.group_size, args.run_s, args.sigma, seed=1)
    out = Outcome()
    async with RolloutManager(
        servers=urls,
        prompts=stream,
        group_size=args.group_size,
        batch_groups=args.batch_groups,
        on_batch_full=mode,
        max_version_lag=1,
        progress=False,
    ) as m:
        await m.set_weights(version=0, backends=[llm])
        start = time.monotonic()
        for version in range(1, args.batches + 1):
            out.returned(await m.next_batch())
            await asyncio.sleep(args.train_s)
            await m.set_weights(version=version, backends=[llm])
        out.seconds = time.monotonic() - start
        metrics = m.metrics()
    for cause in ("cancelled", "stale", "failed"):
        out.waste_tokens += metrics["wasted_tokens"][cause]
        out.waste_s += metrics["wasted_seconds"][cause]
    out.filtered_tokens = metrics["wasted_tokens"]["filtered"]
    out.detail = {"stale": metrics["groups"]["stale"], "cancelled": metrics["groups"]["cancelled"]}
    return out


# -- driver --------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def rig(args: argparse.Namespace) -> AsyncIterator[tuple[list[str], str]]:
    with tempfile.TemporaryDirectory() as tmp:
        async with contextlib.AsyncExitStack() as stack:
            llm = await stack.enter_async_context(ScriptedLLM(policy="finish"))
            urls = []
            for i in range(2):
                state = str(Path(tmp) / f"s{i}")
                flags = ("--run-workers", str(args.run_workers), "--state-dir", state)
                _, url = await stack.enter_async_context(server(*flags))
                urls.append(url)
            yield urls, llm.address


def _row(name: str, o: Outcome, base: Outcome) -> str:
    ratio = o.rate / base.rate if base.rate else 0.0
    return (
        f"  {name:<22} {o.rate:7.2f} {ratio:6.2f}x {o.waste_tokens:9d} {o.waste_s:9.1f}"
        f" {o.filtered_tokens:10d}  {o.seconds:6.1f}  {o.mean_s:6.3f}"
    )


async def main(args: argparse.Namespace) -> None:
    async with rig(args) as (urls, llm):
        for client_url in urls:
            async with RolloutClient(client_url) as client:
                await client.add_llm_server(llm, weight_version=0)
        print(
            f"n={args.group_size} batch_groups={args.batch_groups} batches={args.batches} "
            f"RUN lognormal(median {args.run_s}s, sigma {args.sigma}) "
            f"2 servers x {args.run_workers} RUN workers, train step {args.train_s}s"
        )
        header = (
            "  mode                   groups/s  vs(a)  waste_tok  waste_s  filter_tok"
            "  wall_s  kept_s"
        )
        for pass_rate in (0.2, 0.5, 0.8):
            a = await batch_by_batch(urls, args, pass_rate)
            b = await managed(urls, llm, args, pass_rate, "cancel")
            c = await managed(urls, llm, args, pass_rate, "carry")
            print(f"\npass rate {pass_rate:.0%}\n{header}")
            print(_row("(a) batch-by-batch", a, a))
            print(_row("(b) cancel-regenerate", b, a))
            print(_row("(c) carry (this)", c, a))
            print(
                f"  (c)/(a) = {c.rate / a.rate:.2f}x useful groups/s; "
                f"(c) waste {c.waste_tokens} tok / {c.waste_s:.1f} s vs (b) "
                f"{b.waste_tokens} tok / {b.waste_s:.1f} s; stale groups (c) {c.detail['stale']}"
            )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--batch-groups", type=int, default=8)
    p.add_argument("--batches", type=int, default=6)
    p.add_argument("--run-workers", type=int, default=16)
    p.add_argument("--run-s", type=float, default=0.2)
    p.add_argument("--sigma", type=float, default=1.0)
    p.add_argument("--train-s", type=float, default=0.2)
    return p.parse_args(argv)


if __name__ == "__main__":
    uvloop.run(main(parse()))
