"""Generate the two lists of docs/guide/architecture.md that must match the code: the layers
(from the import-linter ``layers`` contract in pyproject.toml) and the rooms (every package and
module of ``mlrc/``, each with the first sentence of its docstring).

    .venv/bin/python scripts/architecture.py          # rewrite the page's generated blocks
    .venv/bin/python scripts/architecture.py --check  # exit 1 if the page is out of date

tests/docs/test_architecture.py runs the check; the prose around the blocks is written by hand.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "guide" / "architecture.md"
PACKAGE = REPO / "mlrc"
SKIP = ("migrations",)  # Alembic's revisions: one per schema version, listed in the store's docs


def layers() -> str:
    """The layers contract as a numbered list, top (may import all below) to bottom."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    contract = next(c for c in config["contracts"] if c["type"] == "layers")
    lines = [
        f"{i}. `{' | '.join(p.strip() for p in layer.split('|'))}`"
        for i, layer in enumerate(contract["layers"], 1)
    ]
    return "\n".join(lines)


def first_sentence(path: Path) -> str:
    """The first sentence of a module's docstring, on one line (markup kept)."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    text = " ".join(doc.split("\n\n")[0].split())
    # a sentence ends at ". X" (X a capital) or ": "; not inside "et al." or "§3.2."
    m = re.match(r"(.+?(?<!\bal)(?<!\d)[.:;])(\s+[A-Z(`*]|\s*$)", text)
    text = (m.group(1) if m else text).rstrip(":;.") + "."
    text = re.sub(r":(?:func|class|mod|data|meth|exc|attr):`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def rooms(package: Path = PACKAGE) -> str:
    """Every package and module under ``package`` (but Alembic's revisions), with its job."""
    out = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package.parent)
        if any(part in SKIP for part in rel.parts) or path.name == "__main__.py":
            continue
        name = str(rel.parent) + "/" if path.name == "__init__.py" else str(rel)
        depth = len(rel.parts) - (2 if path.name == "__init__.py" else 1)
        out.append(f"{'  ' * (depth - 1)}- `{name}`: {first_sentence(path)}")
    return "\n".join(out)


def render(page: str, package: Path = PACKAGE) -> str:
    """``page`` with its generated blocks replaced (the rooms of ``package``)."""
    for block, text in (("layers", layers()), ("rooms", rooms(package))):
        start, end = f"<!-- {block}:start -->", f"<!-- {block}:end -->"
        head, rest = page.split(start, 1)
        _, tail = rest.split(end, 1)
        page = f"{head}{start}\n{text}\n{end}{tail}"
    return page


def main(argv: list[str]) -> int:
    page = PAGE.read_text()
    new = render(page)
    if "--check" in argv:
        if new != page:
            print(f"{PAGE.relative_to(REPO)} is out of date: run scripts/architecture.py")
            return 1
        return 0
    PAGE.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
