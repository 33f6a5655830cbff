"""A scripted LLM server: a TEST DOUBLE for vLLM and SGLang.

It speaks the engines' token-id protocols (vLLM ``POST /v1/completions`` with
``return_token_ids`` / ``return_tokens_as_token_ids``, ``GET /v1/models``; SGLang
``POST /generate``; ``GET /health``) so the rollout server, its backend pool and the
agent loop can be exercised end to end without a GPU. What it says comes from a
pluggable :class:`Policy` (``finish``, ``echo``, ``random_tools``), its logprobs are
deterministic synthetic values, its timing follows a :class:`LatencyModel`, and
:class:`Faults` injects 5xx, hangs, dropped connections and NaN/missing logprobs.

Real training points the rollout server at vLLM or SGLang, never at this.
"""

from __future__ import annotations

from prorl_async.scripted_llm._cli import build_parser, main
from prorl_async.scripted_llm._tokenizer import load_tokenizer
from prorl_async.scripted_llm.faults import Faults
from prorl_async.scripted_llm.latency import LatencyModel, Stats
from prorl_async.scripted_llm.policies import (
    POLICIES,
    EchoPolicy,
    FinishPolicy,
    Policy,
    RandomToolsPolicy,
    make_policy,
)
from prorl_async.scripted_llm.records import LogEntry, Reply
from prorl_async.scripted_llm.server import ScriptedLLM, synthetic_logprob

__all__ = [
    "POLICIES",
    "EchoPolicy",
    "Faults",
    "FinishPolicy",
    "LatencyModel",
    "LogEntry",
    "Policy",
    "RandomToolsPolicy",
    "Reply",
    "ScriptedLLM",
    "Stats",
    "build_parser",
    "load_tokenizer",
    "main",
    "make_policy",
    "synthetic_logprob",
]
