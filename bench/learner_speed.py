"""The learner's step times on this machine (torch on CPU, the engine venv), through its client.

The demo's policy shape (Qwen3, vocab 512, hidden 128, 4 layers, 4 heads of 32, 2 KV
heads, ``--intermediate`` 384, untied embeddings: a tied lm_head goes stale in vLLM CPU's
in-place loads) and its sequences: a 44-token framing every prompt shares (system prompt,
chat markup), 8 tokens of problem, then the answer. Printed per thread count (the learner
pinned to the first N cores):

- ``sft``: ms a step at ``--batch`` (128) with 4 target tokens (56 tokens a sequence),
  and the same step with no shared prefix (each prompt starts differently);
- ``grpo``: s an update for 128 samples of the 52-token prompt + 8, then 60 tokens.

Measured 2026-12-04 (2 cores, idle but for this): sft 259 / 189 ms a step at 1 / 2
threads (1013 / 568 without the shared prefix); grpo 0.28 / 0.20 s (+8 tokens) and
1.36 / 0.86 s (+60 tokens).

    python -m bench.learner_speed [--threads 1 2] [--steps 10]
"""

from __future__ import annotations

import argparse
import random
import tempfile
from pathlib import Path
from typing import Any

import uvloop

from prorl_async.train_demo import Learner

VOCAB = 512
SHARED = list(range(20, 64))  # the framing: 44 tokens


def policy(intermediate: int) -> dict[str, Any]:
    return {
        "vocab_size": VOCAB,
        "hidden_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "intermediate_size": intermediate,
        "max_position_embeddings": 1024,
        "tie_word_embeddings": False,
        "bos_token_id": 0,
        "eos_token_id": [2, 0],
    }


def prompt(rng: random.Random, shared: bool) -> list[int]:
    head = SHARED if shared else [rng.randrange(100, VOCAB), *SHARED[1:]]
    return [*head, *(rng.randrange(100, 200) for _ in range(8))]


def sft_examples(n: int, shared: bool) -> list[dict[str, Any]]:
    rng = random.Random(0)
    return [
        {
            "prompt_ids": prompt(rng, shared),
            "target_ids": [rng.randrange(100, 200) for _ in "abc"] + [2],
        }
        for _ in range(n)
    ]


def grpo_samples(n: int, response: int) -> list[dict[str, Any]]:
    rng = random.Random(1)
    out = []
    for k in range(n):
        ids = [rng.randrange(100, VOCAB) for _ in range(response)]
        out.append(
            {
                "prompt_ids": prompt(rng, True),
                "response_ids": ids,
                "logprobs": [-6.0] * response,
                "versions": [0] * response,
                "advantage": 1.0 if k % 2 else -1.0,
            }
        )
    return out


async def measure(learner: Learner, args: argparse.Namespace, threads: int) -> None:
    await learner.call("threads", 60, threads=threads, cpus=list(range(threads)))
    for shared in (True, False):
        examples = sft_examples(512, shared)
        await learner.call("sft", 600, examples=examples, steps=2, batch_size=args.batch)
        sft = await learner.call(
            "sft", 600, examples=examples, steps=args.steps, batch_size=args.batch
        )
        ms = 1000 * sft["train_s"] / args.steps
        label = "shared prefix" if shared else "no shared prefix"
        print(f"threads {threads}: sft batch {args.batch}, {label}: {ms:.0f} ms/step")
    for response in (8, 60):
        samples = grpo_samples(args.batch, response)
        times = []
        for _ in range(3):
            step = await learner.call("grpo", 600, samples=samples, version=0, lr=1e-5)
            times.append(step["train_s"])
        best = min(times)
        print(
            f"threads {threads}: grpo {args.batch} x (52 + {response}) tokens: {best:.2f} s "
            f"(of {', '.join(f'{t:.2f}' for t in times)})"
        )


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="learner-speed-") as tmp:
        async with Learner(log_path=Path(tmp) / "learner.log") as learner:
            init = await learner.call("init", 600, config=policy(args.intermediate), seed=0)
            print(f"policy: {init['params']:,} parameters, intermediate {args.intermediate}")
            for threads in args.threads:
                await measure(learner, args, threads)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--intermediate", type=int, default=384)
    uvloop.run(run(p.parse_args(argv)))


if __name__ == "__main__":
    main()
