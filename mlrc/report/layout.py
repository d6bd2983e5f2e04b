"""The layout of the test-result tables, shared by every format: per (dataset, protocol) a
:class:`Block` of :class:`Row` s, each with its :class:`Cell` s and their marks resolved. Also the
legend's notes that the table needs (:func:`legend`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from mlrc.report.legend import (
    ARCHIVED,
    ARCHIVED_NOTE,
    BASELINE_NOTE_END,
    BASELINE_NOTES,
    DDAGGER,
    LEGEND,
    LEGEND_ONE_MODEL,
    NONFINITE_NOTE,
    PROTOCOL_NOTE,
    PRUNED_NOTE,
    RESCORED_NOTE,
    RETRIEVAL_NOTES,
    SECTION,
    TRADITIONAL_NOTE,
    TRADITIONAL_TITLE,
    UNTRAINED_NOTE,
    WARM,
    WARM_NOTE,
    values_line,
)
from mlrc.report.rescored import rescored_label
from mlrc.report.summary import with_defaults
from mlrc.report.values import MODES, TRADITIONAL_MODE, UNMARKED_METRICS, traditional_metrics
from mlrc.store import METRIC_COLUMNS

__all__ = [
    "BASELINE_KINDS",
    "COLUMNS",
    "METRIC_LABELS",
    "MODE_LABELS",
    "Block",
    "Cell",
    "Row",
    "block_columns",
    "compute_notes",
    "legend",
    "metric_label",
    "mode_label",
    "notes",
    "rescore_notes",
    "row_label",
    "sizes_of",
    "table_blocks",
]

MODE_LABELS = {"separated": "Separated", "concatenated": "Concatenated"}
METRIC_LABELS = {"map_at_r": "MAP@R", "precision_at_1": "P@1", "r_precision": "R-Prec"}
BASELINE_KINDS = ("pretrained", "random_init")
COLUMNS = [(mode, m) for mode in MODES for m in METRIC_COLUMNS]  # a row's cells, in order


def metric_label(metric: str) -> str:
    """A column's name: ``MAP@R``, ``P@1``, ``R-Prec``, ``R@4`` (recall_at_4), ``Epoch``."""
    if metric.startswith("recall_at_"):
        return f"R@{metric.removeprefix('recall_at_')}"
    return "Epoch" if metric in UNMARKED_METRICS else METRIC_LABELS[metric]


def mode_label(mode: str, sizes: tuple[int, int] | None) -> str:
    """``Separated (D-D)`` / ``Concatenated (K·D-D)`` for ``sizes`` = (K fold models, D);
    the bare mode when the sizes are not one pair."""
    if sizes is None:
        return MODE_LABELS[mode]
    k, d = sizes
    return f"{MODE_LABELS[mode]} ({d if mode == 'separated' else k * d}-D)"


def sizes_of(lines: pd.DataFrame) -> tuple[int, int] | None:
    """The one (fold models, embedding size) pair of ``lines``' studies, or None (none
    recorded, or several)."""
    if "fold_models" not in lines.columns:
        return None
    studies = lines[~lines["baseline"]]
    pairs = {
        (int(k), int(d))
        for k, d in zip(studies["fold_models"], studies["embedding_size"], strict=True)
        if not (pd.isna(k) or pd.isna(d))
    }
    return pairs.pop() if len(pairs) == 1 else None


def block_columns(dataset: str, traditional: bool) -> list[tuple[str, str]]:
    """A block's (mode, metric) columns: :data:`COLUMNS`, or for a traditional block its one
    model's Recall@K, MAP@R and chosen epoch (:func:`~mlrc.report.values.traditional_metrics`)."""
    if not traditional:
        return list(COLUMNS)
    return [(TRADITIONAL_MODE, m) for m in traditional_metrics(dataset)]


def row_label(loss: str, strategy: str | None) -> str:
    """``loss`` or ``loss + strategy`` (a missing strategy is None or NaN in a frame)."""
    return f"{loss} + {strategy}" if isinstance(strategy, str) and strategy else loss


class Cell:
    """One value of a row: mean, half-width and its marks (bold, †)."""

    def __init__(self, r: pd.Series, compared: bool) -> None:
        self.mean, self.half_width = float(r["mean"]), float(r["half_width"])
        self.bold = compared and bool(r["best"])
        # the column's best (every row tied for it) is never marked: it is what † compares with
        not_worse = r["not_worse"]
        self.dagger = (
            compared and not bool(r["best"]) and not pd.isna(not_worse) and bool(not_worse)
        )

    def text(self, pm: str) -> str:
        """``mean pm half-width`` with two decimals (the mean alone without an interval)."""
        if math.isnan(self.half_width):
            return f"{self.mean:.2f}"
        return f"{self.mean:.2f} {pm} {self.half_width:.2f}"


class Row:
    """One row of a block: a study (or a baseline), its ``n`` and its cells (None: no value)."""

    def __init__(
        self,
        label: str,
        n: str,
        underline: bool,
        cells: list[Cell | None],
        baseline: bool = False,
        study: str = "",
        archived: bool = False,
    ) -> None:
        self.label, self.n, self.underline, self.cells = label, n, underline, cells
        self.baseline, self.study, self.archived = baseline, study, archived


@dataclass
class Block:
    """One table block: a dataset, or one protocol of a dataset with several."""

    dataset: str
    protocol: str
    fields: str  # this protocol's differing fields; "" when the dataset has a single protocol
    diff: str  # the dataset's differing fields ("preset.max_epochs 1 vs 2"), or ""
    rows: list[Row]
    budgets: str  # "trials 4 (contrastive) vs 8 (triplet)" when the search budgets differ
    nonfinite: list[tuple[str, int, int]]  # (row label, scored 0, complete trials)
    history: list[tuple[str, str]] = field(default_factory=list)  # (row label, budget changes)
    columns: list[tuple[str, str]] = field(default_factory=lambda: list(COLUMNS))  # the cells'
    traditional: bool = False  # its epoch chosen on the test set: rows marked §, own columns
    threads: list[tuple[str, str]] = field(default_factory=list)  # (row label, "1, 2")
    untrained: list[str] = field(default_factory=list)  # row labels: every test fold at epoch 0
    # (row label, what computed its folds, what differs between them) of rows that recorded it
    compute: list[tuple[str, str, str]] = field(default_factory=list)
    warm: list[tuple[str, str]] = field(default_factory=list)  # (row label, its warm start)
    after: list[str] = field(default_factory=list)  # metrics computed after the fact (rescore)
    rescore: list[tuple[str, str]] = field(default_factory=list)  # (row label, why it lacks them)
    sizes: tuple[int, int] | None = None  # (fold models, embedding size) of its studies

    def mode_label(self, mode: str) -> str:
        """A mode's heading with its embedding size for this block's studies:
        ``Separated (128-D)`` and ``Concatenated (512-D)`` for 4 folds of 128-D."""
        return mode_label(mode, self.sizes)

    def label(self, metric: str) -> str:
        """A column's name (:func:`metric_label`), marked when computed after the fact."""
        return rescored_label(metric) if metric in self.after else metric_label(metric)

    @property
    def name(self) -> str:
        """The block in a note: ``cub``, ``cub, traditional`` or ``cub, protocol 3f2a9c1d``."""
        name = f"{self.dataset}, traditional" if self.traditional else self.dataset
        return f"{name}, protocol {self.protocol}" if self.diff else name

    @property
    def title(self) -> str:
        """The block's heading: ``cub``, ``cub — protocol 3f2a9c1d: preset.max_epochs 1``,
        ``cub — traditional protocol: epoch chosen on the test set``."""
        title = f"{self.dataset} — {TRADITIONAL_TITLE}" if self.traditional else self.dataset
        return title + (f" — protocol {self.protocol}: {self.fields}" if self.diff else "")


@dataclass
class _BlockNotes:
    """What a block's study rows add to its notes while they are laid out."""

    nonfinite: list[tuple[str, int, int]]
    budgets: dict[int, list[str]]
    history: list[tuple[str, str]] = field(default_factory=list)
    threads: list[tuple[str, str]] = field(default_factory=list)  # (row label, "1, 2")
    untrained: list[str] = field(default_factory=list)
    compute: list[tuple[str, str, str]] = field(default_factory=list)
    warm: list[tuple[str, str]] = field(default_factory=list)  # (row label, its warm start)
    rescore: list[tuple[str, str]] = field(default_factory=list)  # (row label, rescore note)


def _study_row(
    study: str, g: pd.DataFrame, label: str, underline: bool, compared: dict, acc: _BlockNotes
) -> Row:
    """A study's row (its lines ``g`` of the summary, cells in the order of ``compared``'s
    columns); records its zeros and budget in ``acc``."""
    by = {(r["mode"], r["metric"]): r for _, r in g.iterrows()}
    first = g.iloc[0]
    if not pd.isna(first["nonfinite_trials"]) and first["nonfinite_trials"] > 0:
        acc.nonfinite.append((label, int(first["nonfinite_trials"]), int(first["complete_trials"])))
    if not pd.isna(first["trials_budget"]):
        acc.budgets.setdefault(int(first["trials_budget"]), []).append(label)
    if first["budget_history"]:
        acc.history.append((label, first["budget_history"]))
    if first["fold_threads"]:
        acc.threads.append((label, first["fold_threads"]))
    if first["untrained_test"]:
        acc.untrained.append(label)
    if first["fold_compute"]:
        acc.compute.append((label, first["fold_compute"], first["mixed_compute"]))
    if first["warm_start"]:
        acc.warm.append((label, first["warm_start"]))
    if first["rescore_note"]:
        acc.rescore.append((label, first["rescore_note"]))
    if first["pruner"] != "none":
        label = f"{label} {DDAGGER}"
    if first["warm_start"]:
        label = f"{label} {WARM}"
    if first["test_set_selection"]:
        label = f"{label} {SECTION}"
    lo, hi = int(g["n"].min()), int(g["n"].max())
    archived = bool(first["archived"])  # shown for reference: never marked
    return Row(
        label,
        str(hi) if lo == hi else f"{lo}–{hi}",
        underline and not archived and bool(g["best_row"].any()),
        [Cell(by[c], compared[c] and not archived) if c in by else None for c in compared],
        study=study,
        archived=archived,
    )


def _baseline_row(study: str, g: pd.DataFrame, columns: list[tuple[str, str]]) -> Row:
    """A baseline's row: n = 1, no marks."""
    by = {(r["mode"], r["metric"]): r for _, r in g.iterrows()}
    cells = [Cell(by[c], False) if c in by else None for c in columns]
    return Row(study, "1", False, cells, baseline=True, study=study)


def _block(dataset: str, protocol: str, d: pd.DataFrame) -> Block:
    """The block of the summary lines ``d`` of one (dataset, protocol)."""
    studies = d[~d["baseline"]]
    traditional = bool(studies["test_set_selection"].any())
    after = list(dict.fromkeys(studies.loc[studies["after_the_fact"], "metric"]))
    columns = _with_after(block_columns(dataset, traditional), after, traditional)
    current = studies[~studies["archived"]]  # archived rows are shown, never compared
    # a column's marks need at least two rows with a value in it; the epoch is never marked
    compared = {
        c: c[1] not in UNMARKED_METRICS
        and ((current["mode"] == c[0]) & (current["metric"] == c[1])).sum() >= 2
        for c in columns
    }
    n_rows = current["study"].nunique()
    archived = set(studies.loc[studies["archived"], "study"])
    labels = {
        st: row_label(g["loss"].iloc[0], g["strategy"].iloc[0])
        for st, g in studies.groupby("study", sort=False)
    }
    rows, acc = [], _BlockNotes([], {})
    for study, g in d.groupby("study", sort=False):
        if bool(g["baseline"].iloc[0]):
            rows.append(_baseline_row(study, g, columns))
            continue
        label = labels[study]
        if study in archived:
            label = f"{label} ({study}, {ARCHIVED})"
        elif [labels[s] for s in labels if s not in archived].count(label) > 1:
            label = f"{label} ({study})"
        rows.append(_study_row(study, g, label, n_rows >= 2, compared, acc))
    budget_text = ""
    if len(acc.budgets) > 1:
        budget_text = "trials " + " vs ".join(
            f"{b} ({', '.join(labs)})" for b, labs in acc.budgets.items()
        )
    first = d.iloc[0]
    fields = first["protocol_fields"] if first["protocol_diff"] else ""
    return Block(
        dataset,
        protocol,
        fields,
        first["protocol_diff"],
        rows,
        budget_text,
        acc.nonfinite,
        acc.history,
        columns,
        traditional,
        threads=acc.threads,
        untrained=acc.untrained,
        compute=acc.compute,
        warm=acc.warm,
        after=after,
        rescore=acc.rescore,
        sizes=sizes_of(d),
    )


def _with_after(
    columns: list[tuple[str, str]], after: list[str], traditional: bool
) -> list[tuple[str, str]]:
    """A block's ``columns`` with the metrics computed after the fact: after each mode's own
    (a traditional block: after its one model's)."""
    if traditional:
        return columns + [(TRADITIONAL_MODE, m) for m in after]
    return [(mode, m) for mode in MODES for m in [*METRIC_COLUMNS, *after]]


def table_blocks(summary: pd.DataFrame) -> list[Block]:
    """Per (dataset, protocol) block, in summary order: its rows with marks resolved, baselines
    first."""
    summary = with_defaults(summary)
    return [
        _block(dataset, protocol, d)
        for (dataset, protocol), d in summary.groupby(["dataset", "protocol"], sort=False)
    ]


def pruning_notes(summary: pd.DataFrame) -> list[str]:
    """The pruning note and, per pruned study, its rules and their measured risk."""
    pruned = summary[(summary["pruner"] != "none") & ~summary["baseline"]]
    out = [PRUNED_NOTE] if len(pruned) else []
    for study, g in pruned.groupby("study", sort=False):
        risk = g["pruning_risk"].iloc[0]
        out.append(f"{DDAGGER} {study}: {g['pruner'].iloc[0]}{'; ' + risk if risk else ''}")
    return out


def retrieval_notes(summary: pd.DataFrame) -> list[str]:
    """How each dataset's test rows were ranked: all vs all (MLRC) or query→gallery (the
    dataset's roles), one line for each protocol found, naming the datasets ranked with it."""
    how = summary.groupby("retrieval", sort=False)["dataset"].unique()
    return [
        f"Retrieval {kind} ({', '.join(map(str, how[kind]))}): {RETRIEVAL_NOTES[kind]}."
        for kind in RETRIEVAL_NOTES
        if kind in how.index
    ]


def notes(summary: pd.DataFrame, blocks: list[Block]) -> list[str]:
    """The legend's notes after the marks: the traditional protocol's leakage, baselines,
    pruning, protocols, budgets, zeros."""
    summary = with_defaults(summary)
    out = [TRADITIONAL_NOTE] if any(b.traditional for b in blocks) else []
    kinds = [k for k in BASELINE_KINDS if ((summary["loss"] == k) & summary["baseline"]).any()]
    if kinds:
        out.append("; ".join(BASELINE_NOTES[k] for k in kinds) + BASELINE_NOTE_END)
    out += pruning_notes(summary)
    out += retrieval_notes(summary)
    if (summary["warm_start"].astype(bool) & ~summary["baseline"]).any():
        out.append(WARM_NOTE)
    # (dataset, traditional) -> its blocks, when it has several protocols
    split: dict[tuple[str, bool], list[Block]] = {}
    for b in blocks:
        if b.diff:
            split.setdefault((b.dataset, b.traditional), []).append(b)
    if split:
        out.append(PROTOCOL_NOTE)
    for (dataset, traditional), bs in split.items():
        kind = " traditional" if traditional else ""
        out.append(
            f"{dataset}: {len(bs)}{kind} protocols, differing in {bs[0].diff} — "
            + "; ".join(f"{b.protocol}: {b.fields}" for b in bs)
            + "."
        )
    for b in blocks:
        if b.budgets:
            out.append(f"{b.name}: the search budgets differ — {b.budgets}.")
    for b in blocks:
        for label, warm in b.warm:
            out.append(f"{label} ({b.name}): warm-started from {warm}.")
    for b in blocks:
        for label, changes in b.history:
            out.append(f"{label} ({b.name}): budget changed during the study — {changes}.")
    for b in blocks:
        for label, counts in b.threads:
            out.append(
                f"{label} ({b.name}): its folds ran with different torch thread counts "
                f"({counts}); float sums differ between counts, so its numbers are not those "
                "of one count."
            )
    out += compute_notes(blocks)
    for b in blocks:
        for label, zeros, done in b.nonfinite:
            out.append(f"{label} ({b.name}): {zeros} of {done} complete trials {NONFINITE_NOTE}.")
    for b in blocks:
        for label in b.untrained:
            out.append(f"{label} ({b.name}): {UNTRAINED_NOTE}.")
    if any(r.archived for b in blocks for r in b.rows):
        out.append(ARCHIVED_NOTE)
    out += rescore_notes(blocks)
    failures = dict(zip(summary["study"], summary["failures"], strict=True))
    for b in blocks:
        for r in b.rows:  # failed trials and test folds, with the reason each failed with
            if not r.baseline and failures.get(r.study):
                out.append(f"{r.label} ({b.name}): {failures[r.study]}.")
    return out


def rescore_notes(blocks: list[Block]) -> list[str]:
    """The mark of metrics computed after the fact, and why a row lacks those asked for."""
    out = [RESCORED_NOTE] if any(b.after or b.rescore for b in blocks) else []
    return out + [f"{label} ({b.name}): {note}." for b in blocks for label, note in b.rescore]


def compute_notes(blocks: list[Block]) -> list[str]:
    """What computed each block's folds (one note for the block when all its rows agree, else
    one per row), then a note per row whose folds ran on devices or settings that differ
    (GPU models, TF32, …): its numbers are not those of one device."""
    out = []
    for b in blocks:
        texts = {text for _, text, _ in b.compute}
        if len(texts) == 1 and len(b.compute) > 1:
            out.append(f"{b.name}: folds computed on {texts.pop()}.")
        else:
            out += [
                f"{label} ({b.name}): folds computed on {text}." for label, text, _ in b.compute
            ]
    for b in blocks:
        for label, _, mixed in b.compute:
            if mixed:
                out.append(
                    f"{label} ({b.name}): its folds ran on different {mixed}; float results "
                    "differ between them, so its numbers are not those of one device."
                )
    return out


def legend(summary: pd.DataFrame, blocks: list[Block]) -> list[str]:
    """The legend of a table of ``blocks``: the marks (:data:`LEGEND`; with traditional blocks
    only, :data:`LEGEND_ONE_MODEL`), then its notes."""
    one_model = bool(blocks) and all(b.traditional for b in blocks)
    if one_model:
        return LEGEND_ONE_MODEL + notes(summary, blocks)
    sizes = {b.sizes for b in blocks if not b.traditional}
    return [values_line(sizes.pop() if len(sizes) == 1 else None), *LEGEND[1:]] + notes(
        summary, blocks
    )
