"""str_replace_editor: editing, undo, and confinement to the workspace."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from prorl_async.toolserver._base import ToolError
from prorl_async.toolserver.client import ToolClient
from prorl_async.toolserver.editor import EditorTool


@pytest.fixture
def editor(workspace: Path) -> EditorTool:
    return EditorTool(workspace.resolve())


async def edit(editor: EditorTool, **args: Any) -> str:
    return (await editor.call(args)).output


async def test_create_view_and_ranges(editor: EditorTool, workspace: Path) -> None:
    out = await edit(editor, command="create", path="pkg/a.py", file_text="one\ntwo\nthree\n")
    assert "created" in out
    assert (workspace / "pkg/a.py").read_text() == "one\ntwo\nthree\n"
    assert await edit(editor, command="view", path="pkg/a.py", view_range=[2, 3]) == (
        "     2\ttwo\n     3\tthree"
    )
    assert (await edit(editor, command="view", path="pkg/a.py", view_range=[2, -1])).startswith(
        "     2\ttwo"
    )
    with pytest.raises(ToolError, match="already exists"):
        await edit(editor, command="create", path="pkg/a.py", file_text="x")
    with pytest.raises(ToolError, match="start 9 is outside"):
        await edit(editor, command="view", path="pkg/a.py", view_range=[9, 10])


async def test_directory_listing(editor: EditorTool, workspace: Path) -> None:
    (workspace / "src/deep/deeper").mkdir(parents=True)
    (workspace / "src/main.py").write_text("")
    (workspace / ".git").mkdir()
    listing = await edit(editor, command="view", path=".")
    assert "src/\n" in listing and "src/main.py" in listing and "src/deep/" in listing
    assert ".git" not in listing and "deeper" not in listing


async def test_str_replace_unique_zero_and_many(editor: EditorTool, workspace: Path) -> None:
    (workspace / "f.txt").write_text("alpha\nbeta\nbeta\ngamma\n")
    with pytest.raises(ToolError, match="did not appear"):
        await edit(editor, command="str_replace", path="f.txt", old_str="delta", new_str="x")
    with pytest.raises(ToolError, match=r"appears 2 times .*lines \[2, 3\]"):
        await edit(editor, command="str_replace", path="f.txt", old_str="beta", new_str="x")
    out = await edit(editor, command="str_replace", path="f.txt", old_str="gamma", new_str="G")
    assert "     4\tG" in out
    assert (workspace / "f.txt").read_text() == "alpha\nbeta\nbeta\nG\n"


async def test_insert_and_undo_history(editor: EditorTool, workspace: Path) -> None:
    await edit(editor, command="create", path="u.txt", file_text="a\nb")
    await edit(editor, command="insert", path="u.txt", insert_line=1, new_str="between")
    await edit(editor, command="insert", path="u.txt", insert_line=0, new_str="top")
    assert (workspace / "u.txt").read_text() == "top\na\nbetween\nb"
    with pytest.raises(ToolError, match="`insert_line` 9 is outside 0..4"):
        await edit(editor, command="insert", path="u.txt", insert_line=9, new_str="x")
    await edit(editor, command="undo_edit", path="u.txt")
    assert (workspace / "u.txt").read_text() == "a\nbetween\nb"
    await edit(editor, command="undo_edit", path="u.txt")
    assert (workspace / "u.txt").read_text() == "a\nb"
    await edit(editor, command="undo_edit", path="u.txt")
    assert not (workspace / "u.txt").exists()
    with pytest.raises(ToolError, match="no edit to undo"):
        await edit(editor, command="undo_edit", path="u.txt")


async def test_missing_required_fields_are_named(editor: EditorTool) -> None:
    with pytest.raises(ToolError, match="`file_text` is required"):
        await edit(editor, command="create", path="x.txt")
    with pytest.raises(ToolError, match="`old_str` is required"):
        await edit(editor, command="str_replace", path="x.txt")
    with pytest.raises(ToolError, match=r"\$\.command"):
        await edit(editor, command="delete", path="x.txt")


@pytest.mark.parametrize("path", ["../x", "sub/../../x", "/etc/passwd", "/tmp/outside.txt"])
async def test_escapes_are_refused(editor: EditorTool, path: str) -> None:
    with pytest.raises(ToolError, match="outside the workspace"):
        await edit(editor, command="create", path=path, file_text="pwned")


async def test_symlink_out_of_the_workspace_is_refused(
    editor: EditorTool, workspace: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "secret.txt"
    outside.write_text("secret")
    (workspace / "link.txt").symlink_to(outside)
    (workspace / "linkdir").symlink_to(tmp_path)
    for path in ("link.txt", "linkdir/secret.txt", str(workspace / "link.txt")):
        with pytest.raises(ToolError, match="outside the workspace"):
            await edit(editor, command="view", path=path)
    with pytest.raises(ToolError, match="outside the workspace"):
        await edit(editor, command="str_replace", path="link.txt", old_str="secret", new_str="x")
    assert outside.read_text() == "secret"


async def test_absolute_path_inside_is_allowed(editor: EditorTool, workspace: Path) -> None:
    target = workspace.resolve() / "abs.txt"
    await edit(editor, command="create", path=str(target), file_text="ok")
    assert target.read_text() == "ok"


async def test_editor_through_the_server(client: ToolClient, workspace: Path) -> None:
    result = await client.call(
        "str_replace_editor", {"command": "create", "path": "s.txt", "file_text": "hi"}
    )
    assert result.ok and (workspace / "s.txt").read_text() == "hi"
    refused = await client.call("str_replace_editor", {"command": "view", "path": "../.."})
    assert not refused.ok and refused.error is not None and "outside the workspace" in refused.error
