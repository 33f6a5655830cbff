"""The package layout: no import cycles, few top-level modules, rooms depend one way.

Every ``import`` counts, at module level, inside functions and under ``TYPE_CHECKING``
alike: a cycle that only the type checker walks is still a cycle a reader must untangle.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "prorl_async"

# The rooms, lowest first: a module may import only from its own room or a lower one
# (docs/ARCHITECTURE.md draws the same order). Top-level modules are rooms of their own.
LAYERS = [
    "util",
    "schemas",
    "grading",
    "toolserver",
    "client",
    "stages",
    "capacity",
    "sandbox",
    "llm",
    "tenancy",
    "notify",
    "config",
    "core",
    "store",
    "service",
    "api",
    "scripted_llm",
    "vllm_cpu",
    "trainer",
    "integrations",
    "cluster",
    "demo",
    "train_demo",
    "cli",
    "",  # the package root re-exports the public names of every room
]
MAX_TOP_LEVEL_MODULES = 8

Graph = dict[str, set[str]]


def module_name(path: Path, package_dir: Path = PACKAGE) -> str:
    parts = [package_dir.name, *path.relative_to(package_dir).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(package_dir: Path = PACKAGE) -> Graph:
    """Module -> the package's modules it imports (every import statement)."""
    files = {module_name(p, package_dir): p for p in package_dir.rglob("*.py")}
    graph: Graph = {}
    for name, path in files.items():
        is_pkg = path.name == "__init__.py"
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for target in _targets(node, name, is_pkg, files):
                if target != name:
                    targets.add(target)
        graph[name] = targets
    return graph


def _targets(node: ast.AST, name: str, is_pkg: bool, files: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        candidates = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            package = name.split(".") if is_pkg else name.split(".")[:-1]
            package = package[: len(package) - (node.level - 1)]
            base = ".".join([*package, base] if base else package)
        # ``from pkg import mod`` imports the module pkg.mod; ``from mod import name`` mod.
        candidates = [
            f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base
            for alias in node.names
        ]
    else:
        return []
    out = []
    for candidate in candidates:
        while candidate and candidate not in files:
            candidate = candidate.rpartition(".")[0]
        if candidate:
            out.append(candidate)
    return out


def cycles(graph: Graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            advanced = False
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def upward_imports(graph: Graph, layers: list[str] = LAYERS) -> list[str]:
    rank = {name: i for i, name in enumerate(layers)}
    bad = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            src, dst = room(module), room(target)
            if src != dst and rank[dst] > rank[src]:
                bad.append(f"{module} imports {target} ({dst!r} is above {src!r})")
    return bad


# -- the checks themselves are checked ----------------------------------------------------


def test_cycle_finder_finds_a_cycle_through_type_checking_and_relative_imports(
    tmp_path: Path,
) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("from . import c\n")
    (pkg / "sub" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import X\n"
    )
    (pkg / "d.py").write_text("def f():\n    import pkg.a\n")
    graph = import_graph(pkg)
    assert graph["pkg.d"] == {"pkg.a"}
    assert cycles(graph) == [["pkg.a", "pkg.sub.b", "pkg.sub.c"]]
    (pkg / "sub" / "c.py").write_text("X = 1\n")
    assert cycles(import_graph(pkg)) == []


def test_layer_rule_flags_an_upward_import() -> None:
    graph = {"p.core.job": {"p.service"}, "p.service": {"p.core.job"}}
    assert upward_imports(graph, ["core", "service"]) == [
        "p.core.job imports p.service ('service' is above 'core')"
    ]


# -- the package ---------------------------------------------------------------------------


def test_no_import_cycles() -> None:
    assert cycles(import_graph()) == []


def test_rooms_depend_one_way() -> None:
    graph = import_graph()
    unknown = {room(m) for m in graph} - set(LAYERS)
    assert not unknown, f"rooms missing from LAYERS (and docs/ARCHITECTURE.md): {unknown}"
    assert upward_imports(graph) == []


def test_few_modules_directly_under_the_package() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top


def test_every_room_with_code_is_a_regular_package() -> None:
    """A directory of modules without ``__init__.py`` is a namespace package: it imports
    from a checkout, but a wheel or an editable install built by another backend may drop it."""
    rooms = {p.parent for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}
    missing = sorted(str(d.relative_to(ROOT)) for d in rooms if not (d / "__init__.py").exists())
    assert missing == []


def test_architecture_doc_names_files_that_exist() -> None:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    paths = set(re.findall(r"`((?:prorl_async|handlers|tests|bench|docs)/[\w/.-]+)`", text))
    assert len(paths) >= 20, "the architecture doc should name the files it describes"
    missing = sorted(p for p in paths if not (ROOT / p.rstrip("/")).exists())
    assert missing == []
    rooms = [r for r in LAYERS if r]
    order = [text.find(f"`{r}`") for r in rooms]
    assert all(i >= 0 for i in order), [r for r, i in zip(rooms, order, strict=True) if i < 0]


# The HTTP side reaches the service's parts only through the service's own operations.
FACADE_PRIVATE = {"store", "services", "shared", "pipeline"}


def attribute_uses(directory: Path, names: set[str]) -> list[str]:
    """``path:line .name`` for every attribute access to one of ``names`` under ``directory``."""
    found = []
    for path in sorted(directory.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr in names:
                found.append(f"{path.relative_to(directory)}:{node.lineno} .{node.attr}")
    return found


def test_attribute_finder_finds_a_reach_past_the_facade(tmp_path: Path) -> None:
    (tmp_path / "r.py").write_text("def f(svc):\n    return svc.store.get(1), svc.status()\n")
    found = attribute_uses(tmp_path, FACADE_PRIVATE)
    assert [f.rsplit(" ", 1)[1] for f in found] == [".store"]


def test_the_api_goes_through_the_service_facade() -> None:
    assert attribute_uses(PACKAGE / "api", FACADE_PRIVATE) == []


# What admits, runs, times and counts a stage: one room holds it all.
STAGE_MACHINERY = [
    "StageQueue",
    "FairQueue",
    "WorkerPool",
    "JitAdmission",
    "StageRun",
    "StageScope",
    "StageStats",
]


def _defined_classes(package_dir: Path = PACKAGE) -> dict[str, str]:
    """Class name -> the module that defines it, over the whole package."""
    out: dict[str, str] = {}
    for path in package_dir.rglob("*.py"):
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.ClassDef):
                out[node.name] = module_name(path, package_dir)
    return out


def test_the_stage_machinery_lives_in_one_room() -> None:
    defined = _defined_classes()
    rooms = {name: room(defined[name]) for name in STAGE_MACHINERY if name in defined}
    assert rooms == dict.fromkeys(STAGE_MACHINERY, "stages")


def module_context_vars(package_dir: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the names it binds at module level to a ``ContextVar(...)``."""
    out: dict[str, set[str]] = {}
    for path in package_dir.rglob("*.py"):
        for node in ast.parse(path.read_text(), str(path)).body:
            value: ast.expr | None = None
            if isinstance(node, ast.Assign):
                value, targets = node.value, node.targets
            elif isinstance(node, ast.AnnAssign):
                value, targets = node.value, [node.target]
            if not isinstance(value, ast.Call):
                continue
            func = value.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called != "ContextVar":
                continue
            names = {t.id for t in targets if isinstance(t, ast.Name)}
            out.setdefault(module_name(path, package_dir), set()).update(names)
    return out


def shared_context_vars(package_dir: Path = PACKAGE) -> list[str]:
    """Module-level context variables imported by a module of another room: state passed
    between rooms behind the callers' backs instead of as an argument."""
    defined = module_context_vars(package_dir)
    files = {module_name(p, package_dir): p for p in package_dir.rglob("*.py")}
    bad = []
    for module, path in sorted(files.items()):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom):
                continue
            for target in _targets(node, module, path.name == "__init__.py", files):
                names = {a.name for a in node.names} & defined.get(target, set())
                if names and room(target) != room(module):
                    bad.append(f"{module} imports {sorted(names)} from {target}")
    return bad


def test_context_var_finder_finds_one_shared_between_rooms(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "a").mkdir(parents=True)
    (pkg / "b").mkdir()
    for d in (pkg, pkg / "a", pkg / "b"):
        (d / "__init__.py").write_text("")
    (pkg / "a" / "v.py").write_text("import contextvars\nCUR = contextvars.ContextVar('c')\n")
    (pkg / "a" / "same.py").write_text("from pkg.a.v import CUR\n")
    (pkg / "b" / "w.py").write_text("def f():\n    from pkg.a.v import CUR\n")
    assert shared_context_vars(pkg) == ["pkg.b.w imports ['CUR'] from pkg.a.v"]


def test_no_module_level_context_variable_is_shared_between_rooms() -> None:
    assert shared_context_vars() == []


def room_edges(graph: Graph) -> set[tuple[str, str]]:
    """(room, room it imports) for every import between two rooms (the root left out)."""
    return {
        (room(m), room(t))
        for m, targets in graph.items()
        for t in targets
        if room(m) and room(t) and room(m) != room(t)
    }


def test_the_architecture_doc_draws_the_rooms_as_the_imports_do() -> None:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    block = re.search(r"```mermaid\ngraph TD\n(.*?)```", text, flags=re.DOTALL)
    assert block is not None, "docs/ARCHITECTURE.md lost its mermaid graph of the rooms"
    drawn = set(re.findall(r"^\s*(\w+) --> (\w+)\s*$", block.group(1), flags=re.MULTILINE))
    real = room_edges(import_graph())
    assert {"missing": real - drawn, "gone": drawn - real} == {"missing": set(), "gone": set()}


@pytest.mark.parametrize(
    "name", ["AgentHandler", "Job", "RolloutClient", "SandboxTools", "ServerConfig"]
)
def test_public_names_import_from_the_package(name: str) -> None:
    import prorl_async

    assert getattr(prorl_async, name).__name__ == name
