"""``prorl-async train-demo``: a real GRPO loop on CPU, a tiny Qwen3 policy that learns
through the service. The learner (:mod:`.learner`, run in the engine's venv, where torch
is) keeps the policy and its optimiser; :class:`Learner` (no torch) owns that process and
talks to it one JSON request a line.
"""

from __future__ import annotations

from prorl_async.train_demo.learner_client import Learner, LearnerError, LearnerRefused

__all__ = ["Learner", "LearnerError", "LearnerRefused"]
