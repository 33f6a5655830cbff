"""The handler guide's complete example (docs/example_handler.py), run for real: through
HTTP on a real server, bwrap sandboxes and a scripted LLM (test double) that writes the
script with the editor and runs it with bash."""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from prorl_async.client import UnprocessableError
from prorl_async.core.handler import AgentHandler, HandlerRegistry
from tests.handlers.policies import CodeWriter, assert_nothing_live, finished, serve
from tests.helpers import Server, ServerFactory

DOCS = Path(__file__).resolve().parents[2] / "docs"
EXAMPLE = DOCS / "example_handler.py"
GUIDE = DOCS / "handlers.md"


@pytest.fixture(scope="module")
def example() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("example_handler", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # msgspec resolves the struct's annotations through it
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def _handler(example: ModuleType) -> AgentHandler:
    handler: AgentHandler = example.GreetingHandler()
    return handler


async def _greet(srv: Server, example: ModuleType, instance: dict[str, Any]) -> dict[str, Any]:
    srv.service.registry.register(_handler(example))
    return await finished(srv, await srv.client.submit("greeting", instance))


def test_guide_embeds_the_tested_example_verbatim() -> None:
    guide = GUIDE.read_text(encoding="utf-8")
    section = guide.split("## 9. A complete example", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert block is not None
    assert block.group(1) == EXAMPLE.read_text(encoding="utf-8")


async def test_example_correct_script_scores_1(
    make_server: ServerFactory, example: ModuleType
) -> None:
    policy = CodeWriter('echo "Hello, Ada!"\n', "bash hello.sh", path="hello.sh")
    async with serve(make_server, policy) as srv:
        res = await _greet(srv, example, {"name": "Ada"})
        assert res["status"] == "done" and res["error"] is None, res["error"]
        assert res["reward"] == 1.0
        assert res["eval"] == {"expected": "Hello, Ada!", "output": "Hello, Ada!"}
        assert res["script"] == 'echo "Hello, Ada!"\n'  # final_result's extra field
        assert any("Hello, Ada!" in t["text"] for t in res["turns"] if t["role"] == "tool")
        assert_nothing_live(srv)


async def test_example_wrong_script_scores_0(
    make_server: ServerFactory, example: ModuleType
) -> None:
    policy = CodeWriter('echo "Hello, Bob!"\n', "bash hello.sh", path="hello.sh")
    async with serve(make_server, policy) as srv:
        res = await _greet(srv, example, {"name": "Ada"})
        assert res["status"] == "done" and res["reward"] == 0.0
        assert res["eval"]["output"] == "Hello, Bob!"
        assert_nothing_live(srv)


@pytest.mark.parametrize(
    ("instance", "field"),
    [({"name": ""}, "instance.name"), ({"name": "a\nb"}, "instance.name"), ({}, "name")],
)
async def test_example_rejects_bad_instances(
    make_server: ServerFactory, example: ModuleType, instance: dict[str, Any], field: str
) -> None:
    async with make_server() as srv:
        srv.service.registry.register(_handler(example))
        with pytest.raises(UnprocessableError) as err:
            await srv.client.submit("greeting", instance)
        assert field in str(err.value)


def test_dropping_the_module_into_a_handlers_package_registers_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "guide_tasks_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    shutil.copy(EXAMPLE, package / "greeting.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        registry = HandlerRegistry()
        registry.load_package("guide_tasks_pkg")
        assert registry.names() == ["greeting"]
        handler = registry.get("greeting")
        assert handler is not None and handler.validate({"name": "Ada"}).name == "Ada"
    finally:
        for name in [m for m in sys.modules if m.startswith("guide_tasks_pkg")]:
            del sys.modules[name]
