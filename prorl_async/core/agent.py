"""Glue for handlers: sandbox tools as a ``ToolBox`` and one call that runs the agent loop.

A handler's RUN stage is usually::

    sandbox = job.state["sandbox"]           # started in INIT with start_sandbox()
    tools = SandboxTools(sandbox, ["bash", "python"], job)
    await run_agent(job, messages=[...], tools=tools)
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from prorl_async.llm.agent_loop import FINISH_TOOL_SPEC, ToolBox, Trajectory, run_agent_loop
from prorl_async.llm.toolcalls import ToolCallError
from prorl_async.sandbox import LazySandbox, SandboxHandle, SandboxSpec
from prorl_async.toolserver.client import ToolServerError

if TYPE_CHECKING:
    from prorl_async.core.job import Job

__all__ = ["MODEL_TOOLS", "TOOL_SPECS", "SandboxTools", "run_agent", "start_sandbox"]


def _spec(
    name: str, description: str, props: dict[str, Any], required: list[str]
) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": props, "required": required},
        },
    }


_TIMEOUT = {"type": "number", "description": "Seconds before the call is interrupted."}
TOOL_SPECS: dict[str, dict[str, Any]] = {
    "bash": _spec(
        "bash",
        "Run a command in a persistent bash shell in the workspace (state persists).",
        {"command": {"type": "string"}, "timeout": _TIMEOUT},
        ["command"],
    ),
    "python": _spec(
        "python",
        "Execute code in a persistent IPython kernel (variables persist between calls).",
        {"code": {"type": "string"}, "timeout": _TIMEOUT},
        ["code"],
    ),
    "str_replace_editor": _spec(
        "str_replace_editor",
        "View, create and edit files in the workspace.",
        {
            "command": {"enum": ["view", "create", "str_replace", "insert", "undo_edit"]},
            "path": {"type": "string"},
            "file_text": {"type": "string"},
            "old_str": {"type": "string"},
            "new_str": {"type": "string"},
            "insert_line": {"type": "integer"},
            "view_range": {"type": "array", "items": {"type": "integer"}},
        },
        ["command", "path"],
    ),
}
MODEL_TOOLS = frozenset(TOOL_SPECS)


class SandboxTools:
    """The model-facing tools of one sandbox (plus ``finish``, handled by the loop)."""

    def __init__(self, sandbox: SandboxHandle, names: list[str], job: Job | None = None) -> None:
        unknown = [n for n in names if n not in MODEL_TOOLS]
        if unknown:
            raise ValueError(f"tools: unknown tool(s) {unknown}; choose from {sorted(MODEL_TOOLS)}")
        self.sandbox = sandbox
        self.names = list(dict.fromkeys(names))
        self._metrics = None if job is None else job.shared.metrics

    @property
    def specs(self) -> list[dict[str, Any]]:
        return [TOOL_SPECS[n] for n in self.names] + [FINISH_TOOL_SPEC]

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        if name not in self.names:
            raise ToolCallError(f"unknown tool {name!r}; available: {', '.join(self.names)}")
        t0 = time.monotonic()
        try:
            result = await self.sandbox.call(name, arguments)
        except ToolServerError as exc:
            raise RuntimeError(f"tool server of the sandbox failed: {exc}") from exc
        finally:
            if self._metrics is not None:
                self._metrics.tool_called(name, time.monotonic() - t0)
        if not result.ok:
            raise ToolCallError(result.error or f"{name} failed")
        return result.output


async def start_sandbox(job: Job, spec: SandboxSpec) -> SandboxHandle:
    """Start a sandbox the job holds: it is closed after RUN, on failure, cancel or timeout.

    With the server's ``sandbox_start = "on_first_use"`` the spec is checked now and a
    ``LazySandbox`` returned at once: the sandbox starts when first used, under the job's
    scope then (a rollout that uses no tool never starts one).
    """
    runtime = job.shared.runtime
    if runtime is None:
        raise RuntimeError("no sandbox runtime is configured on this server")
    if job.shared.config.sandbox_start == "on_first_use":
        lazy = LazySandbox(runtime, spec, lambda: job.scope)
        return await job.hold(lazy, live=lambda: lazy.started and not lazy.closed)
    return await job.hold(await runtime.start(spec, job.scope))


async def run_agent(
    job: Job,
    *,
    messages: list[dict[str, Any]],
    tools: ToolBox,
    max_turns: int | None = None,
) -> Trajectory:
    """Run the token-in/token-out loop on one backend lease; the trajectory lands on the job.

    ``job.trajectory`` is set before the first call so a timeout or cancel keeps every turn.
    """
    shared, config = job.shared, job.shared.config
    if shared.pool is None or shared.tokenizer is None:
        raise RuntimeError("this server has no LLM backend pool or tokenizer")
    trajectory = Trajectory()
    job.trajectory = trajectory
    sampling = dict(job.sampling_params)
    max_tokens = int(sampling.pop("max_tokens", config.max_tokens))
    try:
        async with shared.pool.lease(job.timer) as llm:
            await run_agent_loop(
                generator=llm,
                tokenizer=shared.tokenizer,
                messages=messages,
                tools=tools,
                trajectory=trajectory,
                max_turns=max_turns or config.max_turns,
                max_model_len=config.max_model_len,
                sampling=sampling,
                max_tokens=max_tokens,
            )
    finally:
        if shared.metrics is not None and trajectory.clamped_logprobs:
            shared.metrics.clamped_logprobs.inc(trajectory.clamped_logprobs)
    return trajectory
