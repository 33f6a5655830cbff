"""Rootless sandboxes for agent tools: bwrap, apptainer and local runtimes.

``get_runtime(name, config).start(spec)`` returns a running :class:`Sandbox`, an
async context manager whose ``aclose()`` leaves no process, socket, directory,
loopback address or record behind. A :class:`LazySandbox` starts one on first use;
both are a :class:`SandboxHandle`, what a task handler uses of its sandbox.
"""

from __future__ import annotations

from prorl_async.sandbox.apptainer import ApptainerRuntime
from prorl_async.sandbox.bwrap import BwrapRuntime, bwrap_problem, find_bwrap
from prorl_async.sandbox.factory import get_runtime
from prorl_async.sandbox.handle import SandboxHandle, ToolChannel
from prorl_async.sandbox.lazy import LazySandbox
from prorl_async.sandbox.limits import LimitsError, SandboxLimits, describe_enforcement
from prorl_async.sandbox.local import LocalRuntime
from prorl_async.sandbox.loopback import LoopbackAllocator, LoopbackExhaustedError, LoopbackLease
from prorl_async.sandbox.records import SandboxRecord, SandboxRecords
from prorl_async.sandbox.runtime import Runtime, RuntimeUnavailableError, SandboxStartError
from prorl_async.sandbox.sandbox import Sandbox
from prorl_async.sandbox.spec import RuntimeConfig, SandboxSpec, SpecError
from prorl_async.sandbox.warm import WarmPool

__all__ = [
    "ApptainerRuntime",
    "BwrapRuntime",
    "LazySandbox",
    "LimitsError",
    "LocalRuntime",
    "LoopbackAllocator",
    "LoopbackExhaustedError",
    "LoopbackLease",
    "Runtime",
    "RuntimeConfig",
    "RuntimeUnavailableError",
    "Sandbox",
    "SandboxHandle",
    "SandboxLimits",
    "SandboxRecord",
    "SandboxRecords",
    "SandboxSpec",
    "SandboxStartError",
    "SpecError",
    "ToolChannel",
    "WarmPool",
    "bwrap_problem",
    "describe_enforcement",
    "find_bwrap",
    "get_runtime",
]
