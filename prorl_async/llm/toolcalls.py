"""Parse Hermes/Qwen-style tool calls out of a model's decoded output.

The form is ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, several per turn
allowed. The decoded text is used for parsing only; the token ids stay as the model produced
them. A call that cannot be parsed becomes a :class:`MalformedToolCall` so the loop can tell
the model what was wrong instead of failing the rollout.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

__all__ = ["MalformedToolCall", "ToolCall", "ToolCallError", "parse_tool_calls"]

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"


class ToolCall(msgspec.Struct, frozen=True):
    """One well-formed call: a tool name and its JSON-object arguments."""

    name: str
    arguments: dict[str, Any]


class MalformedToolCall(msgspec.Struct, frozen=True):
    """A ``<tool_call>`` block that could not be parsed; ``error`` says why, for the model."""

    raw: str
    error: str
    name: str | None = None


class ToolCallError(Exception):
    """Raised by a tool to report a bad call back to the model as the observation."""


def parse_tool_calls(text: str) -> list[ToolCall | MalformedToolCall]:
    """All tool calls in ``text``, in order (an unterminated last block is malformed)."""
    calls: list[ToolCall | MalformedToolCall] = []
    pos = text.find(OPEN_TAG)
    while pos >= 0:
        start = pos + len(OPEN_TAG)
        end = text.find(CLOSE_TAG, start)
        if end < 0:
            calls.append(MalformedToolCall(raw=text[start:], error=f"missing {CLOSE_TAG}"))
            break
        calls.append(_parse_one(text[start:end]))
        pos = text.find(OPEN_TAG, end + len(CLOSE_TAG))
    return calls


def _parse_one(raw: str) -> ToolCall | MalformedToolCall:
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        return MalformedToolCall(raw=raw, error=f"tool call is not valid JSON: {exc}")
    if not isinstance(data, dict):
        return MalformedToolCall(raw=raw, error="tool call must be a JSON object")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        return MalformedToolCall(raw=raw, error='tool call needs a string "name"')
    arguments = _arguments(data.get("arguments", {}))
    if arguments is None:
        return MalformedToolCall(
            raw=raw, error=f'"arguments" of {name!r} must be a JSON object', name=name
        )
    return ToolCall(name=name, arguments=arguments)


def _arguments(value: Any) -> dict[str, Any] | None:
    # Some models emit the arguments object as a JSON string (OpenAI style); accept that too.
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    return value if isinstance(value, dict) else None
