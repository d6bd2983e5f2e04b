"""The values of the test-result tables: which studies a selection names (:func:`select_studies`)
and one row per (study, reproduction, mode, metric) in table order (:func:`collect`). Each study
comes with its protocol block, and each block's untrained baselines come first. A traditional study
(:func:`is_traditional`: its epoch chosen on the test classes) has the lines of
:func:`traditional_metrics` instead. Reads the store through :mod:`mlrc.store.reads`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd

from mlrc.config.presets import is_traditional
from mlrc.report.groups import Group, scope_groups
from mlrc.report.legend import pruning_label, risk_text
from mlrc.report.rescored import add_rescored
from mlrc.store import METRIC_COLUMNS, NONFINITE, reads
from mlrc.store import embeddings as stored_embeddings
from mlrc.store.provenance import compute_of

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from mlrc.store import BaselineRecord, StudyRecord, TestResultRecord

__all__ = [
    "META_COLUMNS",
    "MODES",
    "SIZES",
    "TRADITIONAL_MODE",
    "UNMARKED_METRICS",
    "VALUE_COLUMNS",
    "ReportError",
    "budget_history",
    "collect",
    "is_nonfinite",
    "is_traditional",
    "model_sizes",
    "select_studies",
    "traditional_metrics",
    "trials_budget",
    "warm_start",
]

MODES = ("separated", "concatenated")
# per study (one value for all its lines): carried from collect() through summarize()
META_COLUMNS = [
    "baseline",  # the line is an untrained baseline, not a study
    "protocol_fields",  # this protocol's differing fields ("" when the dataset has one protocol)
    "protocol_diff",  # the dataset's differing fields, "preset.max_epochs 1 vs 2"
    "trials_budget",  # the study's search budget (resolved ``trials``)
    "complete_trials",
    "nonfinite_trials",  # complete trials scored 0 for a non-finite loss or embeddings
    "budget_history",  # "search.trials 50 → 70 (2026-11-24)"; … when its budgets changed, or ""
    "fold_threads",  # "1, 2" when its folds ran with several torch thread counts, or ""
    "fold_compute",  # what computed its folds: "NVIDIA H100 … (CUDA 13.0, …, TF32 off, …)", or ""
    "mixed_compute",  # what differs between its folds' devices: "GPU models, TF32 settings", or ""
    "test_set_selection",  # traditional protocol: the epoch chosen on the test classes (leakage)
    "retrieval",  # how the test stage ranked: "query→gallery" (the dataset's roles) or "all vs all"
    "archived",  # archived by ``study run --force-new`` (NAME.old-K): shown, never compared
    "untrained_test",  # every complete test fold kept epoch 0, the untrained model
    "failed_trials",  # trials failed with a reason (an error stopped them; not the scored zeros)
    "failures",  # "trial 0 failed: reason; reproduction 2, fold 0 failed: reason", or ""
    "pruning_risk",  # the pruning rules' risk measured by replay on the corpus, or ""
    "warm_start",  # "study X top 5 (trials 3, 7)": its search started from another's best, or ""
    "after_the_fact",  # the line's metric was computed after the fact from stored embeddings
    "rescore_note",  # why a study lacks the --metrics asked for (mlrc.report.rescored), or ""
    "fold_models",  # its folds: the fold models a separated row averages (None: a baseline)
    "embedding_size",  # one fold model's embedding size (concatenated: fold_models × it)
]
SIZES = ("fold_models", "embedding_size")  # META_COLUMNS read from each study's configuration
TRADITIONAL_MODE = "concatenated"  # a traditional study's one model (its aggregate row)
EPOCH = "best_epoch"  # the epoch chosen on the test classes, in epochs (not a percentage)
UNMARKED_METRICS = (EPOCH,)  # shown with its interval, never bold, †, underlined or tested
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


class ReportError(ValueError):
    """The selection cannot be reported (unknown campaign or study, unknown format)."""


# --- the selection ------------------------------------------------------------------------------


def select_studies(
    engine: Engine,
    studies: list[str] | None = None,
    campaigns: list[str] | None = None,
    archived: bool = False,
) -> list[str]:
    """Names of the selected studies in table order: each campaign's studies by position (the
    campaigns in the order given), then the ``studies`` not already in, by name. With neither,
    every study, by dataset then name. Unknown names raise :class:`ReportError`.

    An archived study (``NAME.old-K``, :func:`mlrc.store.reads.archived_of`) that the
    ``studies`` do not name is left out when the current study ``NAME`` has test results,
    unless ``archived``."""
    order = _selection(engine, studies, campaigns)
    if archived:
        return order
    named = set(studies or [])
    current = {n: reads.archived_of(n) for n in order if n not in named}
    current = {n: c for n, c in current.items() if c is not None}
    tested = reads.tested_study_names(engine, sorted(set(current.values()))) if current else set()
    return [n for n in order if current.get(n) not in tested]


def _selection(engine: Engine, studies: list[str] | None, campaigns: list[str] | None) -> list[str]:
    """:func:`select_studies` before archived studies are left out."""
    if not studies and not campaigns:
        return reads.study_names(engine)
    order: list[str] = []
    for campaign in dict.fromkeys(campaigns or []):
        members = reads.campaign_study_names(engine, campaign)
        if not members:
            known = reads.campaign_names(engine)
            hint = ", ".join(known[:10]) + (", …" if len(known) > 10 else "")
            raise ReportError(
                f"unknown campaign {campaign!r} (known: {hint or 'none in this store'})"
            )
        order += [m for m in members if m not in order]
    if studies:
        wanted = sorted(set(studies))
        found = reads.existing_study_names(engine, wanted)
        missing = [n for n in wanted if n not in found]
        if missing:
            raise ReportError(f"unknown study {', '.join(map(repr, missing))}")
        order += [n for n in wanted if n not in order]
    return order


# --- per study ----------------------------------------------------------------------------------


def is_nonfinite(state: str | None, reason: str | None) -> bool:
    """A complete trial scored 0 because its loss or embeddings went non-finite."""
    return state == "complete" and bool(reason) and NONFINITE in reason


def trials_budget(config: Any) -> int | None:
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


def model_sizes(config: Any) -> dict[str, int | None]:
    """A study's ``fold_models`` (its resolved ``folds``) and ``embedding_size`` (one fold
    model's output dimension) from its stored configuration; None where it does not say."""
    preset = (config or {}).get("preset") if isinstance(config, dict) else None
    preset = preset if isinstance(preset, dict) else {}
    sizes = {"fold_models": preset.get("folds"), "embedding_size": preset.get("embedding_size")}
    return {k: v if isinstance(v, int) else None for k, v in sizes.items()}


def _trial_counts(
    reasons: list[tuple[int, str | None]], study_ids: list[int]
) -> tuple[dict[int, int], dict[int, int]]:
    """Per study: its complete trials, and those of them scored 0 for a non-finite value."""
    complete: dict[int, int] = dict.fromkeys(study_ids, 0)
    nonfinite: dict[int, int] = dict.fromkeys(study_ids, 0)
    for study_id, reason in reasons:
        complete[study_id] += 1
        nonfinite[study_id] += is_nonfinite("complete", reason)
    return complete, nonfinite


def traditional_metrics(dataset: str) -> list[str]:
    """A traditional study's lines, in table order: ``recall_at_{k}`` for the papers' K of
    ``dataset`` (:func:`mlrc.protocol.analysis.recall_ks`), ``map_at_r`` (both in %) and
    ``best_epoch`` (in epochs)."""
    from mlrc.protocol.analysis import recall_ks  # lazily: it loads faiss

    return [f"recall_at_{k}" for k in recall_ks(dataset)] + ["map_at_r", EPOCH]


def _row_values(
    row: TestResultRecord | BaselineRecord, traditional: bool, dataset: str
) -> list[tuple[str, float | None]]:
    """(metric, value) of one stored test or baseline row, in table order: the metric columns in
    % (both modes) in a reality-check block; in a traditional block :func:`traditional_metrics`
    from the concatenated row (the one model), Recall@K and MAP@R in %, the epoch as is (None:
    not stored — a baseline trained no epoch)."""
    if not traditional:
        return [(m, 100.0 * getattr(row, m)) for m in METRIC_COLUMNS]
    if row.mode != TRADITIONAL_MODE:
        return []
    stored = {**(row.extra or {}), "map_at_r": row.map_at_r}
    return [
        (m, None if stored.get(m) is None else float(stored[m]) * (1.0 if m == EPOCH else 100.0))
        for m in traditional_metrics(dataset)
    ]


# --- protocol blocks ----------------------------------------------------------------------------


def _study_rows(
    results: list[tuple[StudyRecord, TestResultRecord]],
    group_of: dict[int, Group],
    rank: dict[str, int],
    meta: dict[int, dict[str, Any]],
) -> list[dict[str, Any]]:
    """One row per (final test result, metric), with its study's meta columns."""
    rows = []
    for st, tr in results:
        g = group_of[st.id]
        for i, (m, value) in enumerate(_row_values(tr, is_traditional(st.config), st.dataset)):
            if value is None:
                continue
            rows.append(
                {
                    "study": st.name,
                    "dataset": st.dataset,
                    "protocol": g.key,
                    "loss": st.loss,
                    "strategy": st.strategy,
                    "pruner": pruning_label(st.config, st.settings),
                    "reproduction": tr.reproduction,
                    "mode": tr.mode,
                    "metric": m,
                    "value": value,
                    **meta[st.id],
                    "_order": (*g.rank, 1, rank[st.name]),
                    "_metric": i,
                }
            )
    return rows


def _baseline_rows(
    g: Group, links: dict[int, str], baselines: dict[str, list[BaselineRecord]]
) -> list[dict[str, Any]]:
    """One row per (baseline, mode, metric) for the baselines of the group's studies, labelled
    by the baseline's label (with its key's start where two baselines share one)."""
    used = list(dict.fromkeys(links[st.id] for st in g.studies if st.id in links))
    labels = [baselines[k][0].label if baselines.get(k) else "" for k in used]
    rows = []
    for i, key in enumerate(used):
        label = labels[i] if labels.count(labels[i]) == 1 else f"{labels[i]} [{key[:8]}]"
        for b in baselines.get(key, []):
            for j, (m, value) in enumerate(_row_values(b, g.traditional, g.dataset)):
                if value is None:
                    continue
                rows.append(
                    {
                        "study": label,
                        "dataset": g.dataset,
                        "protocol": g.key,
                        "loss": b.kind,
                        "strategy": None,
                        "pruner": None,
                        "reproduction": 0,
                        "mode": b.mode,
                        "metric": m,
                        "value": value,
                        "baseline": True,
                        "protocol_fields": g.fields,
                        "protocol_diff": g.diff,
                        "trials_budget": None,
                        "complete_trials": None,
                        "nonfinite_trials": None,
                        "budget_history": "",
                        "fold_threads": "",
                        "fold_compute": "",
                        "mixed_compute": "",
                        "test_set_selection": False,  # untrained: no epoch chosen
                        "retrieval": g.retrieval,  # ranked as its block's studies
                        "archived": False,
                        "untrained_test": False,
                        "failed_trials": None,
                        "failures": "",
                        "pruning_risk": "",
                        "warm_start": "",
                        "fold_models": None,
                        "embedding_size": None,
                        "_order": (*g.rank, 0, i),
                        "_metric": j,
                    }
                )
    return rows


def _values_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The rows in table order (block, baselines first, study, mode, metric, reproduction)."""
    if not rows:
        return pd.DataFrame(columns=VALUE_COLUMNS)
    mode_rank = {m: i for i, m in enumerate(MODES)}
    rows.sort(
        key=lambda r: (
            *r["_order"],
            mode_rank.get(r["mode"], len(MODES)),
            r["_metric"],  # the metric's place among its row's metrics
            r["reproduction"],
        )
    )
    for r in rows:
        del r["_order"], r["_metric"]
    values = pd.DataFrame(rows, columns=VALUE_COLUMNS)
    values["after_the_fact"] = values["after_the_fact"].eq(True)  # set by add_rescored only
    values["rescore_note"] = values["rescore_note"].where(values["rescore_note"].notna(), "")
    for c in ("trials_budget", "complete_trials", "nonfinite_trials", "failed_trials", *SIZES):
        values[c] = values[c].astype("Int64")
    for c in ("baseline", "test_set_selection", "archived", "untrained_test"):
        values[c] = values[c].astype(bool)
    return values


def budget_history(changes: list[Any]) -> str:
    """The changes of budget among a study's history rows, as one phrase ("" when none)."""
    return "; ".join(
        f"{h.field} {h.old} → {h.new} ({h.time:%Y-%m-%d})"
        for h in changes
        if h.field in ("search.trials", "test.reproductions")
    )


def warm_start(config: Any, changes: list[Any]) -> str:
    """A study's warm start as its history recorded it ("study X top 5 (trials 3, 7)"), else
    as its configuration gives it (``study.search.warm_start``); "" for none."""
    recorded = [h.new for h in changes if h.field == "search.warm_start" and h.new]
    if recorded:
        return recorded[-1]
    try:
        spec = config["study"]["search"]["warm_start"]
    except (KeyError, TypeError):
        return ""
    if not isinstance(spec, dict):
        return ""
    source = f"study {spec['study']}" if spec.get("study") else f"file {spec.get('file')}"
    return f"{source} top {spec.get('top')}"


def failure_columns(lines: list[str]) -> dict[str, Any]:
    """``failed_trials`` and ``failures`` of a study from its failure lines (``trial N failed:
    reason``, ``reproduction R, fold F failed: reason``)."""
    return {
        "failed_trials": sum(line.startswith("trial ") for line in lines),
        "failures": "; ".join(lines),
    }


def fold_threads(counts: list[int]) -> str:
    """``"1, 2"`` when a study's folds ran with several torch thread counts, else "" (one
    count: its folds are comparable bit for bit)."""
    return ", ".join(map(str, counts)) if len(counts) > 1 else ""


def _with_batch(text: str, config: dict | None, provenances: list[dict | None]) -> str:
    """``text`` (what computed the folds) naming the study's global batch when a fold of it was
    trained as several processes (each of which saw only its share)."""
    if not text or not any(
        isinstance(p, dict) and (p.get("processes") or 1) > 1 for p in provenances
    ):
        return text
    size = ((config or {}).get("preset") or {}).get("batch", {}).get("size")
    return f"{text}; global batch {size}" if size else text


def _untrained(epochs: tuple[int, int] | None) -> bool:
    """Every complete test fold (at least one) kept epoch 0: the untrained model."""
    return epochs is not None and epochs[0] > 0 and epochs[1] == epochs[0]


def _study_meta(
    groups: list[Group],
    counts: tuple[dict[int, int], dict[int, int]],
    history: dict[int, list[Any]],
    threads: dict[int, list[int]],
    test_epochs: dict[int, tuple[int, int]],
    provenance: dict[int, list[dict | None]] | None = None,
) -> dict[int, dict[str, Any]]:
    """Per study id, its :data:`META_COLUMNS`."""
    complete, nonfinite = counts
    compute = {k: compute_of(v) for k, v in (provenance or {}).items()}
    return {
        st.id: {
            "baseline": False,
            "protocol_fields": g.fields,
            "protocol_diff": g.diff,
            "trials_budget": trials_budget(st.config),
            "complete_trials": complete[st.id],
            "nonfinite_trials": nonfinite[st.id],
            "budget_history": budget_history(history.get(st.id, [])),
            "fold_threads": fold_threads(threads.get(st.id, [])),
            "fold_compute": _with_batch(
                compute[st.id].text() if st.id in compute else "",
                st.config,
                (provenance or {}).get(st.id, []),
            ),
            "mixed_compute": ", ".join(compute[st.id].mixed) if st.id in compute else "",
            "test_set_selection": g.traditional,
            "retrieval": g.retrieval,
            "archived": reads.archived_of(st.name) is not None,
            "untrained_test": _untrained(test_epochs.get(st.id)),
            "pruning_risk": risk_text((st.settings or {}).get("pruning_risk")),
            "warm_start": warm_start(st.config, history.get(st.id, [])),
            **model_sizes(st.config),
        }
        for g in groups
        for st in g.studies
    }


def collect(
    engine: Engine,
    studies: list[str] | None = None,
    campaigns: list[str] | None = None,
    *,
    archived: bool = False,
    metrics: dict[str, str] | None = None,
    unreadable: dict[str, str] | None = None,
) -> pd.DataFrame:
    """One row per (study, reproduction, mode, metric) with the value in percent, in table
    order (see :func:`select_studies`), with the study's protocol (:func:`comparison_key`) and
    per-study columns (:data:`META_COLUMNS`). Each (dataset, protocol) block starts with the
    baselines of its studies (``baseline`` True, ``study`` = the baseline's label, ``loss`` =
    its kind, reproduction 0). Studies without test results are left out. A traditional study
    (``test_set_selection`` True) has one mode, ``concatenated``, with the lines of
    :func:`traditional_metrics` (``best_epoch`` in epochs, the others in %). ``archived``:
    keep the archived studies :func:`select_studies` leaves out by default. ``metrics``: also
    these, as ``mlrc study rescore`` stored them (:func:`mlrc.report.rescored.add_rescored`);
    ``unreadable``: by study name, why its stored embeddings could not be re-scored (the
    caller's attempt), said in its note instead of a command that would fail the same way."""
    names = select_studies(engine, studies, campaigns, archived)
    rank = {n: i for i, n in enumerate(names)}
    data = reads.table_inputs(engine, names)
    found = {st.id: st for st, _ in data.results}
    retrieval = stored_embeddings.retrieval_of_studies(engine, list(found))
    groups = scope_groups(sorted(found.values(), key=lambda st: rank[st.name]), retrieval)
    group_of = {st.id: g for g in groups for st in g.studies}
    counts = _trial_counts(data.trial_reasons, list(found))
    meta = _study_meta(
        groups, counts, data.history, data.fold_threads, data.test_epochs, data.fold_provenance
    )
    for study_id, m in meta.items():  # failed trials and test folds, with their reasons
        m.update(failure_columns(data.failures.get(study_id, [])))
    rows = _study_rows(data.results, group_of, rank, meta)
    rows = add_rescored(engine, data.results, rows, metrics, unreadable) if metrics else rows
    for g in groups:
        rows += _baseline_rows(g, data.baseline_links, data.baselines)
    return _values_frame(rows)
