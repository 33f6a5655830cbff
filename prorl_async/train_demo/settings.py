"""What a training run is made of: its size, its learning rates, where it writes.

The defaults are the best recipe measured so far (docs/performance.md, "train-demo"):
a warm start near 0.2 held-out pass@1 and a GRPO rate that improves it without
collapsing; both modes take minutes on an idle 2-core machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = ["MODES", "TRAINERS", "Mode", "Settings", "Trainer", "model_config"]

Mode = Literal["async", "sync"]
MODES: tuple[Mode, ...] = ("async", "sync")
Trainer = Literal["builtin", "trl"]
TRAINERS: tuple[Trainer, ...] = ("builtin", "trl")


@dataclass(frozen=True)
class Settings:
    """One ``train-demo`` run (``--mode both`` runs ``async`` then ``sync``)."""

    out: Path = Path("train-demo-out")
    modes: tuple[Mode, ...] = MODES
    # The learner: this package's GRPO loop, or TRL's GRPOTrainer (sync only: it
    # generates and trains in turn).
    trainer: Trainer = "builtin"
    # With trainer "trl": rollouts through the service ("service"), or TRL's own HF
    # generation on CPU ("trl", for comparison; the engine then only evaluates).
    trl_generation: Literal["service", "trl"] = "service"
    steps: int = 40
    prompts_per_step: int = 48
    group_size: int = 8
    max_tokens: int = 16
    temperature: float = 1.0
    seed: int = 0
    # The warm start: supervised steps on the task, then GRPO from there.
    # At most ``sft_steps`` steps, stopped at the first check (every ``sft_check_every``
    # steps) where greedy decoding answers ``sft_stop_at`` of 200 validation problems
    # (training problems the warm start never trains on): the same start on any CPU,
    # where a fixed step count is not (600 steps gave 0.225 on one machine, 0.93 on
    # another). None: exactly ``sft_steps`` steps.
    sft_steps: int = 2000
    sft_stop_at: float | None = 0.2
    sft_check_every: int = 25
    sft_batch: int = 128
    sft_lr: float = 2e-3
    lr: float = 2e-4
    clip: float = 0.2
    # Optimiser steps a batch is split into (the clipped ratio keeps them near the batch's
    # policy): more learning from each rollout, more learner time to overlap.
    minibatches: int = 1
    # Groups whose samples all scored the same teach nothing: dropped (None keeps all).
    group_filter: str | None = "nonzero_std"
    # Held-out greedy pass@1: at the start, every ``eval_every`` steps, and at the end.
    eval_every: int = 10
    eval_problems: int = 200
    # The policy: a tiny Qwen3 (head_dim 32: vLLM CPU's attention takes 32, 64, ...).
    hidden_size: int = 128
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 32
    intermediate_size: int = 512
    # Bounds: a step, a learner call, a held-out evaluation.
    step_timeout_s: float = 600.0
    learner_timeout_s: float = 600.0
    extra: dict[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        """Raise ``ValueError`` naming the first setting out of range."""
        for name in ("steps", "prompts_per_step", "group_size", "max_tokens", "eval_problems"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.group_size < 2:
            raise ValueError(f"group_size: GRPO needs >= 2 samples a prompt, got {self.group_size}")
        if not 0 < self.max_tokens <= 64:
            raise ValueError(f"max_tokens: 1..64 (the answers fit), got {self.max_tokens}")
        if self.sft_steps < 0 or self.eval_every < 0:
            raise ValueError("sft_steps and eval_every: must be >= 0")
        if self.sft_stop_at is not None and not 0 < self.sft_stop_at <= 1:
            raise ValueError(f"sft_stop_at: in (0, 1], got {self.sft_stop_at}")
        if self.sft_check_every < 1:
            raise ValueError(f"sft_check_every: must be >= 1, got {self.sft_check_every}")
        if not self.modes or any(m not in MODES for m in self.modes):
            raise ValueError(f"modes: any of {MODES}, got {self.modes}")
        if self.trainer not in TRAINERS:
            raise ValueError(f"trainer: one of {TRAINERS}, got {self.trainer!r}")
        if self.trainer == "trl" and self.modes != ("sync",):
            raise ValueError(
                "mode: TRL's GRPOTrainer generates, then trains, in turn: --trainer trl "
                f"runs --mode sync only, got {'/'.join(self.modes)}"
            )


def model_config(
    s: Settings, vocab_size: int, special: dict[str, int], max_len: int
) -> dict[str, Any]:
    """The ``transformers.Qwen3Config`` fields of the policy (``special``: token ids;
    ``max_len``: its context window)."""
    return {
        "vocab_size": vocab_size,
        "hidden_size": s.hidden_size,
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "head_dim": s.head_dim,
        "intermediate_size": s.intermediate_size,
        "max_position_embeddings": max_len,
        # Untied: vLLM CPU 0.32's in-place reload_weights leaves a tied lm_head stale.
        "tie_word_embeddings": False,
        "bos_token_id": special["<|endoftext|>"],
        "eos_token_id": [special["<|im_end|>"], special["<|endoftext|>"]],
        "pad_token_id": special["<|endoftext|>"],
    }
