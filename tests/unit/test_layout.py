"""The package's layout holds (README "Architecture"): layers import only downwards, lazy imports included; the
foundation imports no layer; no two modules import each other at load time, directly or through others; no module
is much over the ~400-line rule."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "disco"
LAYERS = ["foundation", "suites", "policies", "models", "costs", "decode", "replay", "bench", "app"]  # bottom to top
FOUNDATION = {"errors", "limits", "options", "cache", "machine", "text", "theory", "hub"}
ENTRY = {"cli", "__main__"}  # the command line's root: above every layer
MAX_LINES = 450


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) == 1:
        return None  # the package itself
    if parts[1] in FOUNDATION:
        return "foundation"
    if parts[1] in ENTRY:
        return "entry"
    return parts[1]


def imports(tree: ast.AST, top_level_only: bool) -> set[str]:
    """The disco modules a module imports: ``from X import name`` names X and X.name (``from disco import cache`` is
    ``disco.cache``; where X.name is a class or function, not a module, it is found in no table and ignored)."""
    found = set()

    def visit(nodes):
        for node in nodes:
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.startswith("disco"):
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("disco"))
            elif top_level_only and isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)

    visit(list(ast.walk(tree)) if not top_level_only else tree.body)
    return found


MODULES = {module_name(p): ast.parse(p.read_text()) for p in sorted(ROOT.rglob("*.py"))}


def test_layers_import_only_downwards_lazy_imports_included():
    upward = []
    for module, tree in MODULES.items():
        here = layer(module)
        if here in (None, "entry"):
            continue
        for target in imports(tree, top_level_only=False):
            there = layer(target)
            if there not in LAYERS and there != "entry":  # the package itself, or a name it exports
                continue
            if there == "entry" or LAYERS.index(there) > LAYERS.index(here):
                upward.append(f"{module} ({here}) imports {target} ({there})")
    assert not upward, upward


def test_the_foundation_imports_no_layer():
    for module, tree in MODULES.items():
        if layer(module) == "foundation":
            assert {layer(t) for t in imports(tree, top_level_only=False)} <= {"foundation", None}, module


def test_no_import_circles_at_load_time():
    graph = {m: {t for t in imports(tree, top_level_only=True) if t in MODULES and t != m}
             for m, tree in MODULES.items()}
    # a package's __init__ importing its own modules is how a package is built, not a circle
    graph = {m: {t for t in ts if not (t.startswith(m + ".") and m.count(".") >= 1)} for m, ts in graph.items()}
    state: dict[str, int] = {}
    circles = []

    def walk(node, path):
        state[node] = 1
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                circles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                walk(nxt, path + [nxt])
        state[node] = 2

    for m in graph:
        if m not in state:
            walk(m, [m])
    assert not circles, circles


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_is_much_over_the_line_rule(module):
    path = ROOT.parent.joinpath(*module.split(".")).with_suffix(".py")
    if not path.is_file():
        path = ROOT.parent.joinpath(*module.split("."), "__init__.py")
    assert len(path.read_text().splitlines()) <= MAX_LINES, f"{module}: split it (one concept per module)"
