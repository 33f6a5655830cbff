"""``train-demo --trainer trl``: TRL's ``GRPOTrainer`` as the learner, the service as its
rollouts. Runs in the engine's venv (``python -m prorl_async.train_demo.trl_learner
SPEC``), started and owned by ``train_demo.run``; torch, transformers and TRL are imported
inside the functions.

``SPEC`` is a JSON file (:class:`Spec`). The process trains ``steps`` steps from the warm
start and appends one ``metrics.jsonl`` line a step, with the builtin trainer's fields:
the rollouts' figures and weight versions, the trainer-vs-engine logprob difference over
the tokens of the loaded version (recomputed with TRL's policy before it trains on
them), the held-out pass@1 every ``eval_every`` steps (greedy, through the service),
and the step's times. It ends by writing ``SUMMARY``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Literal

import msgspec

from prorl_async.integrations.trl import (
    ServiceRollouts,
    dataset_row,
    save_policy,
    service_reward,
    weight_sync_callback,
)
from prorl_async.train_demo import task
from prorl_async.train_demo.grpo import step_figures
from prorl_async.train_demo.learner_checkpoint import TOKENIZER_FILES, load_model
from prorl_async.trainer import Group

__all__ = ["Spec", "main"]


class Spec(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """What ``train_demo.run`` hands the TRL learner."""

    url: str
    model_dir: str
    tokenizer_dir: str
    checkpoints: str
    metrics: str
    summary: str
    steps: int
    prompts_per_step: int
    group_size: int
    max_tokens: int
    temperature: float
    lr: float
    clip: float
    seed: int
    eval_every: int
    heldout: list[tuple[int, int]]
    prompts: list[tuple[int, int]]
    threads: int = 2
    timeout_s: float = 600.0
    # "service": rollouts through the server and its engine (the adapter); "trl": TRL's
    # own generation (HF generate on CPU, no engine) and a local grader, for comparison:
    # the engine then only serves the held-out evaluations.
    generation: Literal["service", "trl"] = "service"
    # With generation "trl": each prompt's rendered text (the handler's exact first
    # prompt; rendering it needs the handlers, which this venv does not import).
    prompt_texts: list[str] | None = None


class Clock:
    """The step's phases as TRL runs them: rollouts, then training, then the load."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.rollout_s = self.rollout_end = self.eval_s = 0.0
        self.fid: dict[str, Any] = {}
        self.step_begin = self.start
        self.totals = {"rollout_s": 0.0, "train_s": 0.0, "eval_s": 0.0}


def _jobs(spec: Spec) -> list[dict[str, Any]]:
    """The training rows: the prompts in the order ``run`` drew them (TRL's sampler does
    not shuffle them: ``shuffle_dataset`` off). For TRL's own generation, the handler's
    exact first prompt as text (TRL tokenizes it) and the answer."""
    if spec.generation == "trl":
        if spec.prompt_texts is None or len(spec.prompt_texts) != len(spec.prompts):
            raise ValueError("generation 'trl' needs prompt_texts, one per prompt")
        return [
            {"prompt": text, "answer": str(a + b)}
            for text, (a, b) in zip(spec.prompt_texts, spec.prompts, strict=True)
        ]
    return [dataset_row("math", task.instance(a, b)) for a, b in spec.prompts]


def local_reward(completions: list[str], answer: list[str], **_: Any) -> list[float]:
    """The ``math`` handler's grading of a reply with no tool call (its last ``\\boxed{}``),
    run in the trainer: TRL's own generation has no service to grade it."""
    from prorl_async.grading.math import extract_answer, grade, reference_answer

    return [
        float(grade(extract_answer(text, None), reference_answer(ref)).correct)
        for text, ref in zip(completions, answer, strict=True)
    ]


def evaluate(rollouts: ServiceRollouts, spec: Spec) -> float:
    """Greedy pass@1 on the held-out problems with the engines' current weights."""
    greedy = {"temperature": 0.0, "max_tokens": spec.max_tokens}
    rows = [dataset_row("math", task.instance(a, b), greedy)["prompt"] for a, b in spec.heldout]
    rewards = rollouts(rows)["reward"]
    return sum(r or 0.0 for r in rewards) / len(rewards)


def fidelity(model: Any, results: list[dict[str, Any]], version: int) -> dict[str, Any]:
    """|trainer - engine| logprob over the model tokens generated at ``version``."""
    import torch

    from prorl_async.train_demo import learner_math

    prompts, responses, engine, chosen = [], [], [], []
    for r in results:
        ids = list(r.get("response_ids") or [])
        if r.get("status") != "done" or not ids:
            continue
        prompts.append(list(r["prompt_ids"]))
        responses.append(ids)
        logps = list(r.get("response_logprobs") or [])
        versions = list(r.get("response_versions") or [])
        mask = list(r.get("response_mask") or [1] * len(ids))
        for i in range(len(ids)):
            lp = logps[i] if i < len(logps) else None
            ok = mask[i] == 1 and lp is not None and i < len(versions) and versions[i] == version
            engine.append(lp if lp is not None else 0.0)
            chosen.append(ok)
    if not responses:
        return {"logprob_diff_mean": None, "logprob_diff_max": None, "fidelity_tokens": 0}
    with torch.no_grad():
        scored = learner_math.token_logprobs(model, prompts, responses, share_prefix=False)
    found = learner_math.fidelity(scored.logprobs, engine, chosen)
    return {
        "logprob_diff_mean": found.mean,
        "logprob_diff_max": found.max,
        "fidelity_tokens": found.tokens,
    }


def build(spec: Spec, rollouts: ServiceRollouts, clock: Clock) -> Any:
    """The ``GRPOTrainer``: the builtin loop's recipe in TRL's terms."""
    import torch
    import transformers
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(spec.threads)
    model = load_model(spec.model_dir)  # fp32, and generation stops at <|im_end|>
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(spec.tokenizer_dir)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = "<|endoftext|>"
    args = GRPOConfig(
        output_dir=str(Path(spec.checkpoints) / "trl-run"),
        per_device_train_batch_size=spec.prompts_per_step * spec.group_size,
        gradient_accumulation_steps=1,
        num_generations=spec.group_size,
        max_completion_length=spec.max_tokens,
        temperature=spec.temperature,
        learning_rate=spec.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=0.0,  # the builtin learner does not clip gradients either
        beta=0.0,
        epsilon=spec.clip,
        loss_type="dapo",  # token-level, as the builtin learner
        max_steps=spec.steps,
        shuffle_dataset=False,
        seed=spec.seed,
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )

    def timed_rollouts(prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        t0 = time.monotonic()
        out = rollouts(prompts, trainer)
        clock.rollout_end = time.monotonic()
        clock.rollout_s = clock.rollout_end - t0
        # Before TRL trains on them: the policy is still the version the engine served.
        clock.fid = fidelity(trainer.model, rollouts.last_results, int(trainer.state.global_step))
        return out

    own = spec.generation == "trl"  # TRL generates; the engine only evaluates
    service: dict[str, Any] = {} if own else {"rollout_func": timed_rollouts}
    return GRPOTrainer(
        model=model,
        reward_funcs=local_reward if own else service_reward,
        args=args,
        train_dataset=Dataset.from_list(_jobs(spec)),
        processing_class=tokenizer,
        **service,
    )


def metrics_callback(spec: Spec, rollouts: ServiceRollouts, clock: Clock, sync: Any) -> Any:
    """After each step (and after ``sync`` loaded its weights): the step's line."""
    from transformers import TrainerCallback

    class Metrics(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.final = 0.0
            self.pending: dict[str, Any] | None = None

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            clock.step_begin = time.monotonic()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            step = int(state.global_step)
            evaluating = step % max(spec.eval_every, 1) == 0 or step == spec.steps
            own = spec.generation == "trl"
            t2 = time.monotonic()
            if evaluating or not own:  # TRL's own generation needs the engine only to evaluate
                sync.on_step_end(args, state, control, **kw)
            t3 = time.monotonic()
            line: dict[str, Any] = {
                "mode": "sync",
                "trainer": "trl",
                "generation": spec.generation,
                "step": step,
                "wall_s": round(t3 - clock.start, 3),
                **(self._own_figures() if own else self._service_figures()),
                "loss": None,  # TRL logs the step's loss after this callback: on_log
                "groups_filtered": 0,
                "weight_sync_s": round(t3 - t2, 3),
            }
            if own:  # generation is inside TRL's step
                line |= {"rollout_wait_s": None, "train_s": round(t2 - clock.step_begin, 3)}
                clock.totals["train_s"] += t2 - clock.step_begin
            else:
                line["rollout_wait_s"] = round(clock.rollout_s, 3)
                line["train_s"] = round(t3 - clock.rollout_end, 3)
                clock.totals["rollout_s"] += clock.rollout_s
                clock.totals["train_s"] += t3 - clock.rollout_end
            if evaluating:
                t4 = time.monotonic()
                self.final = line["eval_pass_at_1"] = evaluate(rollouts, spec)
                clock.totals["eval_s"] += time.monotonic() - t4
            self.pending = line

        def _service_figures(self) -> dict[str, Any]:
            results = rollouts.last_results
            groups = [
                Group(str(i), {}, results[i : i + spec.group_size])
                for i in range(0, len(results), spec.group_size)
            ]
            return {**step_figures(groups), **clock.fid}

        def _own_figures(self) -> dict[str, Any]:
            """Filled from TRL's log of the step (on_log); no engine, no versions."""
            none = ("reward_mean", "pass_rate", "tokens", "weight_version_min")
            return {k: None for k in none} | {
                "weight_version_max": None,
                "logprob_diff_mean": None,
                "logprob_diff_max": None,
                "fidelity_tokens": 0,
            }

        def on_log(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            logs = kw.get("logs") or {}
            if self.pending is not None and "loss" in logs:
                self.pending["loss"] = float(logs["loss"])
                if self.pending["generation"] == "trl":
                    batch = spec.prompts_per_step * spec.group_size
                    self.pending["reward_mean"] = float(logs["reward"])
                    self.pending["pass_rate"] = float(logs["reward"])
                    length = float(logs["completions/mean_length"])
                    self.pending["tokens"] = round(length * batch)
                self._write()

        def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self._write()

        def _write(self) -> None:
            line, self.pending = self.pending, None
            if line is None:
                return
            with open(spec.metrics, "a") as f:
                f.write(json.dumps(line) + "\n")
            _say(
                f"trl step {line['step']:>3}/{spec.steps}  reward {line['reward_mean'] or 0:.3f}  "
                f"versions {line['weight_version_min']}-{line['weight_version_max']}  "
                f"|dlogp| max {_sci(line['logprob_diff_max'])}  "
                f"rollout {line['rollout_wait_s'] or 0:.1f} s  train {line['train_s']:.1f} s"
                + (f" eval {line['eval_pass_at_1']:.3f}" if "eval_pass_at_1" in line else "")
                + "\n"
            )

    return Metrics()


def _say(line: str) -> None:
    """A progress line for ``train_demo.run`` (which shows lines starting with "trl")."""
    sys.stdout.write(line)
    sys.stdout.flush()


def _sci(value: float | None) -> str:
    return "-" if value is None else f"{value:.1e}"


def main(argv: list[str]) -> int:
    spec = msgspec.json.decode(Path(argv[0]).read_bytes(), type=Spec)
    clock = Clock()
    tokenizer_files = [Path(spec.tokenizer_dir) / name for name in TOKENIZER_FILES]
    with ServiceRollouts([spec.url], timeout_s=spec.timeout_s) as rollouts:
        initial = evaluate(rollouts, spec)
        _say(f"trl: warm start {initial:.3f}; {spec.steps} steps\n")
        clock.start = time.monotonic()
        sync = weight_sync_callback(rollouts, spec.checkpoints, tokenizer_files=tokenizer_files)
        trainer = build(spec, rollouts, clock)
        metrics = metrics_callback(spec, rollouts, clock, sync)
        trainer.add_callback(metrics)
        trainer.train()
        wall = time.monotonic() - clock.start
        final = Path(spec.checkpoints) / "trl-final"
        save_policy(trainer.model, final, tokenizer_files)
    training = wall - clock.totals["eval_s"]
    summary = {
        "steps": spec.steps,
        "wall_s": wall,
        "steps_per_min": 60.0 * spec.steps / max(training, 1e-9),
        "initial_pass_at_1": initial,
        "final_pass_at_1": metrics.final,
        "final_checkpoint": str(final),
        **clock.totals,
    }
    Path(spec.summary).write_text(json.dumps(summary) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
