"""Re-scoring without training (``mlrc study rescore``): any registered metric
(:mod:`mlrc.protocol.scoring`) computed from a study's stored test embeddings
(:mod:`mlrc.search.embeddings`). It covers every tested reproduction that stored them. The values
are recorded as computed after the fact (``mlrc_rescored``), where ``mlrc report --metrics`` reads
them (it runs :func:`rescore_missing` first).

Per reproduction, as the test stage scores: each fold model's rows (separated, folds 0..k−1),
their mean (separated, fold −1: the reference's mean aggregator, which leaves out a fold kept at
epoch 0, :func:`mlrc.protocol.stats.separated_mean`) and the concatenated embedding
(concatenated, fold −1: :func:`mlrc.protocol.concatenate_embeddings` of the float32 of the
stored rows). Where the stored roles give queries and a gallery, each query ranks the gallery
(query→gallery); otherwise every item is a query against all the others (all vs all).

A file whose sha256 differs from the store's is refused in one line, never used. A study tested
before embeddings were stored has no file: one line says how many reproductions to test again."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from mlrc.config.identity import code_version
from mlrc.protocol import concatenate_embeddings
from mlrc.protocol.stats import separated_mean
from mlrc.search.artifacts import moved_hint, study_folder, where_artifacts
from mlrc.search.embeddings import load_checked
from mlrc.search.errors import StudyError
from mlrc.store import embeddings as stored
from mlrc.store import results, studies
from mlrc.store.embeddings import retrieval_of

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from mlrc.protocol.scoring import Metric

__all__ = [
    "Rescored",
    "rescore_missing",
    "rescore_study",
    "score_arrays",
    "summary_lines",
]

ScoreRows = list[tuple[str, int, dict[str, float]]]  # (mode, fold, {metric key: value})


@dataclass
class Rescored:
    """What :func:`rescore_study` computed: per reproduction its rows, and the reproductions
    tested before embeddings were stored (none stored: nothing to re-score)."""

    study: str
    protocol: str  # "query→gallery" or "all vs all"
    rows: dict[int, ScoreRows] = field(default_factory=dict)
    without_file: list[int] = field(default_factory=list)


def _score_one(
    metrics: list[Metric],
    emb: np.ndarray,
    labels: np.ndarray,
    roles: np.ndarray,
    sup: np.ndarray | None,
    device: str | None,
) -> dict[str, float]:
    """``metrics`` of one embedding (n × d float32): query→gallery when ``roles`` say so,
    else all vs all (a query never retrieves its own row)."""
    from mlrc.protocol.scoring import score

    if retrieval_of(roles) == stored.ALL_VS_ALL:
        return score(metrics, emb, labels, query_super_labels=sup, device=device)
    q, g = roles == "query", roles == "gallery"
    return score(
        metrics,
        emb[q],
        labels[q],
        emb[g],
        labels[g],
        ref_includes_query=False,
        query_super_labels=None if sup is None else sup[q],
        reference_super_labels=None if sup is None else sup[g],
        device=device,
    )


def score_arrays(
    metrics: list[Metric], arrays: dict[str, np.ndarray], device: str | None = None
) -> ScoreRows:
    """The rows of one stored reproduction (the arrays of its ``.npz``): each fold model
    (separated, fold k), their mean (separated, −1) and the concatenation (concatenated, −1)."""
    sep = np.asarray(arrays["separated"], dtype=np.float32)
    labels, roles = np.asarray(arrays["labels"]), np.asarray(arrays["roles"])
    sup = arrays.get("super_labels")
    rows: ScoreRows = [
        ("separated", k, _score_one(metrics, sep[k], labels, roles, sup, device))
        for k in range(sep.shape[0])
    ]
    epochs = arrays.get("best_epochs", np.ones(sep.shape[0], dtype=np.int64))
    mean, _ = separated_mean([m for _, _, m in rows], [int(e) for e in epochs])
    rows.append(("separated", -1, mean))
    joined = concatenate_embeddings(list(sep))
    rows.append(("concatenated", -1, _score_one(metrics, joined, labels, roles, sup, device)))
    return rows


def rescore_study(
    engine: Engine,
    name: str,
    artifacts: Path | None,
    metrics: list[Metric],
    device: str | None = None,
    write: bool = True,
) -> Rescored:
    """Score ``metrics`` on every stored reproduction of study ``name`` (files under
    ``artifacts``; None: where the store recorded them, :func:`where_artifacts`), hash checked,
    and record them (``write``). A study with no stored embeddings, or unknown or untested, or
    a missing or changed file, is a one-line :class:`StudyError` saying what works."""
    st = studies.study_named(engine, name)
    if st is None:
        raise StudyError(f"no study {name!r} in the store")
    tested = sorted(results.tested_reproductions(engine, st.id))
    if not tested:
        raise StudyError(f"study {name!r} has no test results yet: run `mlrc study test` first")
    files = {f.reproduction: f for f in stored.embedding_files(engine, st.id)}
    out = Rescored(name, stored.ALL_VS_ALL, without_file=[r for r in tested if r not in files])
    if not files:
        raise StudyError(f"study {name!r}: {stored.retest_hint(tested, [])}")
    root, how = where_artifacts(st.settings, artifacts)
    folder = study_folder(root, name)
    more = max(tested) + 1
    retest = (
        f"test a new reproduction (`mlrc study test {name} --reproductions {more}`), which "
        "stores its own file"
    )
    checked = {
        rep: load_checked(
            folder / f.path,
            f.sha256,
            f"study {name!r}, reproduction {rep}",
            moved_hint(how, artifacts),
            retest,
        )
        for rep, f in sorted(files.items())
    }  # every file checked before anything is scored or written
    for rep, arrays in checked.items():
        try:
            out.rows[rep] = score_arrays(metrics, arrays, device)
        except ValueError as e:  # a metric needing labels the study lacks (super-classes)
            raise StudyError(f"study {name!r}: {e}") from None
        out.protocol = retrieval_of(np.asarray(arrays["roles"]))
        if write:
            sha, version = files[rep].sha256, code_version()
            stored.record_rescored(engine, st.id, rep, out.rows[rep], sha, version)
    return out


def missing_metrics(engine: Engine, name: str, metrics: list[Metric]) -> list[Metric]:
    """Those of ``metrics`` not yet stored for every reproduction of study ``name`` that has
    an embedding file (a reproduction tested again has a new file, and needs them again)."""
    st = studies.study_named(engine, name)
    reps = {f.reproduction for f in stored.embedding_files(engine, st.id)} if st else set()
    if not reps:
        return []
    have = stored.rescored_values(engine, [st.id], [m.key for m in metrics])
    done = {(rep, key) for _, rep, _, fold, key, _ in have if fold == -1}
    return [m for m in metrics if any((rep, m.key) not in done for rep in reps)]


def rescore_missing(
    engine: Engine,
    names: list[str],
    artifacts: Path | None,
    metrics: list[Metric],
    device: str | None = None,
) -> tuple[list[str], dict[str, str]]:
    """What ``mlrc report --metrics`` computes before it reads: for each study of ``names``
    with stored embeddings, the ``metrics`` it lacks, scored and recorded as
    :func:`rescore_study` does. Returns (the studies re-scored, by study name the one line of
    each that could not be: a missing or changed file, a metric needing labels it lacks) —
    such a study's values are not shown, and the report's notes say why."""
    done: list[str] = []
    problems: dict[str, str] = {}
    for name in names:
        missing = missing_metrics(engine, name, metrics)
        if not missing:
            continue
        try:
            rescore_study(engine, name, artifacts, missing, device)
        except StudyError as e:
            problems[name] = str(e)
            continue
        done.append(name)
    return done, problems


def summary_lines(done: Rescored) -> list[str]:
    """What ``mlrc study rescore`` prints: per reproduction the aggregate values in %."""
    lines = []
    for rep, rows in sorted(done.rows.items()):
        for mode, fold, values in rows:
            if fold == -1:
                text = ", ".join(f"{k} {100 * v:.2f}" for k, v in values.items())
                lines.append(f"reproduction {rep}, {mode}: {text}")
    return lines
