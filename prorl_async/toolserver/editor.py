"""The ``str_replace_editor`` tool: view, create and edit files inside the workspace.

Paths may be relative to the workspace or absolute, but must resolve (after
``..`` and symlinks) to somewhere inside it. Every change is recorded per file
so ``undo_edit`` can step back through it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Literal

import msgspec

from prorl_async.toolserver._base import ToolError, ToolOutput, parse_args
from prorl_async.toolserver._text import cap_text
from prorl_async.toolserver.files import resolve_path

__all__ = ["EditorTool"]

_SNIPPET_CONTEXT = 4
_LISTING_LIMIT = 500


class _EditorArgs(msgspec.Struct, forbid_unknown_fields=True):
    command: Literal["view", "create", "str_replace", "insert", "undo_edit"]
    path: str
    file_text: str | None = None
    old_str: str | None = None
    new_str: str | None = None
    insert_line: int | None = None
    view_range: list[int] | None = None


def _numbered(lines: list[str], first: int) -> str:
    return "\n".join(f"{n:6}\t{line}" for n, line in enumerate(lines, start=first))


def _require(value: Any, field: str, command: str) -> Any:
    if value is None:
        raise ToolError(f"`{field}` is required for command {command!r}")
    return value


class EditorTool:
    """File viewing and editing confined to ``workspace``, with per-file undo."""

    name = "str_replace_editor"

    def __init__(self, workspace: Path, *, output_cap: int = 16_000) -> None:
        self.workspace = workspace
        self.output_cap = output_cap
        self._history: dict[Path, list[str | None]] = {}

    async def call(self, args: dict[str, Any]) -> ToolOutput:
        parsed = parse_args(self.name, args, _EditorArgs)
        path = resolve_path(self.workspace, parsed.path, confine=True)
        output = await asyncio.to_thread(self._run, parsed, path)
        return ToolOutput(output=cap_text(output, self.output_cap), data={"path": str(path)})

    async def aclose(self) -> None:
        """Nothing to release; present for the common tool interface."""

    def _run(self, args: _EditorArgs, path: Path) -> str:
        if args.command == "view":
            return self._view(path, args.view_range)
        if args.command == "create":
            return self._create(path, _require(args.file_text, "file_text", "create"))
        if args.command == "str_replace":
            old = _require(args.old_str, "old_str", "str_replace")
            return self._str_replace(path, old, args.new_str or "")
        if args.command == "insert":
            line = _require(args.insert_line, "insert_line", "insert")
            return self._insert(path, line, _require(args.new_str, "new_str", "insert"))
        return self._undo(path)

    def _view(self, path: Path, view_range: list[int] | None) -> str:
        if path.is_dir():
            if view_range is not None:
                raise ToolError("`view_range` is not allowed when `path` is a directory")
            return self._listing(path)
        lines = self._read(path).split("\n")
        if view_range is None:
            return _numbered(lines, 1)
        start, end = self._check_range(view_range, len(lines))
        return _numbered(lines[start - 1 : end], start)

    def _check_range(self, view_range: list[int], count: int) -> tuple[int, int]:
        if len(view_range) != 2:
            raise ToolError("`view_range` must be two integers [start, end]")
        start, end = view_range
        if not 1 <= start <= count:
            raise ToolError(f"`view_range` start {start} is outside the file's lines 1..{count}")
        if end == -1:
            return start, count
        if not start <= end <= count:
            raise ToolError(f"`view_range` end {end} must be -1 or within {start}..{count}")
        return start, end

    def _listing(self, root: Path) -> str:
        entries: list[str] = []
        for path in sorted(root.rglob("*")):
            rel = path.relative_to(root)
            if len(rel.parts) > 2 or any(p.startswith(".") for p in rel.parts):
                continue
            entries.append(f"{rel}/" if path.is_dir() else str(rel))
            if len(entries) >= _LISTING_LIMIT:
                entries.append(f"[... listing stopped at {_LISTING_LIMIT} entries ...]")
                break
        header = f"Files and directories up to 2 levels deep in {root}, hidden items excluded:"
        return "\n".join([header, *entries])

    def _create(self, path: Path, text: str) -> str:
        if path.exists():
            raise ToolError(f"{path} already exists; `create` does not overwrite files")
        self._write(path, text, previous=None)
        return f"File created successfully at: {path}"

    def _str_replace(self, path: Path, old: str, new: str) -> str:
        text = self._read(path)
        count = text.count(old)
        if count == 0:
            raise ToolError(f"no replacement was performed: `old_str` did not appear in {path}")
        if count > 1:
            lines = [i + 1 for i, line in enumerate(text.split("\n")) if old.split("\n")[0] in line]
            raise ToolError(
                f"no replacement was performed: `old_str` appears {count} times in {path} "
                f"(lines {lines}); make it unique"
            )
        at = text.index(old)
        self._write(path, text.replace(old, new, 1), previous=text)
        first = text[:at].count("\n") + 1
        return f"The file {path} has been edited.\n" + self._snippet(path, first, new.count("\n"))

    def _insert(self, path: Path, line: int, new: str) -> str:
        text = self._read(path)
        lines = text.split("\n")
        if not 0 <= line <= len(lines):
            raise ToolError(f"`insert_line` {line} is outside 0..{len(lines)} for {path}")
        updated = lines[:line] + new.split("\n") + lines[line:]
        self._write(path, "\n".join(updated), previous=text)
        return f"The file {path} has been edited.\n" + self._snippet(
            path, line + 1, new.count("\n")
        )

    def _undo(self, path: Path) -> str:
        stack = self._history.get(path)
        if not stack:
            raise ToolError(f"no edit to undo for {path}")
        previous = stack.pop()
        if previous is None:
            path.unlink(missing_ok=True)
            return f"Undid the creation of {path}; the file is removed."
        path.write_text(previous)
        return f"Last edit to {path} undone.\n" + _numbered(previous.split("\n"), 1)

    def _snippet(self, path: Path, first: int, extra: int) -> str:
        lines = self._read(path).split("\n")
        start = max(1, first - _SNIPPET_CONTEXT)
        end = min(len(lines), first + extra + _SNIPPET_CONTEXT)
        return _numbered(lines[start - 1 : end], start)

    def _read(self, path: Path) -> str:
        if path.is_dir():
            raise ToolError(f"{path} is a directory; only `view` works on directories")
        try:
            return path.read_text()
        except FileNotFoundError as exc:
            raise ToolError(f"{path} does not exist") from exc
        except (OSError, UnicodeDecodeError) as exc:
            raise ToolError(f"cannot read {path}: {exc}") from exc

    def _write(self, path: Path, text: str, *, previous: str | None) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        except OSError as exc:
            raise ToolError(f"cannot write {path}: {exc.strerror or exc}") from exc
        self._history.setdefault(path, []).append(previous)
