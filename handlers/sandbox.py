"""Built-in ``sandbox`` task: a general-purpose agent in a sandbox, scored by a shell command.

Instance::

    {"prompt": str, "tools": ["bash", "python", "str_replace_editor"], "files": {path: text},
     "network": false, "reward_command": str | null, "max_turns": int, "system": str?}

INIT starts the sandbox with the files; RUN runs the agent loop with the tools (plus
``finish``) and then ``reward_command`` in the same sandbox, keeping its exit code and
output; EVAL turns exit code 0 into reward 1.0.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from prorl_async import (
    MODEL_TOOLS,
    AgentHandler,
    InstanceError,
    Job,
    SandboxTools,
    run_agent,
    start_sandbox,
)
from prorl_async.config import ServerConfig
from prorl_async.sandbox import SandboxSpec, SpecError

DEFAULT_SYSTEM = (
    "You are an agent working in a Linux sandbox. Use the tools to do the task, then call "
    "finish with your answer."
)


class SandboxInstance(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    prompt: Annotated[str, msgspec.Meta(min_length=1)]
    tools: list[str] = msgspec.field(default_factory=lambda: ["bash"])
    files: dict[str, str] = msgspec.field(default_factory=dict)
    network: bool = False
    reward_command: str | None = None
    reward_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 60.0
    max_turns: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 16
    system: str = DEFAULT_SYSTEM


class SandboxTaskHandler(AgentHandler):
    """The general-purpose sandbox task."""

    name = "sandbox"
    instance_type = SandboxInstance

    def validate(self, instance: dict[str, Any]) -> Any:
        inst: SandboxInstance = super().validate(instance)
        unknown = sorted(set(inst.tools) - MODEL_TOOLS)
        if unknown:
            raise InstanceError(
                f"instance.tools: unknown {unknown}; choose from {sorted(MODEL_TOOLS)}"
            )
        try:
            SandboxSpec(files=inst.files, network=inst.network).validate()
        except SpecError as exc:
            raise InstanceError(f"instance.{exc}") from None
        return inst

    def admit(self, instance: Any, config: ServerConfig) -> None:
        if instance.network and not config.sandbox.allow_network:
            raise InstanceError(
                "instance.network: sandboxes with network are disabled on this server "
                "(the operator enables them with [sandbox] allow_network = true)"
            )

    async def init(self, job: Job) -> None:
        inst: SandboxInstance = job.instance
        limits = job.shared.config.sandbox_limits
        spec = SandboxSpec(files=inst.files, network=inst.network, limits=limits)
        job.state["sandbox"] = await start_sandbox(job, spec)

    async def run(self, job: Job) -> None:
        inst: SandboxInstance = job.instance
        sandbox = job.state["sandbox"]
        messages = [
            {"role": "system", "content": inst.system},
            {"role": "user", "content": inst.prompt},
        ]
        await run_agent(
            job,
            messages=messages,
            tools=SandboxTools(sandbox, inst.tools, job),
            max_turns=inst.max_turns,
        )
        if inst.reward_command is not None:
            result = await sandbox.exec(inst.reward_command, timeout=inst.reward_timeout_s)
            job.state["reward_exit_code"] = result.exit_code
            job.state["reward_output"] = (result.stdout + result.stderr)[-4000:]

    async def eval(self, job: Job) -> None:
        code = job.state.get("reward_exit_code")
        job.reward = None if code is None else (1.0 if code == 0 else 0.0)
        job.eval = {
            "reward_command": job.instance.reward_command,
            "exit_code": code,
            "output": job.state.get("reward_output"),
            "finish": getattr(job.trajectory, "finish", None),
            "answer": getattr(job.trajectory, "answer", None),
        }
