"""Layer contracts (issue #14): no module imports another module's `_private` name.

The walk covers every module under `mlrc/`: `from mlrc.x import _name` and `mlrc.x._name`
attribute use (through an `import mlrc.x` / `from mlrc import x` binding) where `mlrc.x` is
another module. A module's own privates and dunder names are fine. When import-linter is
installed, the `[tool.importlinter]` contracts in pyproject.toml are checked too.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import require

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "mlrc"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def private_imports() -> list[str]:
    violations = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), filename=str(path))
        aliases: dict[str, str] = {}  # local name -> mlrc module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("mlrc"):
                        aliases[alias.asname or alias.name] = alias.name
            elif isinstance(node, ast.ImportFrom):
                source = _resolve(module, node, is_package)
                if not source.startswith("mlrc"):
                    continue
                for alias in node.names:
                    if source != module and _is_private(alias.name):
                        violations.append(f"{module}:{node.lineno} imports {source}.{alias.name}")
                    aliases[alias.asname or alias.name] = f"{source}.{alias.name}"
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _is_private(node.attr):
                target = _dotted(node.value)
                if target is None:
                    continue
                head, _, rest = target.partition(".")
                if head not in aliases:
                    continue
                source = aliases[head] + ("." + rest if rest else "")
                if source != module and _is_mlrc_module(source):
                    violations.append(f"{module}:{node.lineno} uses {source}.{node.attr}")
    return violations


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return None if inner is None else f"{inner}.{node.attr}"
    return None


def _is_mlrc_module(name: str) -> bool:
    rel = Path(*name.split("."))
    return (ROOT / rel).with_suffix(".py").is_file() or (ROOT / rel / "__init__.py").is_file()


def test_no_private_imports_across_modules():
    assert private_imports() == []


def test_import_contracts():
    lint_imports = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    # a laptop without the dev extra skips with this reason; CI (MLRC_REQUIRE_ALL=1) fails
    require(lint_imports is not None, "import-linter is not installed (pip install -e '.[dev]')")
    result = subprocess.run([lint_imports, "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
