"""The learner against a real vLLM on the same checkpoint: the engine's logprobs of the
tokens it sampled are what the learner computes for them (fp32 on both sides), before and
after an in-place weight load, and a GRPO step on the engine's samples moves their
logprobs the way the advantages say.

The policy's embeddings are untied. vLLM CPU 0.32's in-place ``reload_weights`` does not
refresh a tied ``lm_head``: it computes logits with packed weights made from the embedding
at start-up ("ParallelLMHead: Failed to load weights" in its log), so after a load the
engine is a mix of old and new weights (measured: |dlogprob| mean 6e-3, max 4e-2; a
fresh engine on the same checkpoint agrees with the learner to 1e-6).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from prorl_async.vllm_cpu import EngineEnv, VllmProcess
from tests.engines.conftest import engine_post
from tests.train_demo.conftest import (
    BUNDLED_TOKENIZER,
    IM_END,
    LEARNER_TIMEOUT,
    OP_S,
    LearnerFactory,
    tiny_config,
)

pytestmark = LEARNER_TIMEOUT
log = logging.getLogger(__name__)

# The bundled tokenizer's 6,144 ids (a multiple of 64); the shape the demo's policy has.
POLICY = tiny_config(
    vocab_size=6144,
    hidden_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=384,
    tie_word_embeddings=False,
)
FIDELITY = 1e-3


def chat_prompts(n: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, answer ids + <|im_end|>) for ``n`` sums, one system prompt for all."""
    tok = Tokenizer.from_file(str(BUNDLED_TOKENIZER / "tokenizer.json"))
    out = []
    for i in range(n):
        a, b = 17 * i % 100, 31 * i % 100
        text = (
            "<|im_start|>system\nAdd the two numbers. Answer with the sum only.<|im_end|>\n"
            f"<|im_start|>user\nWhat is {a} + {b}?<|im_end|>\n<|im_start|>assistant\n"
        )
        answer = tok.encode(str(a + b), add_special_tokens=False).ids
        out.append((tok.encode(text, add_special_tokens=False).ids, [*answer, IM_END]))
    return out


async def sample(engine: VllmProcess, prompt: list[int], seed: int) -> dict[str, Any]:
    """One seeded completion at temperature 1 with the engine's logprob of each token (past
    the answer too: tokens the policy finds unlikely are part of the check)."""
    body = {
        "model": engine.served_name,
        "prompt": prompt,
        "max_tokens": 12,
        "ignore_eos": True,
        "temperature": 1.0,
        "seed": seed,
        "logprobs": 0,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
    }
    choice = (await engine_post(engine, "/v1/completions", body))["choices"][0]
    ids, logprobs = choice["token_ids"], choice["logprobs"]
    assert logprobs["tokens"] == [f"token_id:{t}" for t in ids]
    return {"prompt_ids": prompt, "response_ids": ids, "logprobs": logprobs["token_logprobs"]}


async def test_learner_and_vllm_agree_on_logprobs(
    make_learner: LearnerFactory, engine_env: EngineEnv, tmp_path: Path
) -> None:
    prompts = chat_prompts(32)
    examples = [{"prompt_ids": p, "target_ids": t} for p, t in prompts]
    async with make_learner(config=POLICY, seed=11, lr=3e-3) as learner:
        # A short warm start: a policy with confident and unlikely tokens, not a uniform one.
        await learner.call("sft", OP_S, examples=examples, steps=30, batch_size=16, seed=1)
        step0, step1 = tmp_path / "step-0000", tmp_path / "step-0001"
        await learner.call("save", OP_S, dir=step0, tokenizer_dir=BUNDLED_TOKENIZER)
        engine = VllmProcess(engine_env, step0, log_path=tmp_path / "vllm.log", max_model_len=512)
        await asyncio.to_thread(engine.start)
        try:
            samples = await sample_all(engine, prompts[:16])
            await check_fidelity(learner, samples)
            await check_grpo_step(learner, samples)
            # The policy after one step, loaded in place as the training loop does.
            await learner.call("save", OP_S, dir=step1, tokenizer_dir=BUNDLED_TOKENIZER)
            reload = {"method": "reload_weights", "kwargs": {"weights_path": str(step1)}}
            await engine_post(engine, "/collective_rpc", reload)
            await engine_post(engine, "/reset_prefix_cache", {})
            await check_fidelity(learner, await sample_all(engine, prompts[:16]))
        finally:
            await asyncio.to_thread(engine.stop)


async def sample_all(
    engine: VllmProcess, prompts: list[tuple[list[int], list[int]]]
) -> list[dict[str, Any]]:
    return list(
        await asyncio.gather(*(sample(engine, p, seed=100 + k) for k, (p, _) in enumerate(prompts)))
    )


async def check_fidelity(learner: Any, samples: list[dict[str, Any]]) -> None:
    pairs = [{"prompt_ids": s["prompt_ids"], "response_ids": s["response_ids"]} for s in samples]
    ours = (await learner.call("logprobs", OP_S, samples=pairs))["logprobs"]
    diffs = [
        abs(a - b)
        for s, mine in zip(samples, ours, strict=True)
        for a, b in zip(s["logprobs"], mine, strict=True)
    ]
    engine = [x for s in samples for x in s["logprobs"]]
    log.info(
        "fidelity: %d tokens, mean %.2e, max %.2e; engine logprobs %.2f..%.2f",
        len(diffs),
        sum(diffs) / len(diffs),
        max(diffs),
        min(engine),
        max(engine),
    )
    assert max(diffs) <= FIDELITY, diffs
    assert min(engine) < -5.0 and max(engine) > -0.5, "a policy too uniform to test anything"


async def check_grpo_step(learner: Any, samples: list[dict[str, Any]]) -> None:
    batch = [
        {**s, "versions": [0] * len(s["logprobs"]), "advantage": 1.0 if k % 2 else -1.0}
        for k, s in enumerate(samples)
    ]
    step = await learner.call("grpo", OP_S, samples=batch, version=0, lr=1e-3)
    tokens = sum(len(s["response_ids"]) for s in samples)
    assert step["fidelity_tokens"] == step["tokens"] == tokens
    assert step["logprob_diff_max"] <= FIDELITY, step
    assert step["logprob_diff_mean"] <= step["logprob_diff_max"]
    pairs = [{"prompt_ids": s["prompt_ids"], "response_ids": s["response_ids"]} for s in samples]
    after = (await learner.call("logprobs", OP_S, samples=pairs))["logprobs"]
    change = [sum(b) - sum(s["logprobs"]) for s, b in zip(samples, after, strict=True)]
    assert sum(change[1::2]) > 0 > sum(change[::2]), change
