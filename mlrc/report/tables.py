"""Test-result tables with 95% confidence intervals, read from the store only.

Layout of the mean-field paper's Table 7: per dataset a block, one row per study (its loss, and
its strategy as "contrastive + metrix"), columns separated (mean of the four 128-D fold models)
and concatenated (512-D) × MAP@R, P@1, R-Precision, in percent, as "mean ± half-width of the 95%
Student-t interval over reproductions", with the number of reproductions ``n``.

Rows: the studies of the selected campaigns in campaign order (``mlrc_campaign_study.position``),
then the selected ``--study`` names (or, with no selection, every study) by name. Dataset blocks
follow the order in which their first row appears.

Marks, within one dataset block (a block with a single row has nothing to compare and gets none):

* **bold** — the best (highest) mean in its column; exact ties are all bold.
* underline — the block's best row: the highest concatenated (512-D) MAP@R, the reality check's
  headline number (separated MAP@R when no row has a concatenated result). Only the row label is
  underlined, so it does not collide with the bold cells.
* † — not significantly worse than the column's best row: Welch's two-sided t-test
  (``scipy.stats.ttest_ind(equal_var=False)``) of the row's per-reproduction values against those
  of the column's best row gives p ≥ 0.05. The best row itself is never marked; with fewer than
  two reproductions on either side p is NaN and there is no mark.

Formats: ``md`` (GitHub markdown; underline as ``<ins>``, which GitHub renders, it drops ``<u>``),
``csv`` (tidy: one line per study × mode × metric with mean, half_width, n, low, high, best,
best_row, p_value, not_worse), ``latex`` (booktabs, ``\\pm``, ``\\textbf``, ``\\underline``,
``$^{\\dagger}$``; ``standalone=True`` wraps it in a document that pdflatex compiles) and ``html``
(one self-contained page, ``<strong>``, ``<u>``, ``<sup>†</sup>``, no external resources). Every
format but CSV ends with the legend of ± and the marks.

An untrained ("Pretrained") row is not available: the store holds no test results of untrained
models (``mlrc data baselines`` computes untrained baselines on the fly, without storing them).
"""

from __future__ import annotations

import html
import math
import warnings

import numpy as np
import pandas as pd
from scipy import stats
from sqlalchemy import select
from sqlalchemy.engine import Engine

from mlrc.protocol import confidence_interval
from mlrc.store import METRIC_COLUMNS, CampaignStudy, Study, TestResult, session

FORMATS = ("md", "csv", "latex", "html")
MODES = ("separated", "concatenated")
MODE_LABELS = {"separated": "Separated (128-D)", "concatenated": "Concatenated (512-D)"}
METRIC_LABELS = {"map_at_r": "MAP@R", "precision_at_1": "P@1", "r_precision": "R-Prec"}
ALPHA = 0.05
DAGGER = "†"
VALUE_COLUMNS = [
    "study",
    "dataset",
    "loss",
    "strategy",
    "pruner",
    "reproduction",
    "mode",
    "metric",
    "value",
]
TIDY_COLUMNS = [
    "study",
    "dataset",
    "loss",
    "strategy",
    "pruner",
    "mode",
    "metric",
    "mean",
    "half_width",
    "n",
    "low",
    "high",
    "best",
    "best_row",
    "p_value",
    "not_worse",
]
LEGEND = [
    "Values in %: mean ± half-width of the 95% Student-t confidence interval over the n "
    "reproductions (separated: mean of the four 128-D fold models; concatenated: their 512-D "
    "concatenation).",
    "Bold: best mean in its column within the dataset. Underlined: the dataset's best row "
    "(highest concatenated MAP@R).",
    f"{DAGGER} not significantly worse than the column's best at p ≥ 0.05 (Welch's t-test over "
    "reproductions); the best row itself is not marked.",
]
DDAGGER = "‡"
PRUNED_NOTE = (
    f"{DDAGGER} searched with opt-in median pruning (search.pruner): trials below the median "
    "after a fold were stopped early; the protocol's search prunes nothing."
)


def _legend(summary: pd.DataFrame) -> list[str]:
    """The legend, with the pruning note when a row's search was pruned."""
    return LEGEND + ([PRUNED_NOTE] if (summary["pruner"] != "none").any() else [])


class ReportError(ValueError):
    """The selection cannot be reported (unknown campaign or study, unknown format)."""


# --- data ---------------------------------------------------------------------------------------


def select_studies(
    engine: Engine, studies: list[str] | None = None, campaigns: list[str] | None = None
) -> list[str]:
    """Names of the selected studies in table order: each campaign's studies by position (the
    campaigns in the order given), then the ``studies`` not already in, by name. With neither,
    every study, by dataset then name. Unknown names raise :class:`ReportError`."""
    with session(engine) as s:
        if not studies and not campaigns:
            rows = s.execute(select(Study.name).order_by(Study.dataset, Study.name)).all()
            return [r.name for r in rows]
        order: list[str] = []
        for campaign in dict.fromkeys(campaigns or []):
            members = s.execute(
                select(Study.name)
                .join(CampaignStudy, CampaignStudy.study_id == Study.id)
                .where(CampaignStudy.campaign == campaign)
                .order_by(CampaignStudy.position, Study.name)
            ).all()
            if not members:
                known = sorted(s.execute(select(CampaignStudy.campaign).distinct()).scalars())
                hint = ", ".join(known[:10]) + (", …" if len(known) > 10 else "")
                raise ReportError(
                    f"unknown campaign {campaign!r} (known: {hint or 'none in this store'})"
                )
            order += [m.name for m in members if m.name not in order]
        if studies:
            wanted = sorted(set(studies))
            found = set(s.execute(select(Study.name).where(Study.name.in_(wanted))).scalars())
            missing = [n for n in wanted if n not in found]
            if missing:
                raise ReportError(f"unknown study {', '.join(map(repr, missing))}")
            order += [n for n in wanted if n not in order]
        return order


def collect(
    engine: Engine, studies: list[str] | None = None, campaigns: list[str] | None = None
) -> pd.DataFrame:
    """One row per (study, reproduction, mode, metric) with the value in percent, in table
    order (see :func:`select_studies`)."""
    names = select_studies(engine, studies, campaigns)
    rank = {n: i for i, n in enumerate(names)}
    rows = []
    with session(engine) as s:
        q = (
            select(Study, TestResult)
            .join(TestResult, TestResult.study_id == Study.id)
            .where(TestResult.fold == -1, Study.name.in_(names))
        )
        for st, tr in s.execute(q).all():
            for m in METRIC_COLUMNS:
                rows.append(
                    {
                        "study": st.name,
                        "dataset": st.dataset,
                        "loss": st.loss,
                        "strategy": st.strategy,
                        "pruner": (st.config or {}).get("pruner") or "none",
                        "reproduction": tr.reproduction,
                        "mode": tr.mode,
                        "metric": m,
                        "value": 100.0 * getattr(tr, m),
                    }
                )
    values = pd.DataFrame(rows, columns=VALUE_COLUMNS)
    if values.empty:
        return values
    first = values.groupby("dataset")["study"].transform(lambda c: min(rank[x] for x in c))
    key = pd.DataFrame(
        {
            "dataset": first,
            "study": values["study"].map(rank),
            "mode": values["mode"].map({m: i for i, m in enumerate(MODES)}).fillna(len(MODES)),
            "metric": values["metric"].map({m: i for i, m in enumerate(METRIC_COLUMNS)}),
            "reproduction": values["reproduction"],
        }
    )
    order = key.sort_values(list(key.columns), kind="stable").index
    return values.loc[order].reset_index(drop=True)


def welch_p(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided p-value of Welch's t-test; NaN when either side has fewer than 2 values."""
    if len(a) < 2 or len(b) < 2:
        return math.nan
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(stats.ttest_ind(a, b, equal_var=False).pvalue)


def summarize(values: pd.DataFrame, level: float = 0.95, alpha: float = ALPHA) -> pd.DataFrame:
    """Tidy summary, one line per (study, mode, metric), in percent, in the order of ``values``:
    mean, CI half-width, n, low, high; ``best`` (highest mean of its dataset × mode × metric),
    ``best_row`` (the study with the dataset's highest concatenated MAP@R), ``p_value`` (Welch's
    t-test against the column's best study; NaN for that study itself and when n < 2 on either
    side) and ``not_worse`` (True for the best study and when p ≥ ``alpha``, False when
    p < ``alpha``, missing when p is NaN)."""
    out, samples = [], {}
    keys = ["study", "dataset", "loss", "strategy", "pruner", "mode", "metric"]
    for (study, dataset, loss, strategy, pruner, mode, metric), g in values.groupby(
        keys, sort=False, dropna=False
    ):
        v = g.sort_values("reproduction")["value"].to_numpy(dtype=np.float64)
        mean, hw = confidence_interval(v, level) if len(v) >= 2 else (float(v.mean()), math.nan)
        samples[(study, mode, metric)] = v
        out.append(
            {
                "study": study,
                "dataset": dataset,
                "loss": loss,
                "strategy": strategy,
                "pruner": pruner,
                "mode": mode,
                "metric": metric,
                "mean": mean,
                "half_width": hw,
                "n": len(v),
                "low": mean - hw,
                "high": mean + hw,
            }
        )
    summary = pd.DataFrame(out, columns=TIDY_COLUMNS[:12])
    summary["best"] = False
    summary["best_row"] = False
    summary["p_value"] = math.nan
    summary["not_worse"] = pd.Series([pd.NA] * len(summary), dtype="boolean")
    for _, col in summary.groupby(["dataset", "mode", "metric"], sort=False):
        top = col["mean"].max()
        summary.loc[col.index[col["mean"] == top], "best"] = True
        ref = col.index[col["mean"] == top][0]  # first in table order among exact ties
        summary.loc[ref, "not_worse"] = True
        ref_values = samples[tuple(summary.loc[ref, ["study", "mode", "metric"]])]
        for i in col.index.drop(ref):
            p = welch_p(samples[tuple(summary.loc[i, ["study", "mode", "metric"]])], ref_values)
            summary.loc[i, "p_value"] = p
            if not math.isnan(p):
                summary.loc[i, "not_worse"] = p >= alpha
    for _, d in summary.groupby("dataset", sort=False):
        best = _best_rows(d)
        summary.loc[d.index[d["study"].isin(best)], "best_row"] = True
    return summary


def _best_rows(d: pd.DataFrame) -> list[str]:
    """Studies of one dataset with the highest concatenated MAP@R (else separated MAP@R)."""
    for mode in ("concatenated", "separated"):
        c = d[(d["mode"] == mode) & (d["metric"] == "map_at_r")]
        if not c.empty:
            return c.loc[c["mean"] == c["mean"].max(), "study"].tolist()
    return []


# --- rendering ----------------------------------------------------------------------------------


def row_label(loss: str, strategy: str | None) -> str:
    """``loss`` or ``loss + strategy`` (a missing strategy is None or NaN in a frame)."""
    return f"{loss} + {strategy}" if isinstance(strategy, str) and strategy else loss


class _Cell:
    def __init__(self, r: pd.Series, compared: bool) -> None:
        self.mean, self.half_width = float(r["mean"]), float(r["half_width"])
        self.bold = compared and bool(r["best"])
        # the column's reference row: best, and not tested against itself
        ref = bool(r["best"]) and math.isnan(r["p_value"])
        not_worse = r["not_worse"]
        self.dagger = compared and not ref and not pd.isna(not_worse) and bool(not_worse)

    def text(self, pm: str) -> str:
        if math.isnan(self.half_width):
            return f"{self.mean:.2f}"
        return f"{self.mean:.2f} {pm} {self.half_width:.2f}"


class _Row:
    def __init__(self, label: str, n: str, underline: bool, cells: list[_Cell | None]) -> None:
        self.label, self.n, self.underline, self.cells = label, n, underline, cells


def _blocks(summary: pd.DataFrame) -> list[tuple[str, list[_Row]]]:
    """Per dataset (in summary order): its rows with marks resolved."""
    columns = [(mode, m) for mode in MODES for m in METRIC_COLUMNS]
    blocks = []
    for dataset, d in summary.groupby("dataset", sort=False):
        # a column's marks need at least two rows with a value in it
        compared = {c: ((d["mode"] == c[0]) & (d["metric"] == c[1])).sum() >= 2 for c in columns}
        n_rows = d["study"].nunique()
        labels = {
            st: row_label(g["loss"].iloc[0], g["strategy"].iloc[0])
            for st, g in d.groupby("study", sort=False)
        }
        pruned = {st for st, g in d.groupby("study", sort=False) if g["pruner"].iloc[0] != "none"}
        rows = []
        for study, g in d.groupby("study", sort=False):
            label = labels[study]
            if list(labels.values()).count(label) > 1:
                label = f"{label} ({study})"
            if study in pruned:
                label = f"{label} {DDAGGER}"
            by = {(r["mode"], r["metric"]): r for _, r in g.iterrows()}
            lo, hi = int(g["n"].min()), int(g["n"].max())
            rows.append(
                _Row(
                    label,
                    str(hi) if lo == hi else f"{lo}–{hi}",
                    n_rows >= 2 and bool(g["best_row"].any()),
                    [_Cell(by[c], compared[c]) if c in by else None for c in columns],
                )
            )
        blocks.append((dataset, rows))
    return blocks


def render(summary: pd.DataFrame, fmt: str, *, standalone: bool = False) -> str:
    """``md`` | ``csv`` | ``latex`` | ``html``. Values in percent; ± is the 95% CI half-width.
    ``standalone``: LaTeX as a complete document (HTML is always a complete page)."""
    if fmt not in FORMATS:
        raise ReportError(f"unknown format {fmt!r} ({', '.join(FORMATS)})")
    if fmt == "csv":
        return summary.to_csv(index=False, float_format="%.10g")
    if fmt == "html":
        return _html(summary)
    if summary.empty:
        empty = "(no test results in the store yet: run `mlrc study test`)"
        if fmt == "latex" and standalone:
            return _latex_document(empty.replace("`", ""))
        return empty + "\n"
    if fmt == "md":
        return _md(summary)
    return _latex(summary, standalone)


def _md(summary: pd.DataFrame) -> str:
    header = ["Loss", "n"] + [
        f"{'Sep.' if mode == 'separated' else 'Concat.'} {METRIC_LABELS[m]}"
        for mode in MODES
        for m in METRIC_COLUMNS
    ]

    def cell(c: _Cell | None) -> str:
        if c is None:
            return "–"
        t = c.text("±")
        return (f"**{t}**" if c.bold else t) + (f" {DAGGER}" if c.dagger else "")

    parts = []
    for dataset, rows in _blocks(summary):
        parts.append(f"### {dataset} (%, mean ± 95% CI half-width over n reproductions)\n")
        parts.append("| " + " | ".join(header) + " |")
        parts.append("|" + "|".join(["---"] + ["--:"] * (len(header) - 1)) + "|")
        for r in rows:
            label = r.label.replace("|", r"\|")
            label = f"<ins>{label}</ins>" if r.underline else label
            parts.append("| " + " | ".join([label, r.n] + [cell(c) for c in r.cells]) + " |")
        parts.append("")
    legend = _legend(summary)
    parts += [line + "  " for line in legend[:-1]] + [legend[-1], ""]
    return "\n".join(parts)


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
    return "".join(_TEX_SPECIAL.get(ch, ch) for ch in str(s))


def _latex(summary: pd.DataFrame, standalone: bool) -> str:
    def cell(c: _Cell | None) -> str:
        if c is None:
            return "--"
        t = c.text(r"$\pm$")
        # \rlap: the dagger does not shift the centred number
        return (rf"\textbf{{{t}}}" if c.bold else t) + (r"\rlap{$^{\dagger}$}" if c.dagger else "")

    seps = " & ".join(rf"\multicolumn{{3}}{{c}}{{{MODE_LABELS[m]}}}" for m in MODES)
    metrics = " & ".join(METRIC_LABELS[m] for m in METRIC_COLUMNS)
    lines = [
        r"\begin{tabular}{l r " + "c" * 6 + "}",
        r"\toprule",
        rf" & & {seps} \\",
        r"\cmidrule(lr){3-5} \cmidrule(lr){6-8}",
        rf"Loss & $n$ & {metrics} & {metrics} \\",
    ]
    for dataset, rows in _blocks(summary):
        lines += [r"\midrule", rf"\multicolumn{{8}}{{l}}{{\textit{{{latex_escape(dataset)}}}}} \\"]
        for r in rows:
            label = latex_escape(r.label).replace(DDAGGER, r"$^{\ddagger}$")
            label = rf"\underline{{{label}}}" if r.underline else label
            n = r.n.replace("–", "--")
            lines.append(" & ".join([label, n] + [cell(c) for c in r.cells]) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    legend = [
        latex_escape(line)
        .replace("±", r"$\pm$")
        .replace("≥", r"$\geq$")
        .replace(DAGGER, r"$^{\dagger}$")
        .replace(DDAGGER, r"$^{\ddagger}$")
        .replace("Student-t", r"Student-$t$")
        .replace("t-test", r"$t$-test")
        .replace("Bold", r"\textbf{Bold}")
        .replace("Underlined", r"\underline{Underlined}")
        for line in _legend(summary)
    ]
    # the legend: a paragraph after the tabular, wrapped at the line width
    lines += [
        r"\par\smallskip",
        "{\\footnotesize\\noindent " + " \\\\\n".join(legend) + r"\par}",
        "",
    ]
    tabular = "\n".join(lines)
    return _latex_document(tabular) if standalone else tabular


def _latex_document(body: str) -> str:
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


_HTML_STYLE = (
    "body{font-family:sans-serif;margin:2em}"
    "table{border-collapse:collapse;margin-bottom:1em}"
    "th,td{padding:.25em .6em;text-align:right;white-space:nowrap}th{text-align:center}"
    "sup{line-height:0}"
    ".label{text-align:left}"
    "thead tr:first-child th{border-top:2px solid #000}"
    "thead tr:last-child th{border-bottom:1px solid #000}"
    "tbody tr:last-child td{border-bottom:2px solid #000}"
    ".legend{font-size:.9em}"
)


def _html(summary: pd.DataFrame) -> str:
    esc = html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        '<head><meta charset="utf-8"><title>mlrc test results</title>',
        f"<style>{_HTML_STYLE}</style></head>",
        "<body>",
    ]
    if summary.empty:
        parts.append("<p>No test results in the store yet: run <code>mlrc study test</code>.</p>")
    for dataset, rows in _blocks(summary):
        parts.append(f"<h3>{esc(dataset)}</h3>")
        parts.append("<table>")
        parts.append("<thead>")
        parts.append(
            '<tr><th rowspan="2" class="label">Loss</th><th rowspan="2">n</th>'
            + "".join(f'<th colspan="3">{esc(MODE_LABELS[m])}</th>' for m in MODES)
            + "</tr>"
        )
        parts.append(
            "<tr>"
            + "".join(f"<th>{esc(METRIC_LABELS[m])}</th>" for _ in MODES for m in METRIC_COLUMNS)
            + "</tr>"
        )
        parts.append("</thead>")
        parts.append("<tbody>")
        for r in rows:
            label = esc(r.label)
            label = f"<u>{label}</u>" if r.underline else label
            tds = [f'<td class="label">{label}</td>', f"<td>{r.n}</td>"]
            for c in r.cells:
                if c is None:
                    tds.append("<td>–</td>")
                    continue
                t = esc(c.text("±"))
                t = f"<strong>{t}</strong>" if c.bold else t
                tds.append(f"<td>{t}{f'<sup>{DAGGER}</sup>' if c.dagger else ''}</td>")
            parts.append("<tr>" + "".join(tds) + "</tr>")
        parts.append("</tbody>")
        parts.append("</table>")
    parts.append('<div class="legend">')
    parts += [f"<p>{esc(line)}</p>" for line in _legend(summary)]
    parts += ["</div>", "</body>", "</html>", ""]
    return "\n".join(parts)
