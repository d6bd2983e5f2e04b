"""How long the sentences of the docs are: words, sentences, mean sentence length, the share of
sentences over 35 words and the longest, page by page, on the prose a reader reads.

What is measured is the prose of a Markdown page. Excluded before anything is counted:

- front matter (a ``---`` block on the first line, up to the next ``---``);
- fenced code blocks (````` ``` ````` or ``~~~`` fences, whatever their indentation);
- indented code blocks (lines indented 4+ spaces after a blank line, when the paragraph before
  is neither a list item nor an admonition or ``details`` opener, whose indented body is prose);
- tables (every line that starts with ``|``);
- headings (lines starting with ``#``: titles, not sentences);
- admonition and ``details`` markers (``!!! note "Title"``, ``??? note``, ``???+ note``): the
  marker line only, the indented body is prose and is measured;
- HTML: lines that hold only tags (``<details>``, ``</div>``, ...), ``<summary>`` lines (a
  title), every other tag inside a line (its text is kept), HTML comments;
- link targets (``[text](url)`` counts as ``text``) and reference definitions (``[x]: url``);
- inline code (a `` `code span` `` counts as one word, whatever it holds).

A sentence ends at ``.``, ``!`` or ``?`` followed by white space (then a capital, a digit, a
quote, a bracket, a mark or a code span), at the end of a paragraph and at the end of a list
item. It does not end inside a number (``0.5``), after a common abbreviation (``e.g.``,
``i.e.``, ``vs.``, ``cf.``, ``et al.``, ``Fig.``, ``approx.``, ``resp.``, ``no.``), or after a
single capital (an initial). A word is a white-space separated token with a letter or a digit.

    python scripts/readability.py                    # the table for README, docs/index, guide
    python scripts/readability.py docs/tutorial.md   # given pages
    python scripts/readability.py --long PAGE        # also print each sentence over 35 words
    python scripts/readability.py --check            # the pages of CHECKED against the limits

``--check`` exits 1, naming each page and figure, when a page of ``CHECKED`` has a mean
sentence over ``MAX_MEAN`` words or more than ``MAX_LONG_SHARE`` of its sentences over
``LONG`` words. A page is moved from ``NOT_YET`` to ``CHECKED`` once it is rewritten.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LONG = 35  # a sentence over this many words is long
MAX_MEAN = 18.0  # words per sentence, on average, at most
MAX_LONG_SHARE = 0.05  # share of long sentences at most

# The pages that must pass --check (paths relative to the repository).
CHECKED = [
    "README.md",
    "docs/index.md",
    "docs/tutorial.md",
    "docs/glossary.md",
    "docs/guide/dashboards.md",
    "docs/guide/datasets.md",
    "docs/guide/reports.md",
    "docs/guide/development.md",
    "docs/guide/store.md",
    "docs/guide/distributed.md",
    "docs/guide/long-campaigns.md",
    "docs/guide/presets.md",
    "docs/guide/campaigns.md",
    "docs/guide/studies.md",
    "docs/guide/losses.md",
    "docs/guide/protocol.md",
    "docs/guide/tracking.md",
    "docs/guide/traditional.md",
    "docs/guide/plugins.md",
    "docs/guide/slurm.md",
    "docs/guide/design.md",
    "docs/guide/architecture.md",
    "docs/guide/metrics.md",
    "docs/guide/robustness.md",
    "docs/guide/clusters.md",
    "docs/guide/fidelity.md",
    "docs/guide/performance.md",
]
# The pages users read that are not rewritten yet: measured by default, not checked. Move a
# page to CHECKED once it is rewritten. A page listed here that does not exist is passed over.
NOT_YET: list[str] = []

ABBREVIATIONS = {"e.g", "i.e", "vs", "cf", "al", "fig", "approx", "resp", "no", "etc.,"}
FENCE = re.compile(r"^\s*(```|~~~)")
MARKER = re.compile(r"^\s*(!!!|\?\?\?\+?)\s")
LIST_ITEM = re.compile(r"^\s*([-*+]|\d+[.)])\s+")
HTML_ONLY = re.compile(r"^\s*(<[^>]+>\s*)+$")
REF_DEF = re.compile(r"^\s*\[[^\]]+\]:\s+\S")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
TAG = re.compile(r"<[^>\n]+>")
COMMENT = re.compile(r"<!--.*?-->", re.S)
END = re.compile(r"""([.!?])["')\]]*\s+(?=["'(\[`*_A-Z0-9†‡§¶])""")


@dataclass
class Figures:
    """One page's figures: ``words`` in sentences, ``sentences``, ``long`` (over LONG words),
    ``longest`` (words of the longest sentence)."""

    path: str
    words: int
    sentences: int
    long: int
    longest: int

    @property
    def mean(self) -> float:
        return self.words / self.sentences if self.sentences else 0.0

    @property
    def long_share(self) -> float:
        return self.long / self.sentences if self.sentences else 0.0


def _without_front_matter(lines: list[str]) -> list[str]:
    if lines and lines[0].strip() == "---":
        for i in range(1, len(lines)):
            if lines[i].strip() == "---":
                return lines[i + 1 :]
    return lines


def blocks(text: str) -> list[str]:
    """The prose blocks of a Markdown page (paragraphs and list items, one string each), with
    everything the module's docstring excludes removed."""
    lines = _without_front_matter(COMMENT.sub("", text).splitlines())
    out: list[list[str]] = []
    current: list[str] = []
    fence: str | None = None
    prose_parent = False  # the block before a blank line was a list item or a marker
    blank_before = True

    def close() -> None:
        nonlocal current
        if current:
            out.append(current)
        current = []

    for line in lines:
        if fence is not None:
            if line.strip().startswith(fence):
                fence = None
            continue
        m = FENCE.match(line)
        if m:
            close()
            fence = m.group(1)
            continue
        stripped = line.strip()
        if not stripped:
            close()
            blank_before = True
            continue
        indented = len(line) - len(line.lstrip(" ")) >= 4
        if indented and blank_before and not prose_parent and not LIST_ITEM.match(line):
            close()  # an indented code block
            continue
        if (
            stripped.startswith(("|", "#", "<summary"))
            or HTML_ONLY.match(stripped)
            or REF_DEF.match(line)
        ):
            close()
            blank_before = False
            prose_parent = prose_parent and indented
            continue
        if MARKER.match(line):
            close()
            prose_parent, blank_before = True, False
            continue
        if LIST_ITEM.match(line):
            close()
            current.append(LIST_ITEM.sub("", line, count=1))
            prose_parent = True
        else:
            current.append(stripped)
            if not indented:
                prose_parent = False
        blank_before = False
    close()
    return [" ".join(b) for b in out]


def clean(block: str) -> str:
    """A block as words: code spans as one token (``CODE``), links as their text, tags gone."""
    block = CODE_SPAN.sub("`CODE`", block)
    block = LINK.sub(r"\1", block)
    return TAG.sub("", block)


def sentences(block: str) -> list[str]:
    """The sentences of one prose block (see the module's docstring for where one ends)."""
    text = clean(block)
    out: list[str] = []
    start = 0
    for m in END.finditer(text):
        before = text[start : m.start() + 1].split()
        last = before[-1].lower().rstrip(".!?") if before else ""
        last = last.lstrip("(\"'[")
        if last in ABBREVIATIONS or (len(last) == 1 and last.isalpha() and m.group(1) == "."):
            continue
        out.append(text[start : m.end()].strip())
        start = m.end()
    tail = text[start:].strip()
    if tail:
        out.append(tail)
    return [s for s in out if count_words(s)]


def count_words(sentence: str) -> int:
    return sum(1 for token in sentence.split() if re.search(r"[A-Za-z0-9]", token))


def measure(path: Path) -> Figures:
    """The figures of one page."""
    lengths = [
        count_words(s) for b in blocks(path.read_text(encoding="utf-8")) for s in sentences(b)
    ]
    rel = path.resolve().relative_to(REPO) if path.resolve().is_relative_to(REPO) else path
    return Figures(
        path=str(rel),
        words=sum(lengths),
        sentences=len(lengths),
        long=sum(1 for n in lengths if n > LONG),
        longest=max(lengths, default=0),
    )


def total(figures: list[Figures]) -> Figures:
    return Figures(
        path="total",
        words=sum(f.words for f in figures),
        sentences=sum(f.sentences for f in figures),
        long=sum(f.long for f in figures),
        longest=max((f.longest for f in figures), default=0),
    )


def failures(f: Figures) -> list[str]:
    """What a page breaks of the limits, one phrase each (empty when it passes)."""
    bad = []
    if f.mean > MAX_MEAN:
        bad.append(f"mean sentence {f.mean:.1f} words > {MAX_MEAN:g}")
    if f.long_share > MAX_LONG_SHARE:
        bad.append(
            f"{100 * f.long_share:.1f} % of sentences over {LONG} words > {100 * MAX_LONG_SHARE:g} %"
        )
    return bad


def table(figures: list[Figures]) -> str:
    rows = [f"{'page':40} {'words':>6} {'sent':>5} {'mean':>5} {'>35':>6} {'max':>4}"]
    for f in [*figures, total(figures)]:
        share = f"{100 * f.long_share:.1f}%"
        rows.append(
            f"{f.path:40} {f.words:6} {f.sentences:5} {f.mean:5.1f} {share:>6} {f.longest:4}"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pages", nargs="*", type=Path, help="default: CHECKED and NOT_YET")
    ap.add_argument("--check", action="store_true", help="apply the limits to CHECKED")
    ap.add_argument("--long", action="store_true", help="print each page's long sentences")
    args = ap.parse_args(argv)
    if args.check:
        figures = [measure(REPO / p) for p in CHECKED]
        print(table(figures))
        bad = [f"{f.path}: {', '.join(failures(f))}" for f in figures if failures(f)]
        for line in bad:
            print(f"error: {line}", file=sys.stderr)
        return 1 if bad else 0
    paths = args.pages or [REPO / p for p in [*CHECKED, *NOT_YET] if (REPO / p).exists()]
    missing = [p for p in paths if not p.is_file()]
    if missing:
        print(f"error: no such page: {missing[0]}", file=sys.stderr)
        return 2
    print(table([measure(p) for p in paths]))
    if args.long:
        for p in paths:
            for s in (s for b in blocks(p.read_text(encoding="utf-8")) for s in sentences(b)):
                if count_words(s) > LONG:
                    print(f"\n{p} ({count_words(s)} words): {s}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
