"""The test-result tables in each format: :func:`render` picks ``md`` (GitHub markdown), ``csv``,
``latex``, ``html`` or ``json``. ``csv`` is tidy, one line per row × mode × metric. ``latex`` is
:mod:`mlrc.report.latex`, ``html`` is :mod:`mlrc.report.table_html`. ``json`` holds the tidy lines,
the blocks' rows as shown and the legend: everything a table shows, for other programs."""

from __future__ import annotations

import pandas as pd

from mlrc.report.latex import latex_document, latex_table
from mlrc.report.layout import Block, Cell, legend, table_blocks
from mlrc.report.legend import DAGGER
from mlrc.report.stability import stability_csv, stability_json, stability_md
from mlrc.report.summary import tidy_columns
from mlrc.report.table_html import html_page
from mlrc.report.values import ReportError

__all__ = ["FORMATS", "csv_table", "json_report", "md_table", "render"]

FORMATS = ("md", "csv", "latex", "html", "json", "stability-csv")


def render(summary: pd.DataFrame, fmt: str, *, standalone: bool = False) -> str:
    """``md`` | ``csv`` | ``latex`` | ``html`` | ``json`` | ``stability-csv`` (the ranking
    stability's numbers, :mod:`mlrc.report.stability`). Values in percent; ± is the 95% CI
    half-width. ``standalone``: LaTeX as a complete document (HTML is always a complete page)."""
    if fmt not in FORMATS:
        raise ReportError(f"unknown format {fmt!r} ({', '.join(FORMATS)})")
    if fmt == "csv":
        return csv_table(summary)
    if fmt == "json":
        return json_report(summary)
    if fmt == "stability-csv":
        return stability_csv(summary)
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
    """The summary's :func:`~mlrc.report.summary.tidy_columns` as CSV (missing ones empty)."""
    table, columns = summary.copy(), tidy_columns(summary)
    for c in columns:
        if c not in table.columns:
            table[c] = pd.NA
    return table.to_csv(index=False, columns=columns, float_format="%.10g")


def json_report(summary: pd.DataFrame) -> str:
    """JSON: ``lines`` (the CSV's tidy lines: values in percent, NaN as null), ``blocks`` (each
    table block's rows as shown: label, n, underline, and per column its text, bold and † mark;
    a traditional block says ``test_set_selection`` and its title) and ``legend`` (the marks
    and notes)."""
    import json

    table, columns = summary.copy(), tidy_columns(summary)
    for c in columns:
        if c not in table.columns:
            table[c] = pd.NA
    lines = json.loads(table[columns].to_json(orient="records", double_precision=15))
    blocks = [
        {
            "dataset": b.dataset,
            "protocol": b.protocol,
            "name": b.name,
            **({"title": b.title, "test_set_selection": True} if b.traditional else {}),
            "rows": [
                {
                    "label": r.label,
                    "study": r.study,
                    "n": r.n,
                    "baseline": r.baseline,
                    "archived": r.archived,
                    "underline": r.underline,
                    "cells": {
                        f"{mode}/{metric}": None
                        if c is None
                        else {"text": c.text("±"), "bold": c.bold, "not_worse_mark": c.dagger}
                        for (mode, metric), c in zip(b.columns, r.cells, strict=True)
                    },
                }
                for r in b.rows
            ],
        }
        for b in (table_blocks(summary) if not summary.empty else [])
    ]
    doc = {
        "format": "mlrc-report/1",
        "values": "percent; mean ± half-width of the 95% CI over reproductions",
        "lines": lines,
        "blocks": blocks,
        "legend": legend(summary, table_blocks(summary)) if not summary.empty else [],
        "stability": stability_json(summary),
    }
    return json.dumps(doc, indent=1, ensure_ascii=False, default=_plain) + "\n"


def _plain(value: object) -> object:
    """numpy scalars (a bool of the summary, say) as Python ones, for ``json``."""
    item = getattr(value, "item", None)
    if item is None:
        raise TypeError(f"not JSON serializable: {type(value).__name__}")
    return item()


def _md_cell(c: Cell | None) -> str:
    if c is None:
        return "–"
    t = c.text("±")
    return (f"**{t}**" if c.bold else t) + (f" {DAGGER}" if c.dagger else "")


def _md_header(b: Block) -> list[str]:
    """A block's column names: ``Sep. MAP@R``, …; a traditional block's one model: ``R@1``, …,
    ``MAP@R``, ``Epoch``."""
    if b.traditional:
        return ["Loss", "n"] + [b.label(m) for _, m in b.columns]
    return ["Loss", "n"] + [
        f"{'Sep.' if mode == 'separated' else 'Concat.'} {b.label(m)}" for mode, m in b.columns
    ]


def md_table(summary: pd.DataFrame) -> str:
    """GitHub markdown: a heading and a table per block, then the legend (underline as
    ``<ins>``, which GitHub renders; it drops ``<u>``)."""
    parts = []
    blocks = table_blocks(summary)
    for b in blocks:
        header = _md_header(b)
        units = "%, Epoch in epochs" if b.traditional else "%"
        parts.append(f"### {b.title} ({units}, mean ± 95% CI half-width over n reproductions)\n")
        parts.append("| " + " | ".join(header) + " |")
        parts.append("|" + "|".join(["---"] + ["--:"] * (len(header) - 1)) + "|")
        for r in b.rows:
            label = r.label.replace("|", r"\|")
            label = f"<ins>{label}</ins>" if r.underline else label
            parts.append("| " + " | ".join([label, r.n] + [_md_cell(c) for c in r.cells]) + " |")
        parts.append("")
    parts += stability_md(summary)
    words = legend(summary, blocks)
    parts += [line + "  " for line in words[:-1]] + [words[-1], ""]
    return "\n".join(parts)
