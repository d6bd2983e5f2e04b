"""The test-result tables in each format: :func:`render` picks ``md`` (GitHub markdown), ``csv``
(tidy, one line per row × mode × metric), ``latex`` (:mod:`mlrc.report.latex`) or ``html``
(:mod:`mlrc.report.table_html`)."""

from __future__ import annotations

import pandas as pd

from mlrc.report.latex import latex_document, latex_table
from mlrc.report.layout import METRIC_LABELS, Cell, legend, table_blocks
from mlrc.report.legend import DAGGER
from mlrc.report.summary import TIDY_COLUMNS
from mlrc.report.table_html import html_page
from mlrc.report.values import MODES, ReportError
from mlrc.store import METRIC_COLUMNS

__all__ = ["FORMATS", "csv_table", "md_table", "render"]

FORMATS = ("md", "csv", "latex", "html")


def render(summary: pd.DataFrame, fmt: str, *, standalone: bool = False) -> str:
    """``md`` | ``csv`` | ``latex`` | ``html``. Values in percent; ± is the 95% CI half-width.
    ``standalone``: LaTeX as a complete document (HTML is always a complete page)."""
    if fmt not in FORMATS:
        raise ReportError(f"unknown format {fmt!r} ({', '.join(FORMATS)})")
    if fmt == "csv":
        return csv_table(summary)
    if fmt == "html":
        return html_page(summary)
    if summary.empty:
        empty = "(no test results in the store yet: run `mlrc study test`)"
        if fmt == "latex" and standalone:
            return latex_document(empty.replace("`", ""))
        return empty + "\n"
    if fmt == "md":
        return md_table(summary)
    return latex_table(summary, standalone)


def csv_table(summary: pd.DataFrame) -> str:
    """The summary's :data:`~mlrc.report.summary.TIDY_COLUMNS` as CSV (missing ones empty)."""
    table = summary.copy()
    for c in TIDY_COLUMNS:
        if c not in table.columns:
            table[c] = pd.NA
    return table.to_csv(index=False, columns=TIDY_COLUMNS, float_format="%.10g")


def _md_cell(c: Cell | None) -> str:
    if c is None:
        return "–"
    t = c.text("±")
    return (f"**{t}**" if c.bold else t) + (f" {DAGGER}" if c.dagger else "")


def md_table(summary: pd.DataFrame) -> str:
    """GitHub markdown: a heading and a table per block, then the legend (underline as
    ``<ins>``, which GitHub renders; it drops ``<u>``)."""
    header = ["Loss", "n"] + [
        f"{'Sep.' if mode == 'separated' else 'Concat.'} {METRIC_LABELS[m]}"
        for mode in MODES
        for m in METRIC_COLUMNS
    ]
    parts = []
    blocks = table_blocks(summary)
    for b in blocks:
        title = b.dataset + (f" — protocol {b.protocol}: {b.fields}" if b.diff else "")
        parts.append(f"### {title} (%, mean ± 95% CI half-width over n reproductions)\n")
        parts.append("| " + " | ".join(header) + " |")
        parts.append("|" + "|".join(["---"] + ["--:"] * (len(header) - 1)) + "|")
        for r in b.rows:
            label = r.label.replace("|", r"\|")
            label = f"<ins>{label}</ins>" if r.underline else label
            parts.append("| " + " | ".join([label, r.n] + [_md_cell(c) for c in r.cells]) + " |")
        parts.append("")
    words = legend(summary, blocks)
    parts += [line + "  " for line in words[:-1]] + [words[-1], ""]
    return "\n".join(parts)
