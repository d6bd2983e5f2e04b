"""Test-result tables with 95% confidence intervals, read from the store only.

Layout of the mean-field paper's Table 7: per dataset a block, one row per study (its loss, and
its strategy as "contrastive + metrix"), columns separated (mean of the four 128-D fold models)
and concatenated (512-D) × MAP@R, P@1, R-Precision, in percent, as "mean ± half-width of the 95%
Student-t interval over reproductions", with the number of reproductions ``n``.

Rows: the studies of the selected campaigns in campaign order (``mlrc_campaign_study.position``),
then the selected ``--study`` names (or, with no selection, every study) by name. Dataset blocks
follow the order in which their first row appears.

Protocols: a comparison is only fair within one protocol (:func:`protocol_of`: everything in the
study's resolved configuration that defines its numbers except the loss, miner, strategy, batch
sampler, their parameters and the budgets). A dataset whose studies ran under several protocols
gets one block per protocol (in the order of their first row), headed by the protocol's short
hash (:func:`protocol_key`) and the fields in which it differs from the dataset's other protocols
(``preset.max_epochs 1``); the legend names them (``preset.max_epochs 1 vs 2``). A dataset with a
single protocol looks as if there were no protocols. Studies of one protocol whose search budgets
differ (``trials``) share a block, with a note naming the budgets.

Baseline row: the first row(s) of a block are the untrained models of its studies
(``mlrc_baseline`` through ``mlrc_study_baseline``): "Pretrained (trunk)", the ImageNet trunk on
the test classes, or "Random init (trunk)" for presets that train their trunk from scratch. One
evaluation: ``n`` = 1, no interval, no marks, not part of any comparison. A study without a
baseline in the store (stores written before baselines were computed) adds none.

Marks, within one block (a block with a single study row has nothing to compare and gets none):

* **bold** — the best (highest) mean in its column; exact ties are all bold.
* underline — the block's best row: the highest concatenated (512-D) MAP@R, the reality check's
  headline number (separated MAP@R when no row has a concatenated result). Only the row label is
  underlined, so it does not collide with the bold cells.
* † — not significantly worse than the column's best row: Welch's two-sided t-test
  (``scipy.stats.ttest_ind(equal_var=False)``) of the row's per-reproduction values against those
  of the column's best row gives p ≥ 0.05. The best row itself is never marked; with fewer than
  two reproductions on either side p is NaN and there is no mark.

Trials scored 0: a search trial whose loss or embeddings went non-finite is complete with value 0
(as in the reference harness), its reason starting with ``store.NONFINITE``. The legend counts
them per study ("contrastive (cub200): 3 of 50 complete trials scored 0 — …"), the CSV in
``nonfinite_trials`` (of ``complete_trials``).

Formats: ``md`` (GitHub markdown; underline as ``<ins>``, which GitHub renders, it drops ``<u>``),
``csv`` (tidy: one line per row × mode × metric with protocol, protocol_fields, mean, half_width,
n, low, high, best, best_row, p_value, not_worse, complete_trials, nonfinite_trials; a baseline
line has ``loss`` = its kind, ``pretrained`` or ``random_init``, and ``study`` = its label),
``latex`` (booktabs, ``\\pm``, ``\\textbf``, ``\\underline``, ``$^{\\dagger}$``;
``standalone=True`` wraps it in a document that pdflatex compiles) and ``html`` (one
self-contained page, ``<strong>``, ``<u>``, ``<sup>†</sup>``, no external resources). Every format
but CSV ends with the legend of ± and the marks, and the notes above.
"""

from __future__ import annotations

import copy
import hashlib
import html
import json
import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats
from sqlalchemy import select
from sqlalchemy.engine import Engine

from mlrc.protocol import confidence_interval
from mlrc.store import (
    METRIC_COLUMNS,
    NONFINITE,
    Baseline,
    CampaignStudy,
    Study,
    StudyBaseline,
    TestResult,
    Trial,
    canonical_json,
    session,
)

FORMATS = ("md", "csv", "latex", "html")
MODES = ("separated", "concatenated")
MODE_LABELS = {"separated": "Separated (128-D)", "concatenated": "Concatenated (512-D)"}
METRIC_LABELS = {"map_at_r": "MAP@R", "precision_at_1": "P@1", "r_precision": "R-Prec"}
BASELINE_KINDS = ("pretrained", "random_init")
ALPHA = 0.05
DAGGER = "†"
# per study (one value for all its lines): carried from collect() through summarize()
META_COLUMNS = [
    "baseline",  # the line is an untrained baseline, not a study
    "protocol_fields",  # this protocol's differing fields ("" when the dataset has one protocol)
    "protocol_diff",  # the dataset's differing fields, "preset.max_epochs 1 vs 2"
    "trials_budget",  # the study's search budget (resolved ``trials``)
    "complete_trials",
    "nonfinite_trials",  # complete trials scored 0 for a non-finite loss or embeddings
]
VALUE_COLUMNS = [
    "study",
    "dataset",
    "protocol",
    "loss",
    "strategy",
    "pruner",
    "reproduction",
    "mode",
    "metric",
    "value",
    *META_COLUMNS,
]
TIDY_COLUMNS = [
    "study",
    "dataset",
    "protocol",
    "protocol_fields",
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
    "complete_trials",
    "nonfinite_trials",
]
LEGEND = [
    "Values in %: mean ± half-width of the 95% Student-t confidence interval over the n "
    "reproductions (separated: mean of the four 128-D fold models; concatenated: their 512-D "
    "concatenation).",
    "Bold: best mean in its column within its block. "
    "Underlined: the block's best row (highest concatenated MAP@R).",
    f"{DAGGER} not significantly worse than the column's best at p ≥ 0.05 (Welch's t-test over "
    "reproductions); the best row itself is not marked.",
]
DDAGGER = "‡"
PRUNED_NOTE = (
    f"{DDAGGER} searched with opt-in median pruning (search.pruner): trials below the median "
    "after a fold were stopped early; the protocol's search prunes nothing."
)
BASELINE_NOTES = {
    "pretrained": "Pretrained: the ImageNet-pretrained trunk, untrained, on the test classes",
    "random_init": "Random init: the randomly initialised trunk (the preset trains it from "
    "scratch), untrained, on the test classes",
}
BASELINE_NOTE_END = (
    "; one evaluation (n = 1, no interval), the same features in both modes, not part of the "
    "marks or tests."
)
PROTOCOL_NOTE = (
    "Protocol (short hash): everything in a study's resolved configuration that defines its "
    "numbers except the loss, miner, strategy, batch sampler, their parameters and the budgets. "
    "A dataset with several protocols gets one block per protocol; marks and Welch tests "
    "compare rows within a block only."
)
NONFINITE_NOTE = "scored 0 — non-finite loss or embeddings, as in the reference harness"
MAX_SHOWN_FIELDS = 4  # a protocol's header names at most this many differing fields


class ReportError(ValueError):
    """The selection cannot be reported (unknown campaign or study, unknown format)."""


# --- protocols ----------------------------------------------------------------------------------

_BUDGET = "a budget: a different one within a protocol gets a note, not a block of its own"
# Paths (dot-separated) of ``mlrc_study.config`` (``ResolvedStudy.fingerprint()``) left out of a
# study's protocol, with the reason. See :func:`protocol_of`.
PROTOCOL_EXCLUDED: dict[str, str] = {
    "study.name": "the study's name, a label",
    "study.loss": "the method the table compares, with its fixed parameters and search space",
    "study.miner": "a method compared like the loss",
    "study.strategy": "a method compared like the loss (metrix, …)",
    "study.sampler": "the batch sampler: a training trick, compared like the miner",
    "space": "the searched parameters of the loss, miner and strategy",
    "fixed": "the fixed parameters of the loss, miner and strategy",
    "preset.loss_optimizer.lr": "the range of the loss's learning rate, a searched parameter "
    "of the loss (loss_lr in space)",
    "study.search.enqueue": "the search's first points, in the searched parameters",
    "study.preset": "the preset's name or path: its resolved content is compared as preset",
    "study.overrides": "already merged into preset",
    "trials": _BUDGET,
    "reproductions": _BUDGET + " (the n column shows it)",
    "study.search.trials": _BUDGET,
    "study.test": _BUDGET + " (reproductions)",
    "preset.test": _BUDGET + " (reproductions)",
    "preset.search": "the preset's search defaults: trials is a budget; sampler, pruner and "
    "prune_startup are compared as resolved (sampler, pruner); seed and enqueue are unused "
    "(the study's search.seed is used)",
    "study.search.sampler": "compared as resolved (sampler)",
    "study.search.pruner": "compared as resolved (pruner)",
    "study.search.prune_startup": "compared as resolved (prune_startup)",
    "pruner": "opt-in median pruning saves compute, like a smaller budget: its rows are marked "
    f"{DDAGGER} with a note instead",
    "prune_startup": "part of the pruning, see pruner",
}


def protocol_of(config: dict | None) -> dict:
    """The protocol of a study: its resolved configuration (``mlrc_study.config``, the study's
    ``ResolvedStudy.fingerprint()``) without what a comparison table compares or counts.

    Left out (:data:`PROTOCOL_EXCLUDED`):

    * the study's name (``study.name``), a label;
    * the methods compared: ``study.loss``, ``study.miner``, ``study.strategy``, and
      ``study.sampler`` — the batch sampler is a training trick too, compared like the miner —
      with their parameters: ``space``, ``fixed``, ``study.search.enqueue`` (first points of the
      search) and ``preset.loss_optimizer.lr`` (the loss's learning-rate range, searched);
    * ``study.preset`` (the preset's name or path) and ``study.overrides``: the overrides are
      already merged into ``preset``, which is compared whole instead;
    * the budgets: ``trials``, ``reproductions``, ``study.search.trials``, ``study.test``,
      ``preset.test`` and ``preset.search`` (its ``trials``; its ``sampler``/``pruner`` are
      compared as resolved, its ``seed``/``enqueue`` are unused), and the inputs of the resolved
      ``sampler``/``pruner`` in ``study.search``. A different budget within a protocol gets a
      note, not a block of its own;
    * ``pruner``/``prune_startup``: opt-in median pruning saves compute like a smaller budget;
      pruned rows keep their ‡ mark and note.

    What is left: the dataset (name, root, params), the resolved preset (trunk, weights, image
    sizes, batch, optimiser, epochs, patience, folds, split, precision, …), the search seed and
    the BO sampler (``sampler``), and any field a later mlrc adds. A non-dict config (stores
    that hold none) has the empty protocol."""
    out = copy.deepcopy(config) if isinstance(config, dict) else {}
    for path in PROTOCOL_EXCLUDED:
        *parents, last = path.split(".")
        node: Any = out
        for p in parents:
            node = node.get(p) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    return out


def protocol_key(config: dict | None) -> str:
    """Short hash (8 hex digits) of :func:`protocol_of` ``(config)``: equal for two studies
    exactly when their protocols are equal."""
    return hashlib.sha256(canonical_json(protocol_of(config)).encode()).hexdigest()[:8]


_UNSET = object()


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(node, dict) or not node:
        return {prefix.rstrip("."): node} if prefix else {}
    out: dict[str, Any] = {}
    for k, v in node.items():
        out.update(_flatten(v, f"{prefix}{k}."))
    return out


def protocol_differences(protocols: list[dict]) -> list[tuple[str, list[Any]]]:
    """The dot-separated fields whose values are not the same in all ``protocols``, each with
    its value per protocol (``"unset"`` where a protocol lacks it), in first-seen order."""
    flat = [_flatten(p) for p in protocols]
    paths = list(dict.fromkeys(p for f in flat for p in f))
    out = []
    for path in paths:
        values = [f.get(path, _UNSET) for f in flat]
        if len({"\0unset" if v is _UNSET else canonical_json(v) for v in values}) > 1:
            out.append((path, ["unset" if v is _UNSET else v for v in values]))
    return out


def _show(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _fields_text(diffs: list[tuple[str, list[Any]]], i: int) -> str:
    """Protocol ``i``'s values of the differing fields: ``preset.max_epochs 1, …``."""
    shown = [f"{path} {_show(values[i])}" for path, values in diffs[:MAX_SHOWN_FIELDS]]
    more = len(diffs) - MAX_SHOWN_FIELDS
    return ", ".join(shown) + (f", … ({more} more fields)" if more > 0 else "")


def _diff_text(diffs: list[tuple[str, list[Any]]]) -> str:
    """``preset.max_epochs 1 vs 2, …`` (values in the order of the dataset's protocols)."""
    shown = [
        f"{path} {' vs '.join(_show(v) for v in values)}"
        for path, values in diffs[:MAX_SHOWN_FIELDS]
    ]
    more = len(diffs) - MAX_SHOWN_FIELDS
    return ", ".join(shown) + (f", … ({more} more fields)" if more > 0 else "")


def _legend(summary: pd.DataFrame) -> list[str]:
    """The legend, with the notes: baselines, pruning, protocols, budgets, trials scored 0."""
    return LEGEND + _notes(summary, _blocks(summary))


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


def is_nonfinite(state: str | None, reason: str | None) -> bool:
    """A complete trial scored 0 because its loss or embeddings went non-finite."""
    return state == "complete" and bool(reason) and NONFINITE in reason


def _trials_budget(config: Any) -> int | None:
    """The study's resolved search budget (``trials``; older configs: the study's or preset's)."""
    if not isinstance(config, dict):
        return None
    if isinstance(config.get("trials"), int):
        return config["trials"]
    for part in ("study", "preset"):
        try:
            value = config[part]["search"]["trials"]
        except (KeyError, TypeError):
            continue
        if isinstance(value, int):
            return value
    return None


@dataclass
class _Group:
    """The studies of one dataset under one protocol."""

    key: str
    protocol: dict
    studies: list[Study] = field(default_factory=list)
    fields: str = ""


def collect(
    engine: Engine, studies: list[str] | None = None, campaigns: list[str] | None = None
) -> pd.DataFrame:
    """One row per (study, reproduction, mode, metric) with the value in percent, in table
    order (see :func:`select_studies`), with the study's protocol (:func:`protocol_key`) and
    per-study columns (:data:`META_COLUMNS`). Each (dataset, protocol) block starts with the
    baselines of its studies (``baseline`` True, ``study`` = the baseline's label, ``loss`` =
    its kind, reproduction 0). Studies without test results are left out."""
    names = select_studies(engine, studies, campaigns)
    rank = {n: i for i, n in enumerate(names)}
    with session(engine) as s:
        q = (
            select(Study, TestResult)
            .join(TestResult, TestResult.study_id == Study.id)
            .where(TestResult.fold == -1, Study.name.in_(names))
        )
        results = s.execute(q).all()
        found = {st.id: st for st, _ in results}
        complete: dict[int, int] = dict.fromkeys(found, 0)
        nonfinite: dict[int, int] = dict.fromkeys(found, 0)
        for study_id, reason in s.execute(
            select(Trial.study_id, Trial.reason).where(
                Trial.study_id.in_(list(found)), Trial.state == "complete"
            )
        ).all():
            complete[study_id] += 1
            nonfinite[study_id] += is_nonfinite("complete", reason)
        links = dict(
            s.execute(
                select(StudyBaseline.study_id, StudyBaseline.key).where(
                    StudyBaseline.study_id.in_(list(found))
                )
            ).all()
        )
        baselines: dict[str, list[Baseline]] = {}
        for b in s.execute(
            select(Baseline).where(Baseline.key.in_(sorted(set(links.values()))))
        ).scalars():
            baselines.setdefault(b.key, []).append(b)

    # datasets, and their protocols, in the order of their first study
    keys = {st.id: protocol_key(st.config) for st in found.values()}
    by_dataset: dict[str, dict[str, _Group]] = {}
    for st in sorted(found.values(), key=lambda st: rank[st.name]):
        groups = by_dataset.setdefault(st.dataset, {})
        key = keys[st.id]
        groups.setdefault(key, _Group(key, protocol_of(st.config))).studies.append(st)
    meta: dict[int, dict[str, Any]] = {}
    order: dict[tuple[str, str], tuple[int, int]] = {}
    blocks: list[tuple[str, _Group, str]] = []
    for d_rank, (dataset, groups) in enumerate(by_dataset.items()):
        diffs = protocol_differences([g.protocol for g in groups.values()])
        diff = _diff_text(diffs) if len(groups) > 1 else ""
        for g_rank, g in enumerate(groups.values()):
            g.fields = _fields_text(diffs, g_rank) if len(groups) > 1 else ""
            order[(dataset, g.key)] = (d_rank, g_rank)
            blocks.append((dataset, g, diff))
            for st in g.studies:
                meta[st.id] = {
                    "baseline": False,
                    "protocol_fields": g.fields,
                    "protocol_diff": diff,
                    "trials_budget": _trials_budget(st.config),
                    "complete_trials": complete[st.id],
                    "nonfinite_trials": nonfinite[st.id],
                }

    rows = []
    for st, tr in results:
        d_rank, g_rank = order[(st.dataset, keys[st.id])]
        for m in METRIC_COLUMNS:
            rows.append(
                {
                    "study": st.name,
                    "dataset": st.dataset,
                    "protocol": keys[st.id],
                    "loss": st.loss,
                    "strategy": st.strategy,
                    "pruner": (st.config or {}).get("pruner") or "none",
                    "reproduction": tr.reproduction,
                    "mode": tr.mode,
                    "metric": m,
                    "value": 100.0 * getattr(tr, m),
                    **meta[st.id],
                    "_order": (d_rank, g_rank, 1, rank[st.name]),
                }
            )
    for dataset, g, diff in blocks:
        d_rank, g_rank = order[(dataset, g.key)]
        used = list(dict.fromkeys(links[st.id] for st in g.studies if st.id in links))
        labels = [baselines[k][0].label if baselines.get(k) else "" for k in used]
        for i, key in enumerate(used):
            label = labels[i] if labels.count(labels[i]) == 1 else f"{labels[i]} [{key[:8]}]"
            for b in baselines.get(key, []):
                for m in METRIC_COLUMNS:
                    rows.append(
                        {
                            "study": label,
                            "dataset": dataset,
                            "protocol": g.key,
                            "loss": b.kind,
                            "strategy": None,
                            "pruner": None,
                            "reproduction": 0,
                            "mode": b.mode,
                            "metric": m,
                            "value": 100.0 * getattr(b, m),
                            "baseline": True,
                            "protocol_fields": g.fields,
                            "protocol_diff": diff,
                            "trials_budget": None,
                            "complete_trials": None,
                            "nonfinite_trials": None,
                            "_order": (d_rank, g_rank, 0, i),
                        }
                    )
    if not rows:
        return pd.DataFrame(columns=VALUE_COLUMNS)
    mode_rank = {m: i for i, m in enumerate(MODES)}
    metric_rank = {m: i for i, m in enumerate(METRIC_COLUMNS)}
    rows.sort(
        key=lambda r: (
            *r["_order"],
            mode_rank.get(r["mode"], len(MODES)),
            metric_rank[r["metric"]],
            r["reproduction"],
        )
    )
    for r in rows:
        del r["_order"]
    values = pd.DataFrame(rows, columns=VALUE_COLUMNS)
    for c in ("trials_budget", "complete_trials", "nonfinite_trials"):
        values[c] = values[c].astype("Int64")
    values["baseline"] = values["baseline"].astype(bool)
    return values


def welch_p(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided p-value of Welch's t-test; NaN when either side has fewer than 2 values."""
    if len(a) < 2 or len(b) < 2:
        return math.nan
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(stats.ttest_ind(a, b, equal_var=False).pvalue)


def with_defaults(values: pd.DataFrame) -> pd.DataFrame:
    """``values`` with the columns :func:`collect` adds (a frame built by hand may lack them)."""
    values = values.copy()
    defaults = {
        "protocol": "",
        "baseline": False,
        "protocol_fields": "",
        "protocol_diff": "",
        "trials_budget": pd.NA,
        "complete_trials": pd.NA,
        "nonfinite_trials": pd.NA,
    }
    for c, v in defaults.items():
        if c not in values.columns:
            values[c] = v
    values["baseline"] = values["baseline"].astype(bool)
    return values


def summarize(values: pd.DataFrame, level: float = 0.95, alpha: float = ALPHA) -> pd.DataFrame:
    """Tidy summary, one line per (study or baseline, mode, metric), in percent, in the order of
    ``values``: mean, CI half-width, n, low, high; ``best`` (highest mean of its dataset ×
    protocol × mode × metric), ``best_row`` (the study with its block's highest concatenated
    MAP@R), ``p_value`` (Welch's t-test against the column's best study in the block; NaN for
    that study itself and when n < 2 on either side) and ``not_worse`` (True for the best study
    and when p ≥ ``alpha``, False when p < ``alpha``, missing when p is NaN). Baseline lines
    (``baseline`` True) take no part: never best, no p-value. The :data:`META_COLUMNS` follow."""
    values = with_defaults(values)
    out, samples = [], []
    keys = ["study", "dataset", "protocol", "loss", "strategy", "pruner", "mode", "metric"]
    for key, g in values.groupby(keys, sort=False, dropna=False):
        v = g.sort_values("reproduction")["value"].to_numpy(dtype=np.float64)
        mean, hw = confidence_interval(v, level) if len(v) >= 2 else (float(v.mean()), math.nan)
        samples.append(v)
        first = g.iloc[0]
        out.append(
            {
                **dict(zip(keys, key, strict=True)),
                "mean": mean,
                "half_width": hw,
                "n": len(v),
                "low": mean - hw,
                "high": mean + hw,
                **{c: first[c] for c in META_COLUMNS},
            }
        )
    columns = [c for c in TIDY_COLUMNS if c in keys or c in ("mean", "half_width", "n")]
    columns += ["low", "high"] + [c for c in META_COLUMNS if c not in columns]
    summary = pd.DataFrame(out, columns=columns)
    summary["baseline"] = summary["baseline"].astype(bool)
    for c in ("trials_budget", "complete_trials", "nonfinite_trials"):
        summary[c] = summary[c].astype("Int64")
    summary["best"] = False
    summary["best_row"] = False
    summary["p_value"] = math.nan
    summary["not_worse"] = pd.Series([pd.NA] * len(summary), dtype="boolean")
    compared = summary[~summary["baseline"]]
    for _, col in compared.groupby(["dataset", "protocol", "mode", "metric"], sort=False):
        top = col["mean"].max()
        summary.loc[col.index[col["mean"] == top], "best"] = True
        ref = col.index[col["mean"] == top][0]  # first in table order among exact ties
        summary.loc[ref, "not_worse"] = True
        for i in col.index.drop(ref):
            p = welch_p(samples[i], samples[ref])
            summary.loc[i, "p_value"] = p
            if not math.isnan(p):
                summary.loc[i, "not_worse"] = p >= alpha
    for _, d in compared.groupby(["dataset", "protocol"], sort=False):
        best = _best_rows(d)
        summary.loc[d.index[d["study"].isin(best)], "best_row"] = True
    return summary


def _best_rows(d: pd.DataFrame) -> list[str]:
    """Studies of one block with the highest concatenated MAP@R (else separated MAP@R)."""
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
    def __init__(
        self,
        label: str,
        n: str,
        underline: bool,
        cells: list[_Cell | None],
        baseline: bool = False,
        study: str = "",
    ) -> None:
        self.label, self.n, self.underline, self.cells = label, n, underline, cells
        self.baseline, self.study = baseline, study


@dataclass
class _Block:
    """One table block: a dataset, or one protocol of a dataset with several."""

    dataset: str
    protocol: str
    fields: str  # this protocol's differing fields; "" when the dataset has a single protocol
    diff: str  # the dataset's differing fields ("preset.max_epochs 1 vs 2"), or ""
    rows: list[_Row]
    budgets: str  # "trials 4 (contrastive) vs 8 (triplet)" when the search budgets differ
    nonfinite: list[tuple[str, int, int]]  # (row label, scored 0, complete trials)

    @property
    def name(self) -> str:
        """The block in a note: ``cub``, or ``cub, protocol 3f2a9c1d``."""
        return f"{self.dataset}, protocol {self.protocol}" if self.diff else self.dataset


def _blocks(summary: pd.DataFrame) -> list[_Block]:
    """Per (dataset, protocol) block, in summary order: its rows with marks resolved, baselines
    first."""
    summary = with_defaults(summary)
    columns = [(mode, m) for mode in MODES for m in METRIC_COLUMNS]
    blocks = []
    for (dataset, protocol), d in summary.groupby(["dataset", "protocol"], sort=False):
        studies = d[~d["baseline"]]
        # a column's marks need at least two rows with a value in it
        compared = {
            c: ((studies["mode"] == c[0]) & (studies["metric"] == c[1])).sum() >= 2 for c in columns
        }
        n_rows = studies["study"].nunique()
        labels = {
            st: row_label(g["loss"].iloc[0], g["strategy"].iloc[0])
            for st, g in studies.groupby("study", sort=False)
        }
        rows, nonfinite, budgets = [], [], {}
        for study, g in d.groupby("study", sort=False):
            by = {(r["mode"], r["metric"]): r for _, r in g.iterrows()}
            if bool(g["baseline"].iloc[0]):
                cells = [_Cell(by[c], False) if c in by else None for c in columns]
                rows.append(_Row(study, "1", False, cells, baseline=True, study=study))
                continue
            label = labels[study]
            if list(labels.values()).count(label) > 1:
                label = f"{label} ({study})"
            first = g.iloc[0]
            if not pd.isna(first["nonfinite_trials"]) and first["nonfinite_trials"] > 0:
                nonfinite.append(
                    (label, int(first["nonfinite_trials"]), int(first["complete_trials"]))
                )
            if not pd.isna(first["trials_budget"]):
                budgets.setdefault(int(first["trials_budget"]), []).append(label)
            if first["pruner"] != "none":
                label = f"{label} {DDAGGER}"
            lo, hi = int(g["n"].min()), int(g["n"].max())
            rows.append(
                _Row(
                    label,
                    str(hi) if lo == hi else f"{lo}–{hi}",
                    n_rows >= 2 and bool(g["best_row"].any()),
                    [_Cell(by[c], compared[c]) if c in by else None for c in columns],
                    study=study,
                )
            )
        budget_text = ""
        if len(budgets) > 1:
            budget_text = "trials " + " vs ".join(
                f"{b} ({', '.join(labs)})" for b, labs in budgets.items()
            )
        first = d.iloc[0]
        blocks.append(
            _Block(
                dataset,
                protocol,
                first["protocol_fields"] if first["protocol_diff"] else "",
                first["protocol_diff"],
                rows,
                budget_text,
                nonfinite,
            )
        )
    return blocks


def _notes(summary: pd.DataFrame, blocks: list[_Block]) -> list[str]:
    """The legend's notes after the marks: baselines, pruning, protocols, budgets, zeros."""
    summary = with_defaults(summary)
    notes = []
    kinds = [k for k in BASELINE_KINDS if ((summary["loss"] == k) & summary["baseline"]).any()]
    if kinds:
        notes.append("; ".join(BASELINE_NOTES[k] for k in kinds) + BASELINE_NOTE_END)
    if ((summary["pruner"] != "none") & ~summary["baseline"]).any():
        notes.append(PRUNED_NOTE)
    split = {}  # dataset -> its blocks, when it has several protocols
    for b in blocks:
        if b.diff:
            split.setdefault(b.dataset, []).append(b)
    if split:
        notes.append(PROTOCOL_NOTE)
    for dataset, bs in split.items():
        notes.append(
            f"{dataset}: {len(bs)} protocols, differing in {bs[0].diff} — "
            + "; ".join(f"{b.protocol}: {b.fields}" for b in bs)
            + "."
        )
    for b in blocks:
        if b.budgets:
            notes.append(f"{b.name}: the search budgets differ — {b.budgets}.")
    for b in blocks:
        for label, zeros, done in b.nonfinite:
            notes.append(f"{label} ({b.name}): {zeros} of {done} complete trials {NONFINITE_NOTE}.")
    return notes


def render(summary: pd.DataFrame, fmt: str, *, standalone: bool = False) -> str:
    """``md`` | ``csv`` | ``latex`` | ``html``. Values in percent; ± is the 95% CI half-width.
    ``standalone``: LaTeX as a complete document (HTML is always a complete page)."""
    if fmt not in FORMATS:
        raise ReportError(f"unknown format {fmt!r} ({', '.join(FORMATS)})")
    if fmt == "csv":
        table = summary.copy()
        for c in TIDY_COLUMNS:
            if c not in table.columns:
                table[c] = pd.NA
        return table.to_csv(index=False, columns=TIDY_COLUMNS, float_format="%.10g")
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
    blocks = _blocks(summary)
    for b in blocks:
        title = b.dataset + (f" — protocol {b.protocol}: {b.fields}" if b.diff else "")
        parts.append(f"### {title} (%, mean ± 95% CI half-width over n reproductions)\n")
        parts.append("| " + " | ".join(header) + " |")
        parts.append("|" + "|".join(["---"] + ["--:"] * (len(header) - 1)) + "|")
        for r in b.rows:
            label = r.label.replace("|", r"\|")
            label = f"<ins>{label}</ins>" if r.underline else label
            parts.append("| " + " | ".join([label, r.n] + [cell(c) for c in r.cells]) + " |")
        parts.append("")
    legend = LEGEND + _notes(summary, blocks)
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
    blocks = _blocks(summary)
    for b in blocks:
        title = rf"\textit{{{latex_escape(b.dataset)}}}"
        if b.diff:  # the fields are in the legend: a long list would widen the table
            title += rf" --- protocol {latex_escape(b.protocol)}"
        lines += [r"\midrule", rf"\multicolumn{{8}}{{l}}{{{title}}} \\"]
        for r in b.rows:
            label = _latex_text(r.label)
            label = rf"\underline{{{label}}}" if r.underline else label
            n = r.n.replace("–", "--")
            lines.append(" & ".join([label, n] + [cell(c) for c in r.cells]) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    legend = [
        _latex_text(line)
        .replace("Student-t", r"Student-$t$")
        .replace("t-test", r"$t$-test")
        .replace("Bold", r"\textbf{Bold}")
        .replace("Underlined", r"\underline{Underlined}")
        for line in LEGEND + _notes(summary, blocks)
    ]
    # the legend: a paragraph after the tabular, wrapped at the line width
    lines += [
        r"\par\smallskip",
        "{\\footnotesize\\noindent " + " \\\\\n".join(legend) + r"\par}",
        "",
    ]
    tabular = "\n".join(lines)
    return _latex_document(tabular) if standalone else tabular


def _latex_text(s: str) -> str:
    """Escaped text with the report's symbols in LaTeX (pdflatex's utf8 lacks some of them)."""
    return (
        latex_escape(s)
        .replace("±", r"$\pm$")
        .replace("≥", r"$\geq$")
        .replace(DAGGER, r"$^{\dagger}$")
        .replace(DDAGGER, r"$^{\ddagger}$")
        .replace("…", r"\ldots{}")
        .replace("—", "---")
        .replace("–", "--")
    )


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
    "tr.baseline td{color:#555;font-style:italic}"
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
    blocks = _blocks(summary)
    for b in blocks:
        title = b.dataset + (f" — protocol {b.protocol}: {b.fields}" if b.diff else "")
        parts.append(f"<h3>{esc(title)}</h3>")
        parts.append(f'<table data-dataset="{esc(b.dataset)}" data-protocol="{esc(b.protocol)}">')
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
        for r in b.rows:
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
            attrs = ' class="baseline"' if r.baseline else ""
            parts.append(f'<tr{attrs} data-row="{esc(r.study)}">' + "".join(tds) + "</tr>")
        parts.append("</tbody>")
        parts.append("</table>")
    parts.append('<div class="legend">')
    parts += [f"<p>{esc(line)}</p>" for line in LEGEND + _notes(summary, blocks)]
    parts += ["</div>", "</body>", "</html>", ""]
    return "\n".join(parts)
