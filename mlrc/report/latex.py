"""The test-result tables in LaTeX: booktabs, ``\\pm``, ``\\textbf``, ``\\underline``,
``$^{\\dagger}$``, and ``\\S`` after a traditional row. The ranking stability
(:mod:`mlrc.report.stability`) and the legend come as paragraphs after the tabular;
:func:`latex_document` wraps it in a document that pdflatex compiles."""

from __future__ import annotations

import unicodedata

import pandas as pd

from mlrc.report.layout import (
    COLUMNS,
    METRIC_LABELS,
    Block,
    Cell,
    legend,
    mode_label,
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
    names = " & ".join(latex_text(b.label(m)) for _, m in b.columns)
    return [rf" & & {names} \\", rf"\cmidrule(lr){{3-{2 + len(b.columns)}}}"]


def latex_table(summary: pd.DataFrame, standalone: bool = False) -> str:
    """The tabular with its legend (``standalone``: as a complete document)."""
    blocks = table_blocks(summary)
    width = max([len(COLUMNS)] + [len(b.columns) for b in blocks])  # value columns
    sizes = {b.sizes for b in blocks if not b.traditional}
    common = sizes.pop() if len(sizes) == 1 else None  # one header row serves every block
    seps = " & ".join(rf"\multicolumn{{3}}{{c}}{{{mode_label(m, common)}}}" for m in MODES)
    metrics = " & ".join(METRIC_LABELS[m] for m in METRIC_COLUMNS)
    lines = [
        r"\begin{tabular}{l r " + "c" * width + "}",
        r"\toprule",
        rf" & & {seps} \\",
        r"\cmidrule(lr){3-5} \cmidrule(lr){6-8}",
        rf"Loss & $n$ & {metrics} & {metrics} \\",
    ]
    for b in blocks:
        title = rf"\textit{{{latex_text(b.dataset)}}}"
        if b.traditional:
            title += rf" --- {latex_text(TRADITIONAL_TITLE)}"
        if b.diff:  # the fields are in the legend: a long list would widen the table
            title += rf" --- protocol {latex_text(b.protocol)}"
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
    """Escaped text with the report's symbols in LaTeX: pdflatex's utf8 input knows Latin-1
    but stops on ρ, π, →, ≤ …; those become math (:data:`_SYMBOLS`, Greek letters by name),
    and any other character beyond Latin-1 its Unicode name, so the document always compiles."""
    return "".join(_latex_char(c) for c in latex_escape(s))


_SYMBOLS = {
    "±": r"$\pm$",
    "≥": r"$\geq$",
    "≤": r"$\leq$",
    "≠": r"$\neq$",
    "≈": r"$\approx$",
    "×": r"$\times$",
    "∞": r"$\infty$",
    DAGGER: r"$^{\dagger}$",
    DDAGGER: r"$^{\ddagger}$",
    SECTION: r"\S{}",
    WARM: r"\P{}",
    "…": r"\ldots{}",
    "→": r"$\rightarrow$",
    "←": r"$\leftarrow$",
    "↔": r"$\leftrightarrow$",
    "·": r"$\cdot$",
    "−": "$-$",
    "—": "---",
    "–": "--",
    "‘": "`",
    "’": "'",
    "“": "``",
    "”": "''",
}
# capital Greek letters that LaTeX writes as Latin ones (it has no \Alpha)
_LATIN_GREEK = {"ALPHA": "A", "BETA": "B", "EPSILON": "E", "ZETA": "Z", "ETA": "H", "IOTA": "I"}
_LATIN_GREEK |= {"KAPPA": "K", "MU": "M", "NU": "N", "OMICRON": "O", "RHO": "P", "TAU": "T"}
_LATIN_GREEK |= {"CHI": "X"}
# the Greek letters plain LaTeX has (capitals: those not in _LATIN_GREEK)
_GREEK = set(
    [
        "alpha",
        "beta",
        "gamma",
        "delta",
        "epsilon",
        "zeta",
        "eta",
        "theta",
        "iota",
        "kappa",
        "lambda",
        "mu",
        "nu",
        "xi",
        "pi",
        "rho",
        "sigma",
        "tau",
        "upsilon",
        "phi",
        "chi",
        "psi",
        "omega",
    ]
)


def _latex_char(c: str) -> str:
    """One character of escaped text as pdflatex (T1, utf8) takes it."""
    if c in _SYMBOLS:
        return _SYMBOLS[c]
    if ord(c) < 256:
        return c
    name = unicodedata.name(c, "")
    if name.startswith(("GREEK SMALL LETTER ", "GREEK CAPITAL LETTER ")):
        letter = name.split(" LETTER ", 1)[1].split(" WITH ")[0]  # accents dropped
        letter = {"LAMDA": "LAMBDA", "FINAL SIGMA": "SIGMA"}.get(letter, letter)
        if "CAPITAL" in name and letter in _LATIN_GREEK:
            return _LATIN_GREEK[letter]
        if letter.lower() in _GREEK:
            return rf"$\{letter.capitalize() if 'CAPITAL' in name else letter.lower()}$"
        if letter == "OMICRON":
            return "o"
    return f"[{name.lower() or f'U+{ord(c):04X}'}]"


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
