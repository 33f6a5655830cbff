"""The learner's wire protocol: one JSON object a line each way over its stdin and stdout.

A request is ``{"id": N, "op": "...", ...fields}``; the answer is ``{"id": N, "ok": true,
...}`` or ``{"id": N, "ok": false, "error": "..."}``. The request types below are what the
learner accepts (unknown fields are refused, so a misspelt option is an error, not a
silent default). No torch here: the client and the tests read these names too.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = [
    "OPS",
    "Completion",
    "Envelope",
    "Example",
    "Exit",
    "Grpo",
    "GrpoSample",
    "Init",
    "Logprobs",
    "Request",
    "Save",
    "Sft",
    "Threads",
]


class Envelope(msgspec.Struct):
    """What is read first, so even a refused request is answered with its id."""

    id: int | None = None
    op: str | None = None


class _Request(msgspec.Struct, tag_field="op", forbid_unknown_fields=True, kw_only=True):
    id: int


class Init(_Request, tag="init"):
    """Build the policy: seeded random weights from ``config`` or a checkpoint ``model_dir``."""

    config: dict[str, Any] | None = None
    model_dir: str | None = None
    seed: int = 0
    # torch threads and the CPUs the process may run on (None: leave as they are).
    threads: int | None = None
    cpus: list[int] | None = None
    lr: float = 1e-3
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8


class Threads(_Request, tag="threads"):
    """Change the learner's placement between phases (torch threads, CPU affinity)."""

    threads: int
    cpus: list[int] | None = None


class Example(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    prompt_ids: list[int]
    target_ids: list[int]


class Sft(_Request, tag="sft"):
    """Cross-entropy on the target tokens of mini-batches drawn (seeded) from ``examples``.

    With ``check`` and ``stop_at``: every ``check_every`` steps, the share of ``check``
    examples whose target greedy decoding reproduces exactly; training stops at the first
    check that reaches ``stop_at`` (``steps`` is then the most it takes)."""

    examples: list[Example]
    steps: int
    batch_size: int
    lr: float | None = None
    seed: int = 0
    check: list[Example] | None = None
    check_every: int = 25
    stop_at: float | None = None


class GrpoSample(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    prompt_ids: list[int]
    response_ids: list[int]
    advantage: float
    # 1 = a model token, 0 = a tool or observation token (no loss); None = all 1.
    response_mask: list[int] | None = None
    # The engine's logprob of each response token (None where it gave none).
    logprobs: list[float | None] | None = None
    # The weight version that made each response token (None where unknown).
    versions: list[int | None] | None = None


class Grpo(_Request, tag="grpo"):
    """One clipped policy-gradient update (``minibatches`` optimiser steps)."""

    samples: list[GrpoSample]
    version: int
    clip: float = 0.2
    clip_low: float | None = None
    clip_high: float | None = None
    lr: float | None = None
    minibatches: int = 1
    max_grad_norm: float | None = None
    # Logits divided by this first; see Logprobs.temperature.
    temperature: float = 1.0


class Completion(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    prompt_ids: list[int]
    response_ids: list[int]


class Logprobs(_Request, tag="logprobs"):
    """The current policy's logprob of every response token (no gradient)."""

    samples: list[Completion]
    # 1 matches vLLM's default raw logprobs (the model's own distribution, whatever the
    # sampling temperature); T matches `--logprobs-mode processed_logprobs` at temperature T.
    temperature: float = 1.0


class Save(_Request, tag="save"):
    """Write an HF checkpoint directory (atomically: ``DIR.tmp``, then a rename)."""

    dir: str
    tokenizer_dir: str | None = None


class Exit(_Request, tag="exit"):
    """Answer, then end the process."""


Request = Init | Threads | Sft | Grpo | Logprobs | Save | Exit
OPS = ("init", "threads", "sft", "grpo", "logprobs", "save", "exit")
