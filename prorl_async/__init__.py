"""prorl-async: rollout-as-a-service for RL training of multi-turn LLM agents.

Public names are imported lazily, so ``python -m prorl_async.toolserver`` (which
runs inside every sandbox) does not pay for aiohttp, tokenizers and the rest.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "AgentHandler": "prorl_async.handler",
    "HandlerRegistry": "prorl_async.handler",
    "InstanceError": "prorl_async.handler",
    "Job": "prorl_async.job",
    "PausableTimer": "prorl_async.timer",
    "ServerConfig": "prorl_async.config",
    "load_config": "prorl_async.config",
    "RolloutClient": "prorl_async.client",
    "build_app": "prorl_async.app",
    "run_server": "prorl_async.app",
    "BackendPool": "prorl_async.backends",
    "BackendError": "prorl_async.backends",
    "PoolConfig": "prorl_async.backends",
    "Generation": "prorl_async.generation",
    "ChatTokenizer": "prorl_async.tokenizer",
    "load_tokenizer": "prorl_async.tokenizer",
    "Trajectory": "prorl_async.agent_loop",
    "ToolBox": "prorl_async.agent_loop",
    "run_agent_loop": "prorl_async.agent_loop",
    "SandboxTools": "prorl_async.agent_task",
    "run_agent": "prorl_async.agent_task",
    "start_sandbox": "prorl_async.agent_task",
}

__all__ = [
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
    from prorl_async.agent_loop import ToolBox, Trajectory, run_agent_loop
    from prorl_async.agent_task import SandboxTools, run_agent, start_sandbox
    from prorl_async.app import build_app, run_server
    from prorl_async.backends import BackendError, BackendPool, PoolConfig
    from prorl_async.client import RolloutClient
    from prorl_async.config import ServerConfig, load_config
    from prorl_async.generation import Generation
    from prorl_async.handler import AgentHandler, HandlerRegistry, InstanceError
    from prorl_async.job import Job
    from prorl_async.timer import PausableTimer
    from prorl_async.tokenizer import ChatTokenizer, load_tokenizer


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'prorl_async' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
