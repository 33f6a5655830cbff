"""A complete task in one module: ``greeting`` (the worked example of docs/handlers.md).

The model must write ``hello.sh``, a shell script that prints ``Hello, <name>!``.
INIT starts a sandbox; RUN runs the agent loop with ``bash`` and ``str_replace_editor`` and
copies the script out before the sandbox is closed; EVAL runs the script in a FRESH
sandbox and compares what it prints.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from prorl_async import AgentHandler, InstanceError, Job, SandboxTools, run_agent, start_sandbox
from prorl_async.sandbox import SandboxSpec

SYSTEM = "You work in a Linux sandbox. Use the tools, then call finish."


class GreetingInstance(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """What a trainer submits as ``instance``; a wrong field is answered 422, naming it."""

    name: Annotated[str, msgspec.Meta(min_length=1, max_length=100)]
    max_turns: Annotated[int, msgspec.Meta(ge=1, le=50)] = 8


class GreetingHandler(AgentHandler):
    """Task ``greeting``: write a script that greets ``name``."""

    name = "greeting"
    instance_type = GreetingInstance

    def validate(self, instance: dict[str, Any]) -> Any:
        inst: GreetingInstance = super().validate(instance)  # type checks -> 422
        if not inst.name.isprintable():
            raise InstanceError("instance.name: must be printable, on one line")
        return inst

    async def init(self, job: Job) -> None:
        spec = SandboxSpec(limits=job.shared.config.sandbox_limits)
        # Held by the job: closed right after RUN, or on failure, cancel or timeout.
        job.state["sandbox"] = await start_sandbox(job, spec)

    async def run(self, job: Job) -> None:
        inst: GreetingInstance = job.instance
        sandbox = job.state["sandbox"]
        task = f"Write hello.sh, a bash script that prints exactly: Hello, {inst.name}!"
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
        tools = SandboxTools(sandbox, ["bash", "str_replace_editor"], job)
        await run_agent(job, messages=messages, tools=tools, max_turns=inst.max_turns)
        # RUN's sandbox is gone once RUN returns: take what EVAL needs now.
        found = await sandbox.exec("cat hello.sh", timeout=10)
        job.state["script"] = found.stdout if found.exit_code == 0 else None

    async def eval(self, job: Job) -> None:
        expected = f"Hello, {job.instance.name}!"
        script: str | None = job.state["script"]
        output = None
        if script is not None:
            spec = SandboxSpec(files={"hello.sh": script}, limits=job.shared.config.sandbox_limits)
            async with await job.shared.runtime.start(spec, job.scope) as sandbox:
                output = (await sandbox.exec("bash hello.sh", timeout=10)).stdout.strip()
        job.reward = 1.0 if output == expected else 0.0
        job.eval = {"expected": expected, "output": output}

    def run_exception(self, job: Job, exc: BaseException) -> None:
        # Synchronous: record what happened, start no I/O.
        job.state["run_failed"] = type(exc).__name__

    def final_result(self, job: Job) -> dict[str, Any]:
        # Extra top-level fields of the result document (never overriding contract fields).
        return {"script": job.state.get("script")}
