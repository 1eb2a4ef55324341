"""The package's layering, read from its source: no import circle among planner/'s and replay/'s
modules, no private name imported from another module, and replay/ never imports planner/."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("planner", "replay")


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, list[tuple[str, list[str]]]]:
    """Each module's imports of the packages: (module, names imported from it)."""
    modules = {_module(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    out: dict[str, list[tuple[str, list[str]]]] = {}
    for name, path in modules.items():
        found = []
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module.split(".")[0] not in PACKAGES:
                    continue
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    # `from planner import gpus`: the module itself, not a name in planner/__init__.
                    found.append((sub, []) if sub in modules else (node.module, [alias.name]))
            elif isinstance(node, ast.Import):
                found += [(a.name, []) for a in node.names if a.name.split(".")[0] in PACKAGES]
        out[name] = [(m, names) for m, names in found if m in modules]
    return out


def test_no_import_circle():
    graph = {m: {dep for dep, _ in deps if dep != m} for m, deps in _imports().items()}
    state: dict[str, int] = {}
    circles: list[list[str]] = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for dep in sorted(graph[m]):
            if state.get(dep) == 1:
                circles.append([*path[path.index(dep):], dep] if dep in path else [m, dep])
            elif dep not in state:
                visit(dep, [*path, dep])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert circles == []


def test_no_private_name_crosses_modules():
    crossing = [
        f"{m} imports {dep}.{n}"
        for m, deps in _imports().items()
        for dep, names in deps
        for n in names
        if n.startswith("_") and not n.startswith("__") and dep != m
    ]
    assert crossing == []


def test_replay_knows_nothing_of_planner():
    assert [(m, dep) for m, deps in _imports().items() if m.startswith("replay") for dep, _ in deps if dep.startswith("planner")] == []
