"""``prorl-async train-demo``: a tiny policy learning two-digit sums by GRPO through the service.

- ``task``: the problems, the held-out split, the ``math`` instances and the trained answer
  (standard library only, so the learner imports it in the engine's venv).
- ``prompt``: the exact first prompt the ``math`` handler's agent loop sends.
- ``vocab``: the small task tokenizer the policy is built on.
- ``learner`` (run in the engine's venv, where torch is) keeps the policy and its
  optimiser; ``Learner`` (``learner_client``, no torch) owns that process and talks to it
  one JSON request a line.
- ``run``: the training run itself (``prorl-async train-demo``).

Public names are imported lazily: importing ``prorl_async.train_demo.task`` in the engine's
venv must not pull in the server side that ``prompt`` and ``vocab`` need.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "Learner": "prorl_async.train_demo.learner_client",
    "LearnerError": "prorl_async.train_demo.learner_client",
    "LearnerRefused": "prorl_async.train_demo.learner_client",
    "Problem": "prorl_async.train_demo.task",
    "answer_text": "prorl_async.train_demo.task",
    "held_out_problems": "prorl_async.train_demo.task",
    "instance": "prorl_async.train_demo.task",
    "is_held_out": "prorl_async.train_demo.task",
    "problem_text": "prorl_async.train_demo.task",
    "problems": "prorl_async.train_demo.task",
    "training_problems": "prorl_async.train_demo.task",
    "prompt_ids": "prorl_async.train_demo.prompt",
    "prompt_messages": "prorl_async.train_demo.prompt",
    "prompt_text": "prorl_async.train_demo.prompt",
    "prompt_tools": "prorl_async.train_demo.prompt",
    "build_task_tokenizer": "prorl_async.train_demo.vocab",
    "model_vocab_size": "prorl_async.train_demo.vocab",
}

__all__ = [
    "Learner",
    "LearnerError",
    "LearnerRefused",
    "Problem",
    "answer_text",
    "build_task_tokenizer",
    "held_out_problems",
    "instance",
    "is_held_out",
    "model_vocab_size",
    "problem_text",
    "problems",
    "prompt_ids",
    "prompt_messages",
    "prompt_text",
    "prompt_tools",
    "training_problems",
]

if TYPE_CHECKING:
    from prorl_async.train_demo.learner_client import Learner, LearnerError, LearnerRefused
    from prorl_async.train_demo.prompt import (
        prompt_ids,
        prompt_messages,
        prompt_text,
        prompt_tools,
    )
    from prorl_async.train_demo.task import (
        Problem,
        answer_text,
        held_out_problems,
        instance,
        is_held_out,
        problem_text,
        problems,
        training_problems,
    )
    from prorl_async.train_demo.vocab import build_task_tokenizer, model_vocab_size


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'prorl_async.train_demo' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
