"""Test-result tables with 95% confidence intervals, read from the store only.

Layout of the mean-field paper's Table 7: per dataset a block, one row per study (loss),
columns separated (mean of the four 128-D fold models) and concatenated (512-D) × MAP@R, P@1,
R-Precision, in percent, as "mean ± half-width of the 95% t-interval over reproductions".
"""

from __future__ import annotations

import math

import pandas as pd
from sqlalchemy import select
from sqlalchemy.engine import Engine

from mlrc.protocol import confidence_interval
from mlrc.store import METRIC_COLUMNS, Study, TestResult, session

MODES = ("separated", "concatenated")
METRIC_LABELS = {"map_at_r": "MAP@R", "precision_at_1": "P@1", "r_precision": "R-Prec"}
TIDY_COLUMNS = [
    "study",
    "dataset",
    "loss",
    "mode",
    "metric",
    "mean",
    "half_width",
    "n",
    "low",
    "high",
]


def collect(engine: Engine, studies: list[str] | None = None) -> pd.DataFrame:
    """One row per (study, reproduction, mode, metric) with the value in percent."""
    rows = []
    with session(engine) as s:
        q = (
            select(Study, TestResult)
            .join(TestResult, TestResult.study_id == Study.id)
            .where(TestResult.fold == -1)
        )
        if studies:
            q = q.where(Study.name.in_(studies))
        for st, tr in s.execute(q).all():
            for m in METRIC_COLUMNS:
                rows.append(
                    {
                        "study": st.name,
                        "dataset": st.dataset,
                        "loss": st.loss,
                        "reproduction": tr.reproduction,
                        "mode": tr.mode,
                        "metric": m,
                        "value": 100.0 * getattr(tr, m),
                    }
                )
    return pd.DataFrame(
        rows, columns=["study", "dataset", "loss", "reproduction", "mode", "metric", "value"]
    )


def summarize(values: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """Tidy summary: mean, CI half-width, n, low, high per (study, mode, metric), in percent."""
    out = []
    for (study, dataset, loss, mode, metric), g in values.groupby(
        ["study", "dataset", "loss", "mode", "metric"], sort=False
    ):
        v = g.sort_values("reproduction")["value"].to_numpy()
        mean, hw = confidence_interval(v, level) if len(v) >= 2 else (float(v.mean()), math.nan)
        out.append(
            {
                "study": study,
                "dataset": dataset,
                "loss": loss,
                "mode": mode,
                "metric": metric,
                "mean": mean,
                "half_width": hw,
                "n": len(v),
                "low": mean - hw,
                "high": mean + hw,
            }
        )
    return pd.DataFrame(out, columns=TIDY_COLUMNS)


def _cell(row: pd.Series, pm: str) -> str:
    if math.isnan(row["half_width"]):
        return f"{row['mean']:.2f}"
    return f"{row['mean']:.2f} {pm} {row['half_width']:.2f}"


def _blocks(summary: pd.DataFrame, pm: str) -> list[tuple[str, list[str], list[list[str]]]]:
    """Per dataset: (dataset, header, rows) with formatted cells."""
    header = ["Loss", "n"] + [
        f"{'Sep.' if mode == 'separated' else 'Concat.'} {METRIC_LABELS[m]}"
        for mode in MODES
        for m in METRIC_COLUMNS
    ]
    blocks = []
    for dataset, d in summary.groupby("dataset", sort=True):
        rows = []
        for study, g in d.groupby("study", sort=True):
            cells = {(r["mode"], r["metric"]): _cell(r, pm) for _, r in g.iterrows()}
            n = int(g["n"].max())
            loss = g["loss"].iloc[0]
            name = loss if d.loc[d["loss"] == loss, "study"].nunique() == 1 else study
            rows.append(
                [name, str(n)]
                + [cells.get((mode, m), "–") for mode in MODES for m in METRIC_COLUMNS]
            )
        blocks.append((dataset, header, rows))
    return blocks


def render(summary: pd.DataFrame, fmt: str) -> str:
    """``md`` | ``csv`` | ``latex``. Values in percent; ± is the 95% CI half-width."""
    if fmt == "csv":
        return summary.to_csv(index=False, float_format="%.4f")
    if summary.empty:
        return "(no test results in the store yet: run `mlrc study test`)\n"
    if fmt == "md":
        parts = []
        for dataset, header, rows in _blocks(summary, "±"):
            parts.append(f"### {dataset} (%, mean ± 95% CI half-width over n reproductions)\n")
            parts.append("| " + " | ".join(header) + " |")
            parts.append("|" + "|".join(["---"] + ["--:"] * (len(header) - 1)) + "|")
            parts += ["| " + " | ".join(r) + " |" for r in rows]
            parts.append("")
        return "\n".join(parts)
    if fmt == "latex":
        return _latex(summary)
    raise ValueError(f"unknown format {fmt!r} (md, csv or latex)")


def _latex(summary: pd.DataFrame) -> str:
    def esc(s: str) -> str:
        return (
            s.replace("\\", r"\textbackslash{}")
            .replace("_", r"\_")
            .replace("&", r"\&")
            .replace("%", r"\%")
            .replace("#", r"\#")
        )

    lines = [
        r"\begin{tabular}{l r " + "c" * 6 + "}",
        r"\toprule",
        r" & & \multicolumn{3}{c}{Separated (128-D)} & \multicolumn{3}{c}{Concatenated (512-D)} \\",
        r"\cmidrule(lr){3-5} \cmidrule(lr){6-8}",
        r"Loss & $n$ & MAP@R & P@1 & R-Prec & MAP@R & P@1 & R-Prec \\",
    ]
    for dataset, _, rows in _blocks(summary, r"$\pm$"):
        lines += [r"\midrule", rf"\multicolumn{{8}}{{l}}{{\textit{{{esc(dataset)}}}}} \\"]
        lines += [" & ".join([esc(r[0])] + r[1:]) + r" \\" for r in rows]
    lines += [r"\bottomrule", r"\end{tabular}", ""]
    return "\n".join(lines)
