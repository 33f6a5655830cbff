"""What every tool shares: its result type, its error type and argument parsing."""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

import msgspec

__all__ = ["Tool", "ToolError", "ToolOutput", "parse_args"]

T = TypeVar("T")


class ToolError(Exception):
    """A refusal or bad input, reported to the caller as ``ok=False`` with this message."""


class ToolOutput(msgspec.Struct, frozen=True):
    """A tool's answer before the server wraps it in a :class:`Response`."""

    output: str = ""
    data: dict[str, Any] = {}


class Tool(Protocol):
    """A named tool. ``call`` raises :class:`ToolError` for anything the caller got wrong."""

    name: str

    async def call(self, args: dict[str, Any]) -> ToolOutput: ...

    async def aclose(self) -> None: ...


def parse_args(tool: str, args: dict[str, Any], kind: type[T]) -> T:
    """Convert raw ``args`` to ``kind``; the error names the tool and the offending field."""
    try:
        return msgspec.convert(args, kind)
    except msgspec.ValidationError as exc:
        raise ToolError(f"bad arguments for tool {tool!r}: {exc}") from exc
