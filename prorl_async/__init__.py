"""prorl-async: rollout-as-a-service for RL training of multi-turn LLM agents.

Public names are imported lazily, so ``python -m prorl_async.toolserver`` (which
runs inside every sandbox) does not pay for aiohttp, tokenizers and the rest.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from prorl_async.util.version import __version__

_EXPORTS = {
    "AgentHandler": "prorl_async.core.handler",
    "HandlerRegistry": "prorl_async.core.handler",
    "InstanceError": "prorl_async.core.handler",
    "Job": "prorl_async.core.job",
    "PausableTimer": "prorl_async.util.timer",
    "ServerConfig": "prorl_async.config",
    "load_config": "prorl_async.config",
    "RolloutClient": "prorl_async.client",
    "build_app": "prorl_async.api.app",
    "run_server": "prorl_async.api.app",
    "BackendPool": "prorl_async.llm.pool",
    "BackendError": "prorl_async.llm.pool",
    "PoolConfig": "prorl_async.llm.pool",
    "Generation": "prorl_async.llm.generation",
    "ChatTokenizer": "prorl_async.llm.tokenizer",
    "load_tokenizer": "prorl_async.llm.tokenizer",
    "Trajectory": "prorl_async.llm.agent_loop",
    "ToolBox": "prorl_async.llm.agent_loop",
    "run_agent_loop": "prorl_async.llm.agent_loop",
    "MODEL_TOOLS": "prorl_async.core.agent",
    "SandboxTools": "prorl_async.core.agent",
    "run_agent": "prorl_async.core.agent",
    "start_sandbox": "prorl_async.core.agent",
}

__all__ = [
    "MODEL_TOOLS",
    "AgentHandler",
    "BackendError",
    "BackendPool",
    "ChatTokenizer",
    "Generation",
    "HandlerRegistry",
    "InstanceError",
    "Job",
    "PausableTimer",
    "PoolConfig",
    "RolloutClient",
    "SandboxTools",
    "ServerConfig",
    "ToolBox",
    "Trajectory",
    "build_app",
    "load_config",
    "load_tokenizer",
    "run_agent",
    "run_agent_loop",
    "run_server",
    "start_sandbox",
    "__version__",
]

if TYPE_CHECKING:
    from prorl_async.api.app import build_app, run_server
    from prorl_async.client import RolloutClient
    from prorl_async.config import ServerConfig, load_config
    from prorl_async.core.agent import MODEL_TOOLS, SandboxTools, run_agent, start_sandbox
    from prorl_async.core.handler import AgentHandler, HandlerRegistry, InstanceError
    from prorl_async.core.job import Job
    from prorl_async.llm.agent_loop import ToolBox, Trajectory, run_agent_loop
    from prorl_async.llm.generation import Generation
    from prorl_async.llm.pool import BackendError, BackendPool, PoolConfig
    from prorl_async.llm.tokenizer import ChatTokenizer, load_tokenizer
    from prorl_async.util.timer import PausableTimer


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'prorl_async' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
