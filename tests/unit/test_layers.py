"""The architecture as a test: imports only go down the layers of docs/architecture.md, and no module imports
itself back through others (a cycle). Every import counts, inside a function too; only those under
``if TYPE_CHECKING:`` (annotations, never run) are left out."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# bottom to top; a module belongs to the longest prefix listed; it may import its own layer and any lower one
LAYERS: list[tuple[str, ...]] = [
    ("engines",),
    ("harness", "harness.common"),
    ("harness.records",),
    ("harness.probe",),
    ("harness.prompts", "harness.load.schedule"),
    ("harness.models", "harness.detect", "harness.setup"),
    ("harness.config",),
    ("harness.load",),
    ("harness.session",),
    ("harness.soak",),
    ("harness.run",),
    ("harness.metrics", "harness.report", "harness.fleet"),
    ("harness.cli",),
]


def module_name(path: Path) -> str:
    name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return name.removesuffix(".__init__")


MODULES = {module_name(p): p for top in ("harness", "engines") for p in sorted((ROOT / top).rglob("*.py"))}


def layer(module: str) -> int:
    best, rank = -1, -1
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), i
    assert rank >= 0, f"{module}: in no layer of LAYERS"
    return rank


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                lines.update(range(sub.lineno, (sub.end_lineno or sub.lineno) + 1))
    return lines


def imports(module: str) -> list[tuple[int, str]]:
    """(line, module) for every harness/engines module this one imports (``from pkg import mod`` names the module)."""
    tree = ast.parse(MODULES[module].read_text())
    skip = _type_checking_lines(tree)
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if node.lineno in skip if isinstance(node, (ast.Import, ast.ImportFrom)) else True:
            continue
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] in ("harness", "engines")]
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.level == 0
            and node.module.split(".")[0] in ("harness", "engines")
        ):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                out.append((node.lineno, sub if sub in MODULES else node.module))
    return [(line, m) for line, m in out if m != module]


def test_the_layers_cover_every_module() -> None:
    assert len(MODULES) > 80
    for module in MODULES:
        layer(module)


def test_imports_only_go_down() -> None:
    climbs = [
        f"{MODULES[m].relative_to(ROOT)}:{line} imports {dep} (layer {layer(dep)} above {layer(m)})"
        for m in MODULES
        for line, dep in imports(m)
        if layer(dep) > layer(m)
    ]
    assert climbs == [], "\n".join(climbs)


def test_no_import_cycle() -> None:
    graph = {m: {dep for _, dep in imports(m) if dep in MODULES} for m in MODULES}
    done: set[str] = set()

    def visit(m: str, path: list[str]) -> list[str] | None:
        if m in path:
            return [*path[path.index(m) :], m]
        if m in done:
            return None
        for dep in sorted(graph[m]):
            if (cycle := visit(dep, [*path, m])) is not None:
                return cycle
        done.add(m)
        return None

    # a package's __init__ importing its own modules is how a package re-exports: not a cycle
    for m in MODULES:
        graph[m] = {d for d in graph[m] if not (MODULES[m].name == "__init__.py" and d.startswith(m + "."))}
    cycles = [c for m in sorted(MODULES) if (c := visit(m, [])) is not None]
    assert cycles == [], " -> ".join(cycles[0])


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import harness.soak.slice\n", [(1, "harness.soak.slice")]),
        ("from harness.soak import canary\n", [(1, "harness.soak.canary")]),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from harness.run import runner\n", []),
        ("def f():\n    from harness.cli import main\n", [(2, "harness.cli")]),
    ],
)
def test_the_walker_sees_every_kind_of_import(
    source: str, expected: list[tuple[int, str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "probe.py"
    path.write_text(source)
    monkeypatch.setitem(MODULES, "harness.common.probe_module", path)
    assert imports("harness.common.probe_module") == expected
