"""The token-in/token-out multi-turn agent loop shared by every task handler.

One growing token buffer: the rendered prompt, then each model output appended as the exact ids
the engine returned (mask 1, its logprobs), then each observation appended as the template
segment :meth:`ChatTokenizer.observation_ids` tokenized on its own (mask 0, logprob 0.0).
Nothing is ever decoded and re-encoded into the buffer; decoded text is only used to find tool
calls. The :class:`Trajectory` is owned by the caller and updated as each turn lands, so a
timeout or cancellation mid-loop still leaves every turn produced so far.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import msgspec

from prorl_async.llm.generation import Generation, Generator, Segment, Version
from prorl_async.llm.tokenizer import ChatTokenizer
from prorl_async.llm.toolcalls import MalformedToolCall, ToolCall, ToolCallError, parse_tool_calls

__all__ = [
    "FINISH_TOOL",
    "FINISH_TOOL_SPEC",
    "TokenDriftError",
    "ToolBox",
    "Trajectory",
    "run_agent_loop",
]

FINISH_TOOL = "finish"
FINISH_TOOL_SPEC: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": FINISH_TOOL,
        "description": "Submit the final answer and end the episode.",
        "parameters": {
            "type": "object",
            "properties": {"answer": {"type": "string", "description": "The final answer."}},
        },
    },
}


class ToolBox(Protocol):
    """The tools one rollout may call (the ``finish`` tool is handled by the loop itself)."""

    @property
    def specs(self) -> list[dict[str, Any]]:
        """JSON-schema tool specs (OpenAI ``{"type": "function", ...}`` form) for the template."""
        ...

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        """Run tool ``name`` and return the observation text.

        Raise :class:`ToolCallError` to report a bad call to the model (the loop goes on); any
        other exception fails the rollout, with the turns so far kept in the trajectory.
        """
        ...


class TokenDriftError(RuntimeError):
    """The token buffer stopped being a pure extension of what came before (a bug)."""


class Trajectory(msgspec.Struct, kw_only=True):
    """One rollout's token-level record, filled in turn by turn (mutable, owned by the job).

    ``finish`` says why the loop ended: ``finish_tool``, ``no_tool_call``, ``length`` (the reply
    was cut by ``max_tokens`` and holds no tool call), ``max_turns`` or ``context_exhausted``.
    """

    prompt_ids: list[int] = msgspec.field(default_factory=list)
    response_ids: list[int] = msgspec.field(default_factory=list)
    response_mask: list[int] = msgspec.field(default_factory=list)
    response_logprobs: list[float] = msgspec.field(default_factory=list)
    # The weight version that made each response token (None for observation tokens).
    response_versions: list[Version] = msgspec.field(default_factory=list)
    turns: list[dict[str, Any]] = msgspec.field(default_factory=list)
    weight_versions: list[int | str] = msgspec.field(default_factory=list)
    finish: str | None = None
    answer: str | None = None
    clamped_logprobs: int = 0

    @property
    def num_turns(self) -> int:
        """Number of assistant turns (LLM calls) so far."""
        return sum(1 for turn in self.turns if turn["role"] == "assistant")

    def add_assistant(self, gen: Generation, text: str) -> None:
        """Append a model output exactly as returned (mask 1, the engine's logprobs)."""
        self.response_ids.extend(gen.token_ids)
        self.response_mask.extend([1] * len(gen.token_ids))
        self.response_logprobs.extend(gen.logprobs)
        self.clamped_logprobs += gen.clamped
        segments = gen.segment_list()
        for seg in segments:
            # A segment spanning an unreported boundary counts as its older version.
            self.response_versions.extend([seg.weight_version] * (seg.end - seg.start))
            self._note_version(seg.weight_version)
            self._note_version(seg.weight_version_end)
        self.turns.append(
            {
                "role": "assistant",
                "token_ids": list(gen.token_ids),
                "logprobs": list(gen.logprobs),
                "text": text,
                "backend": gen.backend,
                # The oldest weights in the turn (what staleness must count).
                "weight_version": segments[0].weight_version if segments else gen.weight_version,
                "segments": [_segment_doc(seg) for seg in segments],
            }
        )

    def _note_version(self, version: Version) -> None:
        if version is not None and version not in self.weight_versions:
            self.weight_versions.append(version)
            self.weight_versions.sort(key=_version_key)

    def add_observation(self, ids: Sequence[int], text: str) -> None:
        """Append a template/observation segment the service tokenized (mask 0, logprob 0)."""
        self.response_ids.extend(ids)
        self.response_mask.extend([0] * len(ids))
        self.response_logprobs.extend([0.0] * len(ids))
        self.response_versions.extend([None] * len(ids))
        self.turns.append({"role": "tool", "token_ids": list(ids), "text": text})

    def to_result(self) -> dict[str, Any]:
        """The trajectory fields of the API result document (copies, safe to serialise)."""
        return {
            "prompt_ids": list(self.prompt_ids),
            "response_ids": list(self.response_ids),
            "response_mask": list(self.response_mask),
            "response_logprobs": list(self.response_logprobs),
            "response_versions": list(self.response_versions),
            "num_turns": self.num_turns,
            "turns": [dict(turn) for turn in self.turns],
            "weight_versions": list(self.weight_versions),
            "finish": self.finish,
            "answer": self.answer,
            "clamped_logprobs": self.clamped_logprobs,
        }


async def run_agent_loop(
    *,
    generator: Generator,
    tokenizer: ChatTokenizer,
    messages: Sequence[Mapping[str, Any]],
    tools: ToolBox,
    trajectory: Trajectory,
    max_turns: int,
    max_model_len: int,
    sampling: dict[str, Any],
    max_tokens: int,
) -> None:
    """Run the model/tool loop until it finishes, filling ``trajectory`` as turns land.

    Ends normally (``trajectory.finish`` set) on a ``finish`` call, a reply without tool calls,
    ``max_turns`` assistant turns, or when the context (``max_model_len``) has no room left.
    """
    _check_limits(max_turns=max_turns, max_model_len=max_model_len, max_tokens=max_tokens)
    loop = _Loop(generator, tokenizer, tools, trajectory, sampling, max_model_len, max_tokens)
    await loop.run(messages, max_turns)


def _check_limits(**limits: int) -> None:
    for name, value in limits.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


class _Loop:
    def __init__(
        self,
        generator: Generator,
        tokenizer: ChatTokenizer,
        tools: ToolBox,
        trajectory: Trajectory,
        sampling: dict[str, Any],
        max_model_len: int,
        max_tokens: int,
    ) -> None:
        self.generator, self.tokenizer, self.tools = generator, tokenizer, tools
        self.traj = trajectory
        # max_tokens is passed on its own, cut to the room left in the context.
        self.sampling = {k: v for k, v in sampling.items() if k != "max_tokens"}
        self.max_model_len, self.max_tokens = max_model_len, max_tokens
        self.specs: list[dict[str, Any]] | None = list(tools.specs) or None
        self.names = {spec.get("function", spec).get("name") for spec in self.specs or []}
        self.buffer: list[int] = []

    async def run(self, messages: Sequence[Mapping[str, Any]], max_turns: int) -> None:
        self.traj.prompt_ids = self.tokenizer.prompt_ids(messages, self.specs)
        self.buffer = list(self.traj.prompt_ids)
        for turn in range(1, max_turns + 1):
            finish = await self._turn(last=turn == max_turns)
            if finish is not None:
                self.traj.finish = finish
                return

    def _context_len(self) -> int:
        # The smaller of the configured window and the engine's own (a lease knows it).
        engine = getattr(self.generator, "max_model_len", None)
        return min(self.max_model_len, engine) if isinstance(engine, int) else self.max_model_len

    async def _turn(self, *, last: bool) -> str | None:
        room = self._context_len() - len(self.buffer)
        if room <= 0:
            return "context_exhausted"
        limit = min(self.max_tokens, room)
        gen = await self.generator.generate(self.buffer, limit, dict(self.sampling))
        self._check_generation(gen, limit)
        text = self.tokenizer.decode(gen.token_ids)
        self.traj.add_assistant(gen, text)
        self._extend(gen.token_ids)
        calls = parse_tool_calls(text)
        if not calls:
            return self._no_call_finish(gen)
        return await self._act(calls, gen, last=last)

    def _no_call_finish(self, gen: Generation) -> str:
        if len(self.buffer) >= self._context_len():
            return "context_exhausted"
        return "length" if gen.finish_reason == "length" else "no_tool_call"

    async def _act(
        self, calls: list[ToolCall | MalformedToolCall], gen: Generation, *, last: bool
    ) -> str | None:
        finish_at = next(
            (i for i, c in enumerate(calls) if isinstance(c, ToolCall) and c.name == FINISH_TOOL),
            None,
        )
        if finish_at is not None:
            # Calls before `finish` still run: their side effects may be what EVAL checks.
            await self._call_all(calls[:finish_at])
            self.traj.answer = _answer(calls[finish_at])
            return "finish_tool"
        if last:
            return "max_turns"
        observations = await self._call_all(calls)
        return self._observe(observations, prev_ended=_ended(gen, self.tokenizer.eos_id))

    async def _call_all(self, calls: list[ToolCall | MalformedToolCall]) -> list[dict[str, Any]]:
        return [await self._call(call) for call in calls]

    async def _call(self, call: ToolCall | MalformedToolCall) -> dict[str, Any]:
        if isinstance(call, MalformedToolCall):
            content = f"Error: malformed tool call: {call.error}"
        elif call.name not in self.names:
            known = ", ".join(sorted(n for n in self.names if n)) or "none"
            content = f"Error: unknown tool {call.name!r} (available: {known})"
        else:
            try:
                content = await self.tools.call(call.name, call.arguments)
            except ToolCallError as exc:
                content = f"Error: {exc}"
        return {"role": "tool", "name": call.name or "", "content": content}

    def _observe(self, observations: list[dict[str, Any]], *, prev_ended: bool) -> str | None:
        text, ids = self.tokenizer.observation_segment(
            observations, prev_ended=prev_ended, tools=self.specs
        )
        # The observation must leave room for at least one generated token.
        if len(self.buffer) + len(ids) >= self._context_len():
            return "context_exhausted"
        self.traj.add_observation(ids, text)
        self._extend(ids)
        return None

    def _extend(self, ids: Sequence[int]) -> None:
        # Checks only what this turn added, so a turn costs the same at 1k or 32k tokens.
        start = len(self.buffer) - len(self.traj.prompt_ids)
        self.buffer.extend(ids)
        response = self.traj.response_ids
        in_step = len(self.traj.prompt_ids) + len(response) == len(self.buffer)
        if not in_step or response[start:] != list(ids):
            raise TokenDriftError("token buffer is no longer prompt_ids + response_ids")

    def _check_generation(self, gen: Generation, limit: int) -> None:
        if len(gen.token_ids) != len(gen.logprobs):
            raise ValueError(
                f"backend {gen.backend} returned {len(gen.token_ids)} token ids "
                f"but {len(gen.logprobs)} logprobs"
            )
        if len(gen.token_ids) > limit:
            raise ValueError(
                f"backend {gen.backend} returned {len(gen.token_ids)} tokens "
                f"with max_tokens {limit}"
            )


def _segment_doc(seg: Segment) -> dict[str, Any]:
    doc: dict[str, Any] = {"start": seg.start, "end": seg.end, "weight_version": seg.weight_version}
    if seg.weight_version_end is not None:
        doc["weight_version_end"] = seg.weight_version_end
    return doc


def _version_key(version: int | str) -> tuple[int, int | str]:
    # Numbers in order, then strings in order (a mix of both is allowed on the wire).
    return (1, version) if isinstance(version, str) else (0, version)


def _ended(gen: Generation, eos_id: int) -> bool:
    return bool(gen.token_ids) and gen.token_ids[-1] == eos_id


def _answer(call: ToolCall | MalformedToolCall) -> str | None:
    value = call.arguments.get("answer") if isinstance(call, ToolCall) else None
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value)
