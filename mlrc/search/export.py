"""Exports of a study: ``mlrc study export`` (a study file with the best parameters fixed and
the full resolved preset: anyone re-runs its test stage) and ``mlrc study export-model`` (the
best test reproduction's model for use outside mlrc; formats in :mod:`mlrc.train.export`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlrc.config import Preset
from mlrc.config.identity import code_version, params_hash
from mlrc.search.artifacts import artifact_root, fold_folder, study_folder
from mlrc.search.errors import StudyError
from mlrc.store import results, studies, trials
from mlrc.train import OnnxExportError, export_model

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from mlrc.store import TestResultRecord

__all__ = ["export_study_file", "export_study_model"]


def export_study_model(
    engine: Engine,
    name: str,
    artifacts: Path,
    out: Path,
    dim: str = "512",
    reproduction: int | None = None,
    fmt: str = "state-dict",
) -> dict[str, Any]:
    """Write study ``name``'s model to ``out``: the reproduction with the best test MAP@R
    (``reproduction``: that one) — its four fold models concatenated (``dim`` "512") or its
    fold model with the best test MAP@R (``dim`` "128"), in format ``fmt`` (state-dict, export
    or onnx: :mod:`mlrc.train.export`). Returns what was written (metadata).
    A study without test results, or whose checkpoints were not kept, or a model ONNX cannot
    express (``fmt`` "onnx"), is a StudyError."""
    row = studies.study_named(engine, name)
    if row is None:
        raise StudyError(f"no study {name!r} in the store")
    rows = results.test_results(engine, row.id)
    if not rows:
        raise StudyError(f"study {name!r} has no test results yet: run `mlrc study test` first")
    mode = "concatenated" if dim == "512" else "separated"
    chosen = _chosen_reproduction(name, rows, mode, reproduction)
    reproduction = chosen.reproduction
    per_fold = {
        r.fold: r.map_at_r
        for r in rows
        if r.reproduction == reproduction and r.mode == "separated" and r.fold >= 0
    }
    folds = sorted(per_fold)
    if dim == "128":
        folds = [max(per_fold, key=lambda f: (per_fold[f], -f))]
        test_map = per_fold[folds[0]]
    else:
        test_map = chosen.map_at_r
    root = artifact_root(study_folder(artifacts, name), row.config)
    h = params_hash(chosen.params)
    paths = [fold_folder(root, "test", h, reproduction, f) / "best.pt" for f in folds]
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise StudyError(
            f"study {name!r}: the models of reproduction {reproduction} are not on disk "
            f"({missing[0]}); the study ran with artifacts.keep: resume — run the test stage "
            "again with more reproductions and --keep best to keep them"
        )
    meta = {
        "study": name,
        "dataset": row.dataset,
        "loss": row.loss,
        "params": chosen.params,
        "reproduction": reproduction,
        "fold": folds[0] if dim == "128" else None,
        "test_map_at_r": test_map,
        "mode": mode,
        "code_version": code_version(),
    }
    _export(name, Preset.model_validate(row.config["preset"]), paths, out, meta, fmt)
    return meta


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
