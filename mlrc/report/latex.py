"""The test-result tables in LaTeX: booktabs, ``\\pm``, ``\\textbf``, ``\\underline``,
``$^{\\dagger}$``, ``\\S`` after a traditional row, the ranking stability
(:mod:`mlrc.report.stability`) and the legend as paragraphs after the tabular;
:func:`latex_document` wraps it in a document that pdflatex compiles."""

from __future__ import annotations

import pandas as pd

from mlrc.report.layout import (
    COLUMNS,
    METRIC_LABELS,
    MODE_LABELS,
    Block,
    Cell,
    legend,
    table_blocks,
)
from mlrc.report.legend import DAGGER, DDAGGER, SECTION, TRADITIONAL_TITLE, WARM
from mlrc.report.stability import SECTION_TITLE, stability_text
from mlrc.report.values import MODES
from mlrc.store import METRIC_COLUMNS

__all__ = ["latex_document", "latex_escape", "latex_table", "latex_text"]

_TEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
}


def latex_escape(s: str) -> str:
    """``s`` with the characters LaTeX treats specially escaped."""
    return "".join(_TEX_SPECIAL.get(ch, ch) for ch in str(s))


def _cell(c: Cell | None) -> str:
    """A cell: bold when best, a dagger after it when not significantly worse."""
    if c is None:
        return "--"
    t = c.text(r"$\pm$")
    # \rlap: the dagger does not shift the centred number
    return (rf"\textbf{{{t}}}" if c.bold else t) + (r"\rlap{$^{\dagger}$}" if c.dagger else "")


def _traditional_header(b: Block) -> list[str]:
    """The column names of a traditional block's one model (R@1, …, MAP@R, Epoch)."""
    names = " & ".join(latex_escape(b.label(m)) for _, m in b.columns)
    return [rf" & & {names} \\", rf"\cmidrule(lr){{3-{2 + len(b.columns)}}}"]


def latex_table(summary: pd.DataFrame, standalone: bool = False) -> str:
    """The tabular with its legend (``standalone``: as a complete document)."""
    blocks = table_blocks(summary)
    width = max([len(COLUMNS)] + [len(b.columns) for b in blocks])  # value columns
    seps = " & ".join(rf"\multicolumn{{3}}{{c}}{{{MODE_LABELS[m]}}}" for m in MODES)
    metrics = " & ".join(METRIC_LABELS[m] for m in METRIC_COLUMNS)
    lines = [
        r"\begin{tabular}{l r " + "c" * width + "}",
        r"\toprule",
        rf" & & {seps} \\",
        r"\cmidrule(lr){3-5} \cmidrule(lr){6-8}",
        rf"Loss & $n$ & {metrics} & {metrics} \\",
    ]
    for b in blocks:
        title = rf"\textit{{{latex_escape(b.dataset)}}}"
        if b.traditional:
            title += rf" --- {latex_text(TRADITIONAL_TITLE)}"
        if b.diff:  # the fields are in the legend: a long list would widen the table
            title += rf" --- protocol {latex_escape(b.protocol)}"
        lines += [r"\midrule", rf"\multicolumn{{{width + 2}}}{{l}}{{{title}}} \\"]
        if b.traditional or b.after:  # its own columns (with metrics computed after the fact)
            lines += _traditional_header(b)
        for r in b.rows:
            label = latex_text(r.label)
            label = rf"\underline{{{label}}}" if r.underline else label
            n = r.n.replace("–", "--")
            lines.append(" & ".join([label, n] + [_cell(c) for c in r.cells]) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    words = [
        latex_text(line)
        .replace("Student-t", r"Student-$t$")
        .replace("t-test", r"$t$-test")
        .replace("Bold", r"\textbf{Bold}")
        .replace("Underlined", r"\underline{Underlined}")
        for line in legend(summary, blocks)
    ]
    stability = [latex_text(w) for w in stability_text(summary)]
    if stability:  # the ranking stability: a paragraph between the tabular and its legend
        body = " \\\\\n".join(stability)
        head = rf"{{\footnotesize\noindent \textbf{{{SECTION_TITLE}.}} "
        lines += [r"\par\smallskip", head + body + r"\par}"]
    # the legend: a paragraph after the tabular, wrapped at the line width
    lines += [
        r"\par\smallskip",
        "{\\footnotesize\\noindent " + " \\\\\n".join(words) + r"\par}",
        "",
    ]
    tabular = "\n".join(lines)
    return latex_document(tabular) if standalone else tabular


def latex_text(s: str) -> str:
    """Escaped text with the report's symbols in LaTeX (pdflatex's utf8 lacks some of them)."""
    return (
        latex_escape(s)
        .replace("±", r"$\pm$")
        .replace("≥", r"$\geq$")
        .replace(DAGGER, r"$^{\dagger}$")
        .replace(DDAGGER, r"$^{\ddagger}$")
        .replace(SECTION, r"\S{}")
        .replace(WARM, r"\P{}")
        .replace("…", r"\ldots{}")
        .replace("τ", r"$\tau$")
        .replace("↔", r"$\leftrightarrow$")
        .replace("·", r"$\cdot$")
        .replace("−", "$-$")
        .replace("—", "---")
        .replace("–", "--")
    )


def latex_document(body: str) -> str:
    """``body`` in a complete document (booktabs, landscape A4) that pdflatex compiles."""
    return "\n".join(
        [
            r"\documentclass{article}",
            r"\usepackage[T1]{fontenc}",
            r"\usepackage[utf8]{inputenc}",
            r"\usepackage{booktabs}",
            r"\usepackage[a4paper,landscape,margin=1.5cm]{geometry}",
            r"\pagestyle{empty}",
            r"\begin{document}",
            r"\noindent",
            body.rstrip("\n"),
            r"\end{document}",
            "",
        ]
    )
