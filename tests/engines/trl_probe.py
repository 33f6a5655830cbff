"""Run in the engine venv by ``test_trl_masks.py``: TRL's ``GRPOTrainer`` turns the given
jobs into its training batch through ``ServiceRollouts``; prints what TRL made of them.

``python -m tests.engines.trl_probe URL MODEL_DIR JOBS_JSON``: JOBS_JSON is a list of
``dataset_row`` prompts (two of each: ``num_generations`` 2). Prints one JSON object:
TRL's ``tool_mask`` and ``completion_mask`` rows (cut to each completion's length), its
``completion_ids``, the job ids, and the mean completion length TRL logged.
"""

from __future__ import annotations

import json
import sys
import tempfile
from typing import Any


def main(url: str, model_dir: str, prompts: list[str]) -> dict[str, Any]:
    import torch
    import transformers
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from prorl_async.integrations.trl import ServiceRollouts, service_reward

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    with tempfile.TemporaryDirectory() as out, ServiceRollouts([url]) as rollouts:
        args = GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=len(prompts),
            num_generations=2,
            max_completion_length=256,
            use_cpu=True,
            bf16=False,
            report_to="none",
            max_steps=1,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=service_reward,
            args=args,
            train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]),
            processing_class=tokenizer,
            rollout_func=rollouts,
        )
        trainer.model.train()  # as in trainer.train(): TRL files its metrics under "train"
        batch = trainer._generate_and_score_completions([{"prompt": p} for p in prompts])
        lengths = batch["completion_mask"].sum(dim=1).tolist()
        job_ids = [r["job_id"] for r in rollouts.last_results]
    completion = batch["completion_mask"].tolist()

    def cut(rows: Any) -> list[list[int]]:
        return [row[:n] for row, n in zip(rows.tolist(), lengths, strict=True)]

    return {
        "job_ids": job_ids,
        "lengths": lengths,
        "completion_ids": cut(batch["completion_ids"]),
        "tool_mask": cut(batch["tool_mask"]),
        "loss_mask": cut(batch["completion_mask"] * batch["tool_mask"]),
        "padding_masked": all(not any(row[n:]) for row, n in zip(completion, lengths, strict=True)),
        "mean_length": trainer._metrics["train"]["completions/mean_length"][-1],
    }


if __name__ == "__main__":
    found = main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))
    sys.stdout.write("PROBE " + json.dumps(found) + "\n")
