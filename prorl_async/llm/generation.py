"""Types shared by the LLM backend pool (producer) and the agent loop (consumer)."""

from __future__ import annotations

from typing import Any, Protocol

import msgspec

__all__ = ["Generation", "Generator"]


class Generation(msgspec.Struct, frozen=True):
    """One completion exactly as the engine returned it (token ids in, token ids out).

    ``finish_reason`` is ``"stop"`` or ``"length"`` (engine vocabulary normalised).
    ``clamped`` counts logprobs that were missing or non-finite and were replaced.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    backend: str
    weight_version: int | str | None = None
    clamped: int = 0


class Generator(Protocol):
    """Something that completes a prompt given as token ids (a backend lease)."""

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
