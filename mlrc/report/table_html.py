"""The test-result tables as one self-contained HTML page: ``<strong>``, ``<u>``,
``<sup>†</sup>``, baselines in grey italics, no external resources. The dashboard embeds it."""

from __future__ import annotations

import html

import pandas as pd

from mlrc.report.layout import (
    Block,
    Cell,
    Row,
    legend,
    metric_label,
    table_blocks,
)
from mlrc.report.legend import DAGGER
from mlrc.report.stability import stability_html
from mlrc.report.values import MODES

__all__ = ["html_page"]

_HTML_STYLE = (
    "body{font-family:sans-serif;margin:2em}"
    "table{border-collapse:collapse;margin-bottom:1em}"
    "th,td{padding:.25em .6em;text-align:right;white-space:nowrap}th{text-align:center}"
    "sup{line-height:0}"
    ".label{text-align:left}"
    "thead tr:first-child th{border-top:2px solid #000}"
    "thead tr:last-child th{border-bottom:1px solid #000}"
    "tbody tr:last-child td{border-bottom:2px solid #000}"
    "tr.baseline td{color:#555;font-style:italic}"
    ".legend{font-size:.9em}"
)


def _cell(c: Cell | None) -> str:
    if c is None:
        return "<td>–</td>"
    t = html.escape(c.text("±"))
    t = f"<strong>{t}</strong>" if c.bold else t
    return f"<td>{t}{f'<sup>{DAGGER}</sup>' if c.dagger else ''}</td>"


def _row(r: Row) -> str:
    esc = html.escape
    label = esc(r.label)
    label = f"<u>{label}</u>" if r.underline else label
    tds = [f'<td class="label">{label}</td>', f"<td>{r.n}</td>"]
    tds += [_cell(c) for c in r.cells]
    attrs = ' class="baseline"' if r.baseline else ""
    return f'<tr{attrs} data-row="{esc(r.study)}">' + "".join(tds) + "</tr>"


def _head(b: Block) -> list[str]:
    """A block's two header rows: the modes over their metrics; a traditional block's one model
    over its Recall@K, MAP@R and Epoch."""
    esc = html.escape
    if b.traditional:
        size = f" ({b.sizes[1]}-D)" if b.sizes else ""
        groups = f'<th colspan="{len(b.columns)}">one model{size}, epoch chosen on test</th>'
        names = "".join(f"<th>{esc(metric_label(m))}</th>" for _, m in b.columns)
    else:
        width = len(b.columns) // len(MODES)  # each mode's metrics (after the fact too)
        groups = "".join(f'<th colspan="{width}">{esc(b.mode_label(m))}</th>' for m in MODES)
        names = "".join(f"<th>{esc(b.label(m))}</th>" for _, m in b.columns)
    return [
        '<tr><th rowspan="2" class="label">Loss</th><th rowspan="2">n</th>' + groups + "</tr>",
        "<tr>" + names + "</tr>",
    ]


def _table(b: Block) -> list[str]:
    """A block: its heading and its table (a traditional one: ``data-test-set-selection``)."""
    esc = html.escape
    flag = ' data-test-set-selection="true"' if b.traditional else ""
    return [
        f"<h3>{esc(b.title)}</h3>",
        f'<table data-dataset="{esc(b.dataset)}" data-protocol="{esc(b.protocol)}"{flag}>',
        "<thead>",
        *_head(b),
        "</thead>",
        "<tbody>",
        *[_row(r) for r in b.rows],
        "</tbody>",
        "</table>",
    ]


def html_page(summary: pd.DataFrame) -> str:
    """The tables of ``summary`` and their legend as a complete HTML page."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        '<head><meta charset="utf-8"><title>mlrc test results</title>',
        f"<style>{_HTML_STYLE}</style></head>",
        "<body>",
    ]
    if summary.empty:
        parts.append("<p>No test results in the store yet: run <code>mlrc study test</code>.</p>")
    blocks = table_blocks(summary)
    for b in blocks:
        parts += _table(b)
    parts += stability_html(summary)
    parts.append('<div class="legend">')
    parts += [f"<p>{html.escape(line)}</p>" for line in legend(summary, blocks)]
    parts += ["</div>", "</body>", "</html>", ""]
    return "\n".join(parts)
