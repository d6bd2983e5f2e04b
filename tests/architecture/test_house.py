"""The house's rules (issue #23), read from the source: no import circle between files, no
module over 500 lines and no function over 60, unless the exception says why in one line.

An exception is a comment ``# size: <reason>`` among a module's first 5 lines (for the
module's length) or in a function's signature, or on the line after its docstring (for the
function's). Imports
inside functions and ``if TYPE_CHECKING:`` blocks count as imports of the file for the circle
test only when they run: ``TYPE_CHECKING`` imports are hints, as for import-linter.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "mlrc"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60
MARK = "# size:"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _type_checking_blocks(tree: ast.Module) -> set[int]:
    """Line numbers of the statements under ``if TYPE_CHECKING:``."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                lines.update(range(inner.lineno, (inner.end_lineno or inner.lineno) + 1))
    return lines


def _imported(module: str, path: Path, known: set[str]) -> set[str]:
    """The mlrc modules ``module`` imports (anywhere but under ``TYPE_CHECKING``), as files:
    ``from mlrc.a import b`` is ``mlrc.a.b`` when that is a module, else ``mlrc.a``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    hints = _type_checking_blocks(tree)
    out: set[str] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in hints:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                base = module.split(".")[: (None if path.name == "__init__.py" else -1)]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            for a in node.names:
                full = f"{source}.{a.name}"
                out.add(full if full in known else source)
    return {m for m in out if m in known and m != module}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one file (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_circle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(graph) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_between_files():
    modules = _modules()
    known = set(modules)
    # a package's __init__ re-exports its modules: importing it is importing those, which is
    # not a circle of code; only module -> module edges through re-exports are followed
    graph = {m: _imported(m, p, known) for m, p in modules.items()}
    circles = _circles(graph)
    assert not circles, "import circles between files: " + "; ".join(
        " -> ".join(c) for c in circles
    )


def _marked(lines: list[str]) -> bool:
    return any(line.strip().startswith(MARK) for line in lines)


def test_no_module_over_500_lines_without_a_reason():
    long = []
    for module, path in _modules().items():
        lines = path.read_text().splitlines()
        if len(lines) > MAX_MODULE_LINES and not _marked(lines[:5]):
            long.append(f"{module} ({len(lines)} lines)")
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {', '.join(long)}"


def test_no_function_over_60_lines_without_a_reason():
    long = []
    for module, path in _modules().items():
        text = path.read_text()
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            head = node.body[0].end_lineno or node.body[0].lineno
            reason = lines[node.lineno - 1 : head + 1]  # to the first line after the docstring
            if length > MAX_FUNCTION_LINES and not _marked(reason):
                long.append(f"{module}.{node.name} ({length} lines)")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {', '.join(long)}"
