"""The learner process in the engine's venv: its protocol, SFT, GRPO and checkpoints."""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path
from typing import Any

import pytest

from prorl_async.train_demo import LearnerRefused
from prorl_async.vllm_cpu import EngineEnv
from tests.train_demo.conftest import (
    BUNDLED_TOKENIZER,
    IM_END,
    INIT_S,
    LEARNER_TIMEOUT,
    OP_S,
    LearnerFactory,
    tiny_config,
)

pytestmark = LEARNER_TIMEOUT

PREFIX = list(range(10, 22))  # the prompt framing every example shares
DIGITS = range(100, 110)


def swap_examples(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """Toy task: after the shared prefix and two digits, answer them swapped, then stop."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        x, y = rng.choice(DIGITS), rng.choice(DIGITS)
        out.append({"prompt_ids": [*PREFIX, x, y], "target_ids": [y, x, IM_END]})
    return out


def completions(examples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"prompt_ids": e["prompt_ids"], "response_ids": e["target_ids"]} for e in examples]


def test_bad_requests_are_answered_and_the_learner_goes_on(
    engine_env: EngineEnv, tmp_path: Path
) -> None:
    init = {"id": 5, "op": "init", "config": tiny_config(), "threads": 1}
    sample = {"prompt_ids": PREFIX, "response_ids": [1, 2], "advantage": 1.0}
    requests: list[tuple[Any, str | None]] = [
        ("garbage", "unreadable request"),
        ({"id": 1, "op": "train"}, "unknown op 'train'; known: init, threads"),
        ({"op": "init"}, "needs an integer 'id'"),
        ({"id": 2, "op": "sft", "examples": [], "steps": 1, "batch_size": 1}, "send 'init'"),
        ({**init, "id": 3, "lr": "fast"}, "Expected `float`, got `str` - at `$.lr`"),
        ({**init, "id": 4, "bogus": 1}, "unknown field `bogus`"),
        (init, None),
        (
            {"id": 6, "op": "sft", "examples": [{"prompt_ids": [1]}], "steps": 1, "batch_size": 1},
            "missing required field `target_ids`",
        ),
        (
            {"id": 7, "op": "logprobs", "samples": [{"prompt_ids": [1], "response_ids": [512]}]},
            "samples[0]: token ids outside 0..511: [512]",
        ),
        (
            {"id": 8, "op": "grpo", "version": 0, "samples": [{**sample, "logprobs": [-1.0]}]},
            "samples[0].logprobs has 1 entries for 2 response tokens",
        ),
        ({"id": 9, "op": "threads", "threads": 1, "cpus": [99]}, "cpus [99] is not"),
        ({"id": 9, "op": "threads", "threads": 1, "cpus": [0]}, None),
        (
            {
                "id": 9,
                "op": "sft",
                "examples": [{"prompt_ids": [1], "target_ids": []}],
                "steps": 1,
                "batch_size": 1,
            },
            "examples[0]: target_ids is empty",
        ),
        ({"id": 10, "op": "save", "dir": "/dev/null/ckpt"}, "save: FileExistsError"),
        (
            {"id": 11, "op": "save", "dir": str(tmp_path / "c"), "tokenizer_dir": str(tmp_path)},
            "has no ['tokenizer.json', 'tokenizer_config.json']",
        ),
        ({"id": 11, "op": "logprobs", "samples": [], "temperature": 0}, "temperature must be > 0"),
        ({"id": 12, "op": "logprobs", "samples": [{"prompt_ids": [1], "response_ids": [7]}]}, None),
        ({"id": 13, "op": "exit"}, None),
    ]
    lines = [r if isinstance(r, str) else json.dumps(r) for r, _ in requests]
    proc = subprocess.run(
        [str(engine_env.python), "-m", "prorl_async.train_demo.learner"],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        env=engine_env.process_env(),
        timeout=INIT_S,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(answers) == len(requests), proc.stdout
    for (request, error), answer in zip(requests, answers, strict=True):
        want_id = request.get("id") if isinstance(request, dict) else None
        assert answer["id"] == want_id
        if error is None:
            assert answer["ok"], answer
        else:
            assert not answer["ok"] and error in answer["error"], (error, answer)
    assert len(answers[-2]["logprobs"][0]) == 1
    assert [a["cpus"] for a in answers if "cpus" in a] == [[0]]


async def test_sft_lowers_the_loss(make_learner: LearnerFactory) -> None:
    async with make_learner(seed=1, lr=3e-3) as learner:
        examples = swap_examples(64)
        sft = await learner.call("sft", OP_S, examples=examples, steps=40, batch_size=32, seed=2)
        assert sft["steps"] == 40 and sft["train_s"] > 0
        assert sft["loss_last"] < 0.5 * sft["loss_first"], sft
        with pytest.raises(LearnerRefused, match="sft: needs examples"):
            await learner.call("sft", OP_S, examples=examples, steps=1, batch_size=0)


async def test_a_batch_scores_as_its_samples_do_alone(make_learner: LearnerFactory) -> None:
    """The shared-prefix forward of a batch equals each sample's own full forward."""
    samples = completions(swap_examples(6))
    samples.append({"prompt_ids": [*PREFIX[:5], 3], "response_ids": [4, 5, 6, 7]})  # shorter
    async with make_learner(seed=3) as learner:
        together = (await learner.call("logprobs", OP_S, samples=samples))["logprobs"]
        for sample, batched in zip(samples, together, strict=True):
            [alone] = (await learner.call("logprobs", OP_S, samples=[sample]))["logprobs"]
            assert batched == pytest.approx(alone, abs=1e-5)


async def test_save_then_load_gives_the_same_logprobs(
    make_learner: LearnerFactory, tmp_path: Path
) -> None:
    samples = completions(swap_examples(8, seed=5))
    ckpt = tmp_path / "ckpt"
    async with make_learner(seed=4, lr=3e-3) as learner:
        await learner.call("sft", OP_S, examples=swap_examples(32), steps=5, batch_size=16)
        before = (await learner.call("logprobs", OP_S, samples=samples))["logprobs"]
        for _ in range(2):  # the second save replaces the first
            saved = await learner.call("save", OP_S, dir=ckpt, tokenizer_dir=BUNDLED_TOKENIZER)
            assert saved["save_s"] > 0
        await learner.call("init", INIT_S, model_dir=ckpt)
        after = (await learner.call("logprobs", OP_S, samples=samples))["logprobs"]
    assert after == before
    names = {p.name for p in ckpt.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors"} <= names
    assert {"tokenizer.json", "tokenizer_config.json"} <= names
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("ckpt")) == ["ckpt"]
    config = json.loads((ckpt / "config.json").read_text())
    assert config["dtype"] == "float32" and config["vocab_size"] == 512
    generation = json.loads((ckpt / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [IM_END, 0]


async def test_grpo_follows_the_advantage(make_learner: LearnerFactory) -> None:
    samples = completions(swap_examples(8, seed=6))
    async with make_learner(seed=7) as learner:
        old = (await learner.call("logprobs", OP_S, samples=samples))["logprobs"]
        batch = [
            {**s, "logprobs": lp, "versions": [0] * len(lp), "advantage": 1.0 if k < 4 else -1.0}
            for k, (s, lp) in enumerate(zip(samples, old, strict=True))
        ]
        batch[7]["versions"] = [1, 1, None]  # made by another policy: not a fidelity token
        batch[6]["response_mask"] = [1, 0, 1]  # an observation token: no loss, no check
        step = await learner.call("grpo", OP_S, samples=batch, version=0, lr=1e-3)
        assert step["tokens"] == 23 and step["fidelity_tokens"] == 20
        # Ratios of 1: the loss is minus the mean advantage over the 12 + 11 model tokens.
        assert step["loss"] == pytest.approx(-1 / 23, abs=1e-6)
        # The learner scored the same tokens as the engine (here: itself) did.
        assert step["logprob_diff_max"] < 1e-5
        assert step["clip_frac"] == 0.0 and step["steps"] == 1
        new = (await learner.call("logprobs", OP_S, samples=samples))["logprobs"]
        # Up where the advantage is positive, down where it is negative.
        change = [sum(b) - sum(a) for a, b in zip(old, new, strict=True)]
        assert sum(change[:4]) > 0 > sum(change[4:]), change
        # Two minibatches, two steps; the check is made before the first (at version 1).
        again = [
            {**s, "logprobs": lp, "versions": [1] * len(lp)}
            for s, lp in zip(batch, new, strict=True)
        ]
        step = await learner.call("grpo", OP_S, samples=again, version=1, minibatches=2)
        assert step["steps"] == 2 and step["fidelity_tokens"] == 23
        assert step["logprob_diff_max"] < 1e-5
        new = (await learner.call("logprobs", OP_S, samples=samples))["logprobs"]
        # Nothing but masked tokens: no step, no change.
        masked = [{**s, "response_mask": [0] * len(s["response_ids"])} for s in batch]
        step = await learner.call("grpo", OP_S, samples=masked, version=3)
        assert step["tokens"] == 0 and step["steps"] == 0
        assert (await learner.call("logprobs", OP_S, samples=samples))["logprobs"] == new
