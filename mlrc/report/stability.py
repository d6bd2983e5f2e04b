"""Whether a report's ranking of rows holds: τ between metrics, a bootstrap of the best row,
separated/concatenated flips. Per table block (a dataset, or one protocol of it) and across
blocks, from the summary of :func:`mlrc.report.summary.summarize` alone.

Rows are a block's compared studies (baselines, archived studies and the chosen epoch take no
part, as in the marks). Four checks, all on means over reproductions in percent:

* **τ between metrics** (``tau``): Kendall's τ-b (``scipy.stats.kendalltau``, variant ``b``:
  ties in either ranking lower the denominator) between the rows' rankings by two metrics of
  one mode (separated MAP@R vs separated P@1, …), over the rows that have both. 1: the same
  order; −1: reversed; NaN: one of the two rankings is all ties.
* **best row kept** (``best_kept``): a bootstrap over reproductions. Each resample draws, for
  every row independently, as many of its reproductions as it has, with replacement, and takes
  their mean; the number is the fraction of :data:`RESAMPLES` resamples (generator
  ``numpy.random.default_rng(SEED)``) in which the column's best row (highest mean; with exact
  ties, any of them) has the highest resampled mean (a tie for it counts as kept). Computed per
  column; the reports show the headline column (:data:`HEADLINE`). Not computed when a row has
  a single reproduction.
* **separated/concatenated flips** (``flips`` and ``flip``): pairs of rows whose order by a
  metric's separated (128-D) mean is the reverse of their order by its concatenated (512-D)
  mean; a tie on either side is not a flip.
* **across blocks** (``across``): Kendall's τ-b between two blocks' rankings of the rows they
  share (same loss and strategy, :func:`~mlrc.report.layout.row_label`) by the headline column;
  only for pairs of blocks sharing at least two such rows.

:func:`stability_lines` gives every number as tidy records (:data:`STABILITY_COLUMNS`), the
report's ``stability-csv`` format and the JSON's ``stability``; :func:`stability_md` and
:func:`stability_html` the report's short section. A block with fewer than two rows, or with
one reproduction per row, gets one ``note`` line instead of numbers."""

from __future__ import annotations

import html
import itertools
import math
from typing import Any

import numpy as np
import pandas as pd

from mlrc.protocol.scoring import higher_is_better
from mlrc.report.layout import metric_label, row_label, table_blocks
from mlrc.report.rescored import AFTER, rescored_label
from mlrc.report.summary import SAMPLES, with_defaults
from mlrc.report.values import UNMARKED_METRICS

__all__ = [
    "HEADLINE",
    "RESAMPLES",
    "SEED",
    "STABILITY_COLUMNS",
    "best_kept",
    "flipped_pairs",
    "kendall_tau",
    "stability_csv",
    "stability_html",
    "stability_json",
    "stability_lines",
    "stability_md",
    "stability_text",
]

RESAMPLES = 1000  # bootstrap resamples per column
SEED = 0  # numpy.random.default_rng seed of every column's bootstrap
# the headline column, as the underline's: concatenated MAP@R, else separated MAP@R
HEADLINE = (("concatenated", "map_at_r"), ("separated", "map_at_r"))
STABILITY_COLUMNS = [
    "kind",  # tau | best_kept | flips | flip | across | note
    "dataset",
    "protocol",
    "mode",
    "metric",
    "other_dataset",  # across: the other block
    "other_protocol",
    "other_mode",  # flips, flip: concatenated (mode: separated)
    "other_metric",  # tau: the metric compared with
    "row",  # best_kept: the best row (tied rows joined by " = "); flip: ahead when separated
    "other_row",  # flip: ahead when concatenated
    "rows",  # rows compared (pairs: rows × (rows − 1) / 2)
    "value",  # tau, across: τ-b; best_kept: fraction; flips: pairs flipped; flip: concat. lead
    "p_value",  # tau, across: scipy's two-sided p of τ = 0
    "resamples",  # best_kept
    "seed",  # best_kept
    "note",  # note: why a block has no numbers; best_kept: why it has none
]
SECTION_TITLE = "Ranking stability"
SECTION_LEGEND = (
    f"τ-b: Kendall's rank correlation of the rows' order by two metrics (1: same order, −1: "
    f"reversed, ties allowed). Best row kept: fraction of {RESAMPLES} bootstrap resamples of "
    f"each row's reproductions (seed {SEED}) in which the best row by concatenated MAP@R stays "
    "best. Flips: pairs of rows that separated and concatenated MAP@R order differently. "
    "Baselines and archived rows left out."
)


def kendall_tau(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Kendall's τ-b of two rankings of the same rows and scipy's two-sided p-value (NaN, NaN
    with fewer than two rows or when either side is all ties)."""
    if len(a) < 2 or len(set(a.tolist())) < 2 or len(set(b.tolist())) < 2:
        return math.nan, math.nan
    from scipy import stats  # here, not at import: scipy.stats takes ~1 s to import

    result = stats.kendalltau(a, b, variant="b")
    return float(result.statistic), float(result.pvalue)


def best_kept(
    samples: list[np.ndarray], best: list[int], resamples: int = RESAMPLES, seed: int = SEED
) -> float:
    """Fraction of ``resamples`` bootstrap resamples in which one of the rows ``best`` (indices
    into ``samples``) has the highest mean. Each resample draws each row's values independently
    with replacement (``rng.integers(0, n, (resamples, n))``, rows in order, one generator
    ``numpy.random.default_rng(seed)``). Each row needs at least one value."""
    if resamples < 1 or not samples or min(len(v) for v in samples) < 1:
        raise ValueError(
            f"best_kept needs resamples ≥ 1 and rows with values (got {resamples} resamples, "
            f"row sizes {[len(v) for v in samples]})"
        )
    rng = np.random.default_rng(seed)
    means = np.empty((resamples, len(samples)))
    for j, v in enumerate(samples):
        means[:, j] = v[rng.integers(0, len(v), size=(resamples, len(v)))].mean(axis=1)
    top = means.max(axis=1, keepdims=True)
    return float(np.mean((means[:, best] >= top).any(axis=1)))


def flipped_pairs(sep: np.ndarray, cat: np.ndarray) -> list[tuple[int, int]]:
    """Pairs ``(i, j)`` of rows with ``sep[i] > sep[j]`` and ``cat[j] > cat[i]`` (ahead when
    separated, behind when concatenated); ties on either side are no flip."""
    n = len(sep)
    return [
        (i, j) if sep[i] > sep[j] else (j, i)
        for i, j in itertools.combinations(range(n), 2)
        if (sep[i] - sep[j]) * (cat[i] - cat[j]) < 0
    ]


# --- the records ------------------------------------------------------------------------------


def _compared(summary: pd.DataFrame) -> pd.DataFrame:
    return summary[
        ~summary["baseline"] & ~summary["archived"] & ~summary["metric"].isin(UNMARKED_METRICS)
    ]


def _record(**kw: Any) -> dict[str, Any]:
    return {c: kw.get(c) for c in STABILITY_COLUMNS}


class _Block:
    """One block's rows: labels, keys (loss and strategy) and per column means and samples."""

    def __init__(self, name: str, dataset: str, protocol: str, lines: pd.DataFrame) -> None:
        self.name, self.dataset, self.protocol = name, dataset, protocol
        self.studies = list(dict.fromkeys(lines["study"]))
        first = lines.drop_duplicates("study").set_index("study")
        keys = [row_label(first.at[s, "loss"], first.at[s, "strategy"]) for s in self.studies]
        self.labels = [
            k if keys.count(k) == 1 else f"{k} ({s})"
            for k, s in zip(keys, self.studies, strict=True)
        ]
        self.keys = {k: s for k, s in zip(keys, self.studies, strict=True) if keys.count(k) == 1}
        self.columns = list(dict.fromkeys(zip(lines["mode"], lines["metric"], strict=True)))
        by = lines.set_index(["study", "mode", "metric"])
        self.mean = {c: {} for c in self.columns}
        self.samples: dict[tuple[str, str], dict[str, np.ndarray]] = {c: {} for c in self.columns}
        # oriented: an error rate (FNMR) enters negated, so that higher is better in every
        # column and τ, the best row kept and flips read alike for every metric
        for (study, mode, metric), r in by.iterrows():
            sign = 1.0 if higher_is_better(metric) else -1.0
            self.mean[(mode, metric)][study] = sign * float(r["mean"])
            if SAMPLES in by.columns and isinstance(r[SAMPLES], tuple):
                values = np.asarray(r[SAMPLES], dtype=np.float64)
                self.samples[(mode, metric)][study] = sign * values
        self.max_n = int(lines["n"].max()) if len(lines) else 0

    def common(self, *columns: tuple[str, str]) -> list[str]:
        """The studies with a value in every one of ``columns``, in row order."""
        return [s for s in self.studies if all(s in self.mean[c] for c in columns)]

    def label(self, study: str) -> str:
        return self.labels[self.studies.index(study)]

    def headline(self) -> tuple[str, str] | None:
        """The headline column (:data:`HEADLINE`) that every row has, if any."""
        return next((c for c in HEADLINE if len(self.common(c)) == len(self.studies)), None)


def _blocks(summary: pd.DataFrame) -> list[_Block]:
    lines = _compared(summary)
    out = []
    for b in table_blocks(summary):
        d = lines[(lines["dataset"] == b.dataset) & (lines["protocol"] == b.protocol)]
        out.append(_Block(b.name, b.dataset, b.protocol, d))
    return out


def _taus(b: _Block) -> list[dict[str, Any]]:
    out = []
    for (mode_a, m_a), (mode_b, m_b) in itertools.combinations(b.columns, 2):
        if mode_a != mode_b:
            continue
        rows = b.common((mode_a, m_a), (mode_b, m_b))
        x = np.array([b.mean[(mode_a, m_a)][s] for s in rows])
        y = np.array([b.mean[(mode_b, m_b)][s] for s in rows])
        tau, p = kendall_tau(x, y)
        out.append(
            _record(
                kind="tau",
                **_where(b),
                mode=mode_a,
                metric=m_a,
                other_metric=m_b,
                rows=len(rows),
                value=tau,
                p_value=p,
            )
        )
    return out


def _where(b: _Block) -> dict[str, str]:
    return {"dataset": b.dataset, "protocol": b.protocol}


def _kept(b: _Block, resamples: int, seed: int) -> list[dict[str, Any]]:
    out = []
    for mode, metric in b.columns:
        rows = b.common((mode, metric))
        means = np.array([b.mean[(mode, metric)][s] for s in rows])
        best = [i for i, m in enumerate(means) if m == means.max()]
        rec = _record(
            kind="best_kept",
            **_where(b),
            mode=mode,
            metric=metric,
            rows=len(rows),
            row=" = ".join(b.label(rows[i]) for i in best),
            resamples=resamples,
            seed=seed,
        )
        samples = [b.samples[(mode, metric)].get(s) for s in rows]
        if len(rows) < 2:
            rec["note"] = "one row has this column"
        elif any(v is None for v in samples):
            rec["note"] = "no per-reproduction values"
        elif min(len(v) for v in samples) < 2:
            one = next(rows[i] for i, v in enumerate(samples) if len(v) < 2)
            rec["note"] = f"{b.label(one)} has one reproduction"
        else:
            rec["value"] = best_kept(samples, best, resamples, seed)
        out.append(rec)
    return out


def _flips(b: _Block) -> list[dict[str, Any]]:
    out = []
    metrics = [m for mode, m in b.columns if mode == "separated"]
    for metric in metrics:
        sep_col, cat_col = ("separated", metric), ("concatenated", metric)
        if cat_col not in b.mean:
            continue
        rows = b.common(sep_col, cat_col)
        sep = np.array([b.mean[sep_col][s] for s in rows])
        cat = np.array([b.mean[cat_col][s] for s in rows])
        pairs = flipped_pairs(sep, cat)
        flip = {"mode": "separated", "metric": metric, "other_mode": "concatenated"}
        out.append(_record(kind="flips", **_where(b), **flip, rows=len(rows), value=len(pairs)))
        out += [
            _record(
                kind="flip",
                **_where(b),
                **flip,
                rows=len(rows),
                row=b.label(rows[i]),
                other_row=b.label(rows[j]),
                value=cat[j] - cat[i],
            )
            for i, j in pairs
        ]
    return out


def _note(b: _Block) -> str:
    """Why a block has no numbers ("" when it has)."""
    if not b.studies:
        return "no row to rank (baselines and archived studies take no part)"
    if len(b.studies) < 2:
        return f"one row ({b.labels[0]}): no ranking to check"
    if b.max_n < 2:
        return "one reproduction per row: no ranking stability to measure"
    return ""


def _across(blocks: list[_Block]) -> list[dict[str, Any]]:
    out = []
    for a, b in itertools.combinations(blocks, 2):
        col = a.headline()
        if col is None or col != b.headline():
            continue
        shared = [k for k in a.keys if k in b.keys]
        if len(shared) < 2:
            continue
        x = np.array([a.mean[col][a.keys[k]] for k in shared])
        y = np.array([b.mean[col][b.keys[k]] for k in shared])
        tau, p = kendall_tau(x, y)
        out.append(
            _record(
                kind="across",
                **_where(a),
                other_dataset=b.dataset,
                other_protocol=b.protocol,
                mode=col[0],
                metric=col[1],
                rows=len(shared),
                value=tau,
                p_value=p,
            )
        )
    return out


def stability_lines(
    summary: pd.DataFrame, resamples: int = RESAMPLES, seed: int = SEED
) -> list[dict[str, Any]]:
    """Every number of the section as records of :data:`STABILITY_COLUMNS`, block by block
    (``tau``, ``best_kept``, ``flips`` and ``flip`` lines, or one ``note``), then ``across``."""
    if summary.empty:
        return []
    blocks = _blocks(with_defaults(summary))
    out = []
    for b in blocks:
        note = _note(b)
        if note:
            out.append(_record(kind="note", **_where(b), rows=len(b.studies), note=note))
        else:
            out += _taus(b) + _kept(b, resamples, seed) + _flips(b)
    return out + _across([b for b in blocks if not _note(b)])


def stability_csv(summary: pd.DataFrame) -> str:
    """:func:`stability_lines` as CSV (the report's ``stability-csv`` format)."""
    table = pd.DataFrame(stability_lines(summary), columns=STABILITY_COLUMNS)
    return table.to_csv(index=False, float_format="%.10g")


def stability_json(summary: pd.DataFrame) -> dict[str, Any]:
    """The JSON report's ``stability``: the settings (``resamples``, ``seed``, ``tau``: the
    variant) and ``lines``, those of :func:`stability_lines` (NaN as null)."""
    lines = [
        {k: None if isinstance(v, float) and math.isnan(v) else _plain(v) for k, v in r.items()}
        for r in stability_lines(summary)
    ]
    tau = "Kendall tau-b (scipy.stats.kendalltau, variant b)"
    return {"resamples": RESAMPLES, "seed": SEED, "tau": tau, "lines": lines}


def _plain(v: Any) -> Any:
    """A numpy scalar as a Python one."""
    return v.item() if isinstance(v, np.generic) else v


# --- the section ------------------------------------------------------------------------------

_MODE_SHORT = {"separated": "Sep.", "concatenated": "Concat."}
_SHOWN_FLIPS = 3  # a cell names at most this many flipped pairs


def _num(v: Any) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.2f}"


def _label(metric: str) -> str:
    """The table's name of a metric, or its own name for one the table does not name."""
    try:
        return metric_label(metric)
    except KeyError:  # computed after the fact: its column's name without the mark
        return rescored_label(metric).removesuffix(AFTER)


def _tau_cell(lines: list[dict[str, Any]]) -> str:
    """Per mode, each metric's τ-b against MAP@R: ``Sep. P@1 0.33, R-Prec 1.00; Concat. …``."""
    parts = []
    for mode in dict.fromkeys(r["mode"] for r in lines):
        taus = [
            f"{_label(r['other_metric'] if r['metric'] == 'map_at_r' else r['metric'])} "
            f"{_num(r['value'])}"
            for r in lines
            if r["mode"] == mode and "map_at_r" in (r["metric"], r["other_metric"])
        ]
        if taus:
            parts.append(f"{_MODE_SHORT.get(mode, mode)} {', '.join(taus)}")
    return "; ".join(parts) or "–"


def _kept_cell(lines: list[dict[str, Any]], headline: tuple[str, str] | None) -> str:
    r = next((r for r in lines if (r["mode"], r["metric"]) == headline), None)
    if r is None:
        return "–"
    where = "" if headline == HEADLINE[0] else f" ({_MODE_SHORT[r['mode']]} MAP@R)"
    if r["value"] is None:
        return f"– ({r['note']})"
    return f"{r['row']} {_num(r['value'])}{where}"


def _flips_cell(lines: list[dict[str, Any]]) -> str:
    count = next((r for r in lines if r["kind"] == "flips" and r["metric"] == "map_at_r"), None)
    if count is None:
        return "–"
    pairs = count["rows"] * (count["rows"] - 1) // 2
    shown = [
        f"{r['row']} ↔ {r['other_row']}"
        for r in lines
        if r["kind"] == "flip" and r["metric"] == "map_at_r"
    ]
    more = f", … ({len(shown) - _SHOWN_FLIPS} more)" if len(shown) > _SHOWN_FLIPS else ""
    text = f"{count['value']} of {pairs}"
    return text + (f": {', '.join(shown[:_SHOWN_FLIPS])}{more}" if shown else "")


def _items(summary: pd.DataFrame) -> tuple[list[str], bool]:
    """The section's items: per block its numbers (τ-b vs MAP@R, best row kept, MAP@R flips)
    or its one-line note, then the blocks' τ-b across; and whether any item has numbers."""
    lines = stability_lines(summary)
    items = []
    blocks = _blocks(with_defaults(summary))
    name = {(b.dataset, b.protocol): b.name for b in blocks}
    for b in blocks:
        mine = [r for r in lines if (r["dataset"], r["protocol"]) == (b.dataset, b.protocol)]
        note = next((r["note"] for r in mine if r["kind"] == "note"), None)
        if note:
            items.append(f"{b.name}: {note}.")
            continue
        taus = [r for r in mine if r["kind"] == "tau"]
        kept = [r for r in mine if r["kind"] == "best_kept"]
        flips = [r for r in mine if r["kind"] in ("flips", "flip")]
        items.append(
            f"{b.name} ({len(b.studies)} rows): τ-b vs MAP@R {_tau_cell(taus)} · best row kept "
            f"{_kept_cell(kept, b.headline())} · sep./concat. flips (MAP@R) {_flips_cell(flips)}."
        )
    across = [
        f"{name[(r['dataset'], r['protocol'])]} vs {name[(r['other_dataset'], r['other_protocol'])]}"
        f" {_num(r['value'])} ({r['rows']} rows)"
        for r in lines
        if r["kind"] == "across"
    ]
    if across:
        items.append("Across blocks, τ-b of the shared rows' order: " + "; ".join(across) + ".")
    return items, any(r["kind"] != "note" for r in lines)


def stability_md(summary: pd.DataFrame) -> list[str]:
    """The section in GitHub markdown, between the tables and their legend: a bold
    ``Ranking stability`` line, a bullet per block (its numbers, or one line saying why it has
    none), one for the blocks' τ-b across, and how to read it ([] for an empty summary). No
    table and no heading: the report's tables and their blocks' headings stay the only ones.
    The line on how to read it only when a block has numbers."""
    if summary.empty:
        return []
    items, numbers = _items(summary)
    how = [SECTION_LEGEND, ""] if numbers else []
    return [f"**{SECTION_TITLE}**", "", *[f"- {i}" for i in items], "", *how]


def stability_text(summary: pd.DataFrame) -> list[str]:
    """The section's items as plain lines, then the line on how to read them when a block has
    numbers ([] for an empty summary): for the LaTeX report's paragraph."""
    if summary.empty:
        return []
    items, numbers = _items(summary)
    return items + ([SECTION_LEGEND] if numbers else [])


def stability_html(summary: pd.DataFrame) -> list[str]:
    """The section as HTML: a ``<section class="stability">`` with a list ([] for an empty
    summary)."""
    if summary.empty:
        return []
    esc = html.escape
    items, numbers = _items(summary)
    how = f'<p class="legend">{esc(SECTION_LEGEND)}</p>' if numbers else ""
    return [
        f'<section class="stability"><h3>{SECTION_TITLE}</h3><ul>',
        *[f"<li>{esc(i)}</li>" for i in items],
        f"</ul>{how}</section>",
    ]
