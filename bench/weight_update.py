"""Weight updates under load, three ways, on a real engine (vLLM on CPU, the tiny Qwen3).

The same closed-loop workload runs for ``--window-s`` (90) seconds per strategy:
``--concurrency`` (8) jobs always in flight, each one turn of a random length between 64
and 256 tokens (``ignore_eos``). Every ``--every-s`` (10) seconds a new checkpoint is
loaded (the two tiny checkpoints, seeds 0 and 1, in turn) with ``POST /weights/load``:

- (a) regenerate: ``abort``, and an interrupted turn starts over under the new weights
  (``pool.on_interrupt = "regenerate"``; what it had made is thrown away);
- (b) wait: in-flight turns finish first, the engine gets nothing new meanwhile;
- (c) continue (ours): ``abort``, and an interrupted turn goes on from the tokens it made.

Printed per strategy: useful generated tokens/s (tokens of jobs finished within the
window, over the window), tokens thrown away (``prorl_tokens_discarded_total``), turns
interrupted, seconds paused. Targets: (c) throws away 0 tokens and its tokens/s is
>= 1.1x (b)'s.

    python -m bench.weight_update [--window-s 90] [--every-s 10] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

from bench._server import server
from prorl_async.client import RolloutClient
from prorl_async.vllm_cpu import EngineEnv, VllmProcess

STRATEGIES = {
    "a": ("regenerate", "abort", "regenerate the whole turn"),
    "b": ("continue", "wait", "pause with wait"),
    "c": ("continue", "abort", "abort and continue (ours)"),
}


class Outcome:
    def __init__(self, label: str) -> None:
        self.label = label
        self.tokens = 0
        self.jobs = 0
        self.loads = 0
        self.metrics: dict[str, float] = {}
        self.window_s = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.window_s if self.window_s else 0.0


async def _metrics(url: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as r:
        text = await r.text()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


async def run_strategy(
    key: str, args: argparse.Namespace, engine: VllmProcess, models: list[Path], tmp: Path
) -> Outcome:
    on_interrupt, mode, label = STRATEGIES[key]
    config = tmp / f"{key}.toml"
    config.write_text(f'[pool]\non_interrupt = "{on_interrupt}"\n')
    out = Outcome(f"({key}) {label}")
    async with (
        server("--config", str(config), "--tokenizer", str(models[0]), "--store", "memory") as (
            _,
            url,
        ),
        RolloutClient(url) as client,
    ):
        await client.add_llm_server(engine.address, weight_version=0)
        await client.load_weights(0, str(models[0]))  # every strategy starts from seed 0
        start = time.monotonic()
        end = start + args.window_s
        rng = random.Random(args.seed)
        workers = [
            asyncio.create_task(_worker(client, rng, end, out, i)) for i in range(args.concurrency)
        ]
        version = 0
        # Loads at fixed times (start + k * every_s), however long each takes: every
        # strategy gets the same updates in its window.
        while (due := start + (version + 1) * args.every_s) < end:
            await asyncio.sleep(max(due - time.monotonic(), 0.0))  # the cadence under test
            version += 1
            await client.load_weights(version, str(models[version % 2]), mode)
            out.loads += 1
        await asyncio.gather(*workers)
        out.window_s = time.monotonic() - start
        out.metrics = await _metrics(url)
        await client.load_weights(version + 1, str(models[0]))  # the engine back on seed 0
    return out


async def _worker(
    client: RolloutClient, rng: random.Random, end: float, out: Outcome, wid: int
) -> None:
    n = 0
    while time.monotonic() < end:
        n += 1
        job = {
            "task": "planted",
            "instance": {"outcome": "right", "seed": wid * 100_000 + n},
            "sampling_params": {
                "max_tokens": rng.randint(64, 256),
                "ignore_eos": True,
                "seed": wid * 100_000 + n,
            },
        }
        [job_id] = await client.submit_batch([job])
        doc = await client.result(job_id, wait=max(end - time.monotonic(), 0.0) + 0.5)
        if doc is not None and time.monotonic() <= end and doc["status"] == "done":
            out.tokens += len(doc["response_ids"])
            out.jobs += 1
        elif doc is None:
            await client.cancel([job_id])  # past the window: not counted


def _report(outcomes: list[Outcome], args: argparse.Namespace) -> None:
    print(
        f"\n{args.concurrency} jobs in flight, 64-256 tokens each, a checkpoint load every "
        f"{args.every_s:.0f} s, {args.window_s:.0f} s per strategy and round, alternated "
        f"(vLLM-CPU, tiny Qwen3)\n"
    )
    head = f"{'strategy':<32}{'useful tok/s':>13}{'jobs':>6}{'thrown away':>13}"
    print(f"{head}{'interrupted':>13}{'paused s':>10}{'loads':>7}")
    for o in outcomes:
        m = o.metrics
        print(
            f"{o.label:<32}{o.tokens_per_s:>13.1f}{o.jobs:>6}"
            f"{m.get('prorl_tokens_discarded_total', 0):>13.0f}"
            f"{m.get('prorl_generations_interrupted_total', 0):>13.0f}"
            f"{m.get('prorl_weight_pause_seconds_sum', 0):>10.1f}{o.loads:>7}"
        )

    def median(key: str) -> float:
        return statistics.median(o.tokens_per_s for o in outcomes if o.label[1] == key)

    keys = {o.label[1] for o in outcomes}
    if {"b", "c"} <= keys and median("b"):
        ratio = median("c") / median("b")
        thrown = sum(
            o.metrics.get("prorl_tokens_discarded_total", 0) for o in outcomes if o.label[1] == "c"
        )
        ok = "met" if ratio >= 1.1 and thrown == 0 else "MISSED"
        print(
            f"\n(c) / (b) useful tokens/s (medians): {ratio:.2f}; (c) thrown away: {thrown:.0f} "
            f"(targets >= 1.1 and 0: {ok})"
        )


async def run(args: argparse.Namespace) -> None:
    env = EngineEnv()
    env.setup(lambda text: print(f"setup: {text}"))
    models = [env.model_dir(0), env.model_dir(1)]
    with tempfile.TemporaryDirectory(prefix="bench-weights-") as tmp:
        engine = VllmProcess(env, models[0], log_path=Path(tmp) / "vllm.log")
        print("starting vLLM (about 60 s) ...")
        await asyncio.to_thread(engine.start)
        try:
            outcomes = []
            for r in range(args.rounds):
                for key in args.strategies:
                    print(f"round {r + 1}: strategy ({key}) {STRATEGIES[key][2]} ...")
                    outcomes.append(await run_strategy(key, args, engine, models, Path(tmp)))
            _report(outcomes, args)
        finally:
            await asyncio.to_thread(engine.stop)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--window-s", type=float, default=90.0)
    p.add_argument("--every-s", type=float, default=10.0)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--strategies", default="abc", help="which of a, b, c to run, in order")
    p.add_argument("--rounds", type=int, default=1, help="repeat the strategies, alternated")
    args: Any = p.parse_args(argv)
    uvloop.run(run(args))


if __name__ == "__main__":
    main()
