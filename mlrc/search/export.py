"""Exports of a study: ``mlrc study export`` (a study file with the best parameters fixed and
the full resolved preset: anyone re-runs its test stage) and ``mlrc study export-model`` (the
best test reproduction's model for use outside mlrc; formats in :mod:`mlrc.train.export`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlrc.config import Preset
from mlrc.config.identity import code_version, params_hash
from mlrc.search.artifacts import (
    COLLECTED_SETTING,
    artifact_root,
    fold_folder,
    moved_hint,
    study_folder,
    where_artifacts,
)
from mlrc.search.errors import StudyError
from mlrc.search.retention import exported_reproduction
from mlrc.store import results, studies, trials
from mlrc.train import OnnxExportError, export_model

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from mlrc.store import StudyRecord, TestResultRecord

__all__ = ["export_study_file", "export_study_model", "model_mode"]


def export_study_model(
    engine: Engine,
    name: str,
    artifacts: Path | None,
    out: Path,
    dim: str = "concatenated",
    reproduction: int | None = None,
    fmt: str = "state-dict",
) -> dict[str, Any]:
    """Write study ``name``'s model to ``out``: the reproduction with the best test MAP@R
    (``reproduction``: that one) — its K fold models concatenated (``dim`` "concatenated", or
    the number K·D) or its trained fold model with the best test MAP@R (``dim`` "fold", or the
    number D), in format ``fmt`` (state-dict, export or onnx: :mod:`mlrc.train.export`).
    K and D are the study's folds and embedding size. A fold that kept epoch 0 (the untrained
    model) is never the one fold exported; a concatenation that holds one is exported with
    ``untrained_folds`` in the metadata. Returns what was written (metadata). A study without
    test results, a ``dim`` that is not one of its sizes, whose checkpoints are not on disk
    under ``artifacts`` (None: where the store recorded the study's; the message names the
    real cause), or a model ONNX cannot express (``fmt`` "onnx"), is a StudyError."""
    row = studies.study_named(engine, name)
    if row is None:
        raise StudyError(f"no study {name!r} in the store")
    rows = results.test_results(engine, row.id)
    if not rows:
        raise StudyError(f"study {name!r} has no test results yet: run `mlrc study test` first")
    preset = Preset.model_validate(row.config["preset"])
    mode = model_mode(name, dim, preset.folds, preset.embedding_size)
    epochs = results.test_fold_epochs(engine, row.id)
    chosen, folds = _chosen_models(name, rows, mode, reproduction, epochs)
    reproduction = chosen.reproduction
    per_fold = _fold_values(rows, reproduction)
    test_map = per_fold[folds[0]] if mode == "separated" else chosen.map_at_r
    where, how = where_artifacts(row.settings, artifacts)
    root = artifact_root(study_folder(where, name), row.config)
    h = params_hash(chosen.params)
    paths = [fold_folder(root, "test", h, reproduction, f) / "best.pt" for f in folds]
    missing = [p for p in paths if not p.is_file()]
    if missing:
        why = _why_missing(engine, row, h, reproduction, moved_hint(how, artifacts))
        raise StudyError(
            f"study {name!r}: the models of reproduction {reproduction} are not on disk "
            f"({missing[0]}): {why}"
        )
    meta = {
        "study": name,
        "dataset": row.dataset,
        "loss": row.loss,
        "params": chosen.params,
        "reproduction": reproduction,
        "fold": folds[0] if mode == "separated" else None,
        "test_map_at_r": test_map,
        "mode": mode,
        "dim": preset.embedding_size * len(folds),
        "untrained_folds": [f for f in folds if epochs.get((reproduction, f)) == 0],
        "code_version": code_version(),
    }
    _export(name, preset, paths, out, meta, fmt)
    return meta


def model_mode(name: str, dim: str, folds: int, size: int) -> str:
    """``concatenated`` or ``separated`` (one fold model) for ``dim`` as a user gives it:
    ``concatenated``, ``fold``, or the number of dimensions, read against the study's own
    K = ``folds`` models of ``size`` dimensions (K·D concatenated, D one fold)."""
    by_size = {str(folds * size): "concatenated", str(size): "separated"}
    words = {"concatenated": "concatenated", "fold": "separated"}
    if dim in words or dim in by_size:
        return words.get(dim) or by_size[dim]
    raise StudyError(
        f"--dim {dim}: study {name!r} has {folds} fold models of {size}-D: --dim "
        f"{folds * size} (concatenated) or {size} (one fold), or --dim concatenated|fold"
    )


def _fold_values(rows: list[TestResultRecord], reproduction: int) -> dict[int, float]:
    """Fold → test MAP@R of each fold model of ``reproduction``."""
    return {
        r.fold: r.map_at_r
        for r in rows
        if r.reproduction == reproduction and r.mode == "separated" and r.fold >= 0
    }


def _chosen_models(
    name: str,
    rows: list[TestResultRecord],
    mode: str,
    reproduction: int | None,
    epochs: dict[tuple[int, int], int | None],
) -> tuple[TestResultRecord, list[int]]:
    """The aggregate row of the reproduction to export and its folds: every fold
    (concatenated), or the trained fold with the best test MAP@R (one fold: a fold that kept
    epoch 0 is the untrained model, never chosen; the best reproduction that has one)."""
    if mode == "concatenated":
        chosen = _chosen_reproduction(name, rows, mode, reproduction)
        return chosen, sorted(_fold_values(rows, chosen.reproduction))
    aggregate = {r.reproduction: r for r in rows if r.mode == mode and r.fold == -1}
    order = (
        [reproduction]
        if reproduction is not None
        else sorted(aggregate, key=lambda k: (-aggregate[k].map_at_r, k))
    )
    for rep in order:
        chosen = _chosen_reproduction(name, rows, mode, rep)
        per_fold = _fold_values(rows, rep)
        trained = [f for f in per_fold if epochs.get((rep, f)) != 0]
        if trained:
            return chosen, [max(trained, key=lambda f: (per_fold[f], -f))]
    which = f"reproduction {reproduction}" if reproduction is not None else "any reproduction"
    raise StudyError(
        f"study {name!r}: every fold model of {which} kept epoch 0, the untrained model "
        "(validation never improved on it): no trained fold to export; train longer "
        "(preset.max_epochs) or export the concatenation (--dim concatenated)"
    )


def _why_missing(engine: Engine, row: StudyRecord, h: str, reproduction: int, moved: str) -> str:
    """Why the fold models of ``reproduction`` (params hash ``h``) are gone, and what works: a
    row that still names its checkpoint was moved or deleted outside mlrc (``moved``: where it
    looked, how to point elsewhere); a row that forgot it was collected by ``mlrc gc`` or by
    the study's retention, which keeps one reproduction's (:func:`exported_reproduction`)."""
    folds = [
        f
        for f in trials.fold_runs(engine, row.id)
        if f.kind == "test" and f.params_hash == h and f.reproduction == reproduction
    ]
    if any(f.checkpoint for f in folds):
        return f"moved or deleted outside mlrc ({moved})"
    settings = row.settings or {}
    kept = exported_reproduction(engine, row.id)
    have = (
        f"; reproduction {kept[0]}'s are kept: --reproduction {kept[0]}"
        if kept is not None and kept[0] != reproduction and _on_disk(engine, row, kept)
        else ""
    )
    gc = settings.get(COLLECTED_SETTING)
    if gc:
        return (
            f"collected by `mlrc gc` (--keep {gc['keep']}) after the test stage, though the "
            f"study keeps {settings.get('artifacts.keep', 'resume')}{have}; run `mlrc study "
            f"test {row.name} --reproductions N` with a larger N to train new ones"
        )
    return (
        f"the study's retention (artifacts.keep: {settings.get('artifacts.keep', 'resume')}) "
        f"keeps the fold models of one reproduction only{have}; --keep best keeps every "
        "reproduction's"
    )


def _on_disk(engine: Engine, row: StudyRecord, kept: tuple[int, str]) -> bool:
    """Whether the kept reproduction's fold rows still name their checkpoints."""
    rep, h = kept
    return any(
        f.checkpoint
        for f in trials.fold_runs(engine, row.id)
        if f.kind == "test" and f.params_hash == h and f.reproduction == rep
    )


def _export(
    name: str, preset: Preset, paths: list[Path], out: Path, meta: dict[str, Any], fmt: str
) -> None:
    """:func:`export_model`, a model ONNX cannot express a StudyError of study ``name``."""
    try:
        export_model(preset, paths, out, meta, fmt)
    except OnnxExportError as e:
        raise StudyError(f"study {name!r}: {e}") from e


def _chosen_reproduction(
    name: str, rows: list[TestResultRecord], mode: str, reproduction: int | None
) -> TestResultRecord:
    """The aggregate ``mode`` row of reproduction ``reproduction`` (None: the one with the best
    test MAP@R, the lowest on a tie); a reproduction not tested is a StudyError."""
    aggregate = {r.reproduction: r for r in rows if r.mode == mode and r.fold == -1}
    if reproduction is None:
        reproduction = max(aggregate, key=lambda k: (aggregate[k].map_at_r, -k))
    elif reproduction not in aggregate:
        raise StudyError(
            f"study {name!r} has no reproduction {reproduction} (tested: {sorted(aggregate)})"
        )
    return aggregate[reproduction]


def export_study_file(engine: Engine, name: str, new_name: str | None = None) -> dict[str, Any]:
    """The study file of study ``name`` with its best trial's parameters fixed (nothing left to
    search: ``mlrc study test`` runs its test stage directly), its seed, sampler and budget of
    reproductions, and its whole resolved preset as ``overrides`` (the same numbers whatever
    the preset files say later). Named ``new_name`` (default ``<name>-exported``)."""
    row = studies.study_named(engine, name)
    if row is None:
        raise StudyError(f"no study {name!r} in the store")
    best = trials.best_trial(engine, row.id)
    if best is not None:
        params = dict(best.params)
    elif not row.config.get("space"):  # nothing to search (as the traditional files): fixed
        params = dict(row.config.get("fixed") or {})
    else:
        raise StudyError(f"study {name!r} has no complete trial yet: run `mlrc study run` first")
    stored = row.config["study"]
    parts: dict[str, dict[str, Any]] = {"loss": {}, "miner": {}, "strategy": {}}
    for k, v in params.items():
        part = next((p for p in ("miner", "strategy") if k.startswith(f"{p}.")), "loss")
        parts[part][k.removeprefix(f"{part}.")] = v
    doc: dict[str, Any] = {
        "name": new_name or f"{name}-exported",
        "dataset": stored["dataset"],
        "preset": stored["preset"],
        "loss": {"name": stored["loss"]["name"], "params": parts["loss"], "search": {}},
    }
    for part in ("miner", "strategy"):
        if stored.get(part):
            doc[part] = {"name": stored[part]["name"], "params": parts[part], "search": {}}
    doc["sampler"] = stored["sampler"]
    doc["search"] = {"trials": 1, "seed": stored["search"]["seed"]}
    doc["test"] = {"reproductions": row.config["reproductions"]}
    doc["overrides"] = row.config["preset"]
    split = row.config.get("split")  # a custom split: "predefined", or its content inline
    if split is not None:
        doc["split"] = (
            "predefined"
            if split["test"] == "predefined"
            else {k: v for k, v in split.items() if v is not None}
        )
    return doc
