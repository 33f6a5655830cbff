"""Types shared by the LLM backend pool (producer) and the agent loop (consumer)."""

from __future__ import annotations

from typing import Any, Protocol

import msgspec

__all__ = ["Generation", "Generator", "Segment", "Version"]

Version = int | str | None


class Segment(msgspec.Struct, frozen=True):
    """Tokens ``[start, end)`` of a generation, made by the weights of ``weight_version``.

    ``weight_version_end`` is set when the segment spans an update whose boundary the
    engine cannot report (a ``keep``-mode pause froze the request across a weight load):
    its tokens came from ``weight_version`` up to an unknown point, then from this one.
    """

    start: int
    end: int
    weight_version: Version
    weight_version_end: Version = None


class Generation(msgspec.Struct, frozen=True):
    """One completion exactly as the engine returned it (token ids in, token ids out).

    ``finish_reason`` is ``"stop"`` or ``"length"`` (engine vocabulary normalised); an
    engine call may also end ``"abort"`` (partial output), which the pool continues.
    ``clamped`` counts logprobs that were missing or non-finite and were replaced.
    ``segments`` says which weights made which tokens when a turn was interrupted by a
    weight update; empty means one segment, all of it by ``weight_version``.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    backend: str
    weight_version: Version = None
    clamped: int = 0
    segments: list[Segment] = msgspec.field(default_factory=list)

    def segment_list(self) -> list[Segment]:
        """The segments, the default one spelled out."""
        return self.segments or [Segment(0, len(self.token_ids), self.weight_version)]


class Generator(Protocol):
    """Something that completes a prompt given as token ids (a backend lease).

    It may also have ``max_model_len`` (its engine's context window): the agent loop then
    never asks for more room than that.
    """

    async def generate(
        self, prompt_ids: list[int], max_tokens: int, sampling: dict[str, Any]
    ) -> Generation:
        """Complete ``prompt_ids`` with at most ``max_tokens`` new tokens.

        ``sampling`` holds the job's other sampling parameters (temperature, top_p, stop...),
        passed to the engine under its own names. ``prompt_ids`` is the agent loop's own
        buffer, lent for the call (not copied, so a turn costs the same at any context
        length): read it, do not change it or keep it past the call.
        """
        ...
