"""The report's metrics computed after the fact (``mlrc report --metrics``): values that
``mlrc study rescore`` computed from a study's stored test embeddings and stored
(``mlrc_rescored``), as lines beside the test stage's own, with the same intervals and marks.
Read from the store only; nothing here computes a metric (the CLI has
:func:`mlrc.search.rescore.rescore_missing` store what is missing first). A study without the values says why
in the notes: tested before embeddings were stored (how many reproductions to test again), or
not re-scored yet (the command to run)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mlrc.store import METRIC_COLUMNS
from mlrc.store import embeddings as stored

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from mlrc.store import StudyRecord, TestResultRecord

__all__ = ["AFTER", "add_rescored", "rescored_label"]

AFTER = "*"  # after a column name: computed after the fact from stored embeddings
_LABELS = {"mrr": "MRR", "map_at_r": "MAP@R", "precision_at_1": "P@1", "r_precision": "R-Prec"}


def rescored_label(metric: str) -> str:
    """A re-scored column's name: ``NDCG@10*`` (``ndcg_at_10``), ``MRR*``, ``mAP@5*``,
    ``R@10*`` (``recall_at_10``), ``FNMR@FMR=0.1*`` (``fnmr_at_fmr_0.1``)."""
    if metric in _LABELS:
        return _LABELS[metric] + AFTER
    name, _, k = metric.partition("_at_")
    name = {"map": "mAP", "recall": "R"}.get(name, name.upper())
    what, _, value = k.rpartition("_")  # fnmr_at_fmr_0.1: FNMR@FMR=0.1
    k = f"{what.upper()}={value}" if what else k
    return f"{name}@{k}{AFTER}" if k else f"{name}{AFTER}"


def add_rescored(
    engine: Engine,
    results: list[tuple[StudyRecord, TestResultRecord]],
    rows: list[dict[str, Any]],
    metrics: dict[str, str],
    unreadable: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """``rows`` (the study lines :func:`mlrc.report.values.collect` built, before sorting) with
    a line per stored re-scored value of ``metrics`` (column key → how ``--metrics`` asks for
    it: ``{"ndcg_at_10": "ndcg_at_k@10"}``) (fold −1, in %; a traditional study: its
    one model's, concatenated), each a copy of its study's reproduction × mode line, marked
    ``after_the_fact`` (a metric the test stage scored itself is shown as it scored it); the
    studies without them get their ``rescore_note`` (``unreadable``: by study name, why its
    files could not be re-scored)."""
    studies = {st.id: st for st, _ in results}
    values = stored.rescored_values(engine, list(studies), list(metrics))
    got = {(s, rep, mode, m): v for s, rep, mode, fold, m, v in values if fold == -1}
    template = {(r["study"], r["reproduction"], r["mode"]): r for r in rows}
    own = {(r["study"], r["reproduction"], r["mode"], r["metric"]) for r in rows}
    out = list(rows)
    for st, tr in results:
        base = template.get((st.name, tr.reproduction, tr.mode))
        for i, m in enumerate(metrics):
            value = got.get((st.id, tr.reproduction, tr.mode, m))
            if base is None or value is None or (st.name, tr.reproduction, tr.mode, m) in own:
                continue
            line = {**base, "metric": m, "value": 100.0 * value, "after_the_fact": True}
            out.append({**line, "_metric": len(METRIC_COLUMNS) + 10 + i})
    notes = _notes(engine, studies, results, got, metrics, unreadable or {})
    for r in out:
        r["rescore_note"] = notes.get(r["study"], "")
    return out


def _notes(
    engine: Engine,
    studies: dict[int, StudyRecord],
    results: list[tuple[StudyRecord, TestResultRecord]],
    got: dict[tuple, float],
    metrics: dict[str, str],
    unreadable: dict[str, str],
) -> dict[str, str]:
    """Per study name lacking some of ``metrics`` for some tested reproduction, why, in one
    phrase: no embeddings stored (what to test again), its files unreadable (``unreadable``:
    missing or changed, and what works), or not re-scored (what to run)."""
    files = stored.files_of_studies(engine, [st.name for st in studies.values()])
    out = {}
    for sid, st in studies.items():
        tested = sorted({tr.reproduction for s, tr in results if s.id == sid})
        with_file = [f.reproduction for f in files.get(st.name, [])]
        if not with_file:
            out[st.name] = stored.retest_hint(tested, [])
            continue
        have = {m: {rep for (s, rep, _, mm) in got if s == sid and mm == m} for m in metrics}
        parts = []
        missing = [m for m in metrics if not set(with_file) <= have[m]]
        if missing and st.name in unreadable:
            parts.append(f"{', '.join(missing)} not computed: {unreadable[st.name]}")
        elif missing:
            asks = ",".join(metrics[m] for m in missing)
            parts.append(
                f"{', '.join(missing)} not computed yet: run `mlrc study rescore {st.name} "
                f"--metrics {asks}`"
            )
        if without := [r for r in tested if r not in with_file]:
            parts.append(
                f"reproductions {', '.join(map(str, without))} were tested before embeddings "
                f"were stored ({stored.retest_hint(tested, with_file)})"
            )
        if parts:
            out[st.name] = "; ".join(parts)
    return out
