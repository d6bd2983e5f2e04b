"""The test stage: the best parameters retrained ``reproductions`` times on all folds, beside the
untrained baseline. Each fold model is measured on the test classes, separated (each 128-D fold
model, then their mean) and concatenated (512-D).

Under the traditional preset there is one fold, whose best epoch was already chosen on the test
classes: its three rows (fold 0, the separated mean, the "concatenation" of one model) hold the
same numbers, and the report shows them once, marked as test-set selection.

A reproduction that raises ends by the one rule of :func:`mlrc.search.errors.ending`: stopped
by a signal, its running fold is recorded as interrupted (it resumes from ``last.pt``) and
:class:`~mlrc.search.errors.Interrupted` names it; any other error fails the fold it was at with
the one-line error as its reason (``mlrc study status`` and ``mlrc campaign status`` show it; the
next run trains that fold again) and goes on to the command, which prints that line."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import optuna
from optuna.trial import TrialState

from mlrc import store
from mlrc.config.identity import canonical_json, code_version, derive_seed, params_hash
from mlrc.errors import first_line
from mlrc.protocol import concatenate_embeddings
from mlrc.protocol.analysis import metrix_utilization
from mlrc.protocol.retrieval import retrieval_view
from mlrc.protocol.stats import separated_mean
from mlrc.search import retention
from mlrc.search.baseline import (
    ensure_baseline,
    test_roles,
    test_set_metrics,
    test_super_labels,
    view_of_test_classes,
)
from mlrc.search.embeddings import file_fields
from mlrc.search.errors import INTERRUPTED, Interrupted, StudyError, ending, interrupt_behind
from mlrc.search.folds import FoldJob, run_fold
from mlrc.search.session import StudySession
from mlrc.store import embeddings as stored_embeddings
from mlrc.store import results, trials
from mlrc.store.embeddings import ALL_VS_ALL, QUERY_GALLERY
from mlrc.train import View, embed, load_model
from mlrc.train.setup import eval_inputs

log = logging.getLogger("mlrc")
# The dashboard's retrieval view of a reproduction (mlrc.protocol.retrieval.retrieval_view).
VIEW_QUERIES, VIEW_K, VIEW_MAP_POINTS = 8, 5, 2000


def best_params(ctx: StudySession) -> dict[str, Any]:
    """The parameters of the best complete trial (with the fixed ones); a study without one,
    or whose best was scored 0 for a non-finite loss, is a :class:`StudyError`. A study with
    nothing to search (every parameter fixed, as ``mlrc study export`` writes) tests its fixed
    parameters: no search is needed."""
    if not ctx.resolved.space:
        return dict(ctx.resolved.fixed)
    storage = store.optuna_storage(ctx.url)  # read once, then its connections closed
    try:
        ostudy = optuna.load_study(study_name=ctx.name, storage=storage)
        complete = ostudy.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        best = ostudy.best_trial if complete else None
    except KeyError:  # Optuna: "Record does not exist."
        best = None
    finally:
        storage.engine.dispose()
    if best is None:
        raise StudyError(
            f"study {ctx.name!r} has no complete trial yet: run `mlrc study run` first"
        )
    if str(best.user_attrs.get("reason") or "").startswith(store.NONFINITE):
        raise StudyError(
            f"study {ctx.name!r}: every complete trial was scored 0 because its loss or "
            f"embeddings went non-finite (best: trial {best.number}, {best.user_attrs['reason']});"
            " nothing to test — narrow the search space (e.g. loss_lr) and search again"
        )
    return {**ctx.resolved.fixed, **best.params}


def run_test(ctx: StudySession) -> list[str]:
    """Retrain the best parameters ``reproductions`` times × all folds; test each on the test
    classes, separated (each 128-D fold model, then their mean) and concatenated (512-D).
    Returns messages for reproductions that failed (their results are not stored)."""
    params = best_params(ctx)
    pending = [
        rep for rep in range(1, ctx.resolved.reproductions + 1) if not is_tested(ctx, params, rep)
    ]
    if pending:
        check_same_retrieval(ctx)
    # the untrained baseline's failure fails the first pending reproduction (at fold 0)
    with _recorded_on_exit(ctx, params, pending[0] if pending else None, [0], running=False):
        ensure_baseline(ctx)
    problems = []
    for rep in pending:
        problem = run_reproduction(ctx, params, rep)
        if problem:
            problems.append(problem)
    return problems


def finish_reproduction(ctx: StudySession, params: dict[str, Any], rep: int) -> str | None:
    """Reproduction ``rep``'s rows once a pool trained its folds (a campaign worker's last unit
    of it): the untrained baseline first (its failure fails the reproduction at fold 0, as in
    :func:`run_test`), then :func:`run_reproduction`, its trained folds reused. A failed fold's
    message, or None."""
    with _recorded_on_exit(ctx, params, rep, [0], running=False):
        ensure_baseline(ctx)
    return run_reproduction(ctx, params, rep)


def check_same_retrieval(ctx: StudySession) -> None:
    """A study's reproductions are all ranked one way: a :class:`StudyError` when those already
    tested were ranked otherwise than the dataset now asks (an In-Shop study tested all vs all
    by an mlrc before query/gallery roles, or a folder given a ``roles.csv`` since)."""
    now = QUERY_GALLERY if getattr(ctx.dataset, "roles", None) is not None else ALL_VS_ALL
    files = {f.reproduction: f.retrieval for f in stored_embeddings.embedding_files(
        ctx.engine, ctx.study_id)}  # fmt: skip
    tested = results.tested_reproductions(ctx.engine, ctx.study_id)
    other = sorted(r for r in tested if files.get(r, ALL_VS_ALL) != now)
    if other:
        was = files.get(other[0], ALL_VS_ALL)
        raise StudyError(
            f"study {ctx.name!r}: reproductions {', '.join(map(str, other))} were tested {was}, "
            f"but {ctx.dataset.name} is now tested {now} (its query/gallery roles): their "
            "numbers cannot share an interval; start afresh with `mlrc study run --force-new`"
        )


def is_tested(ctx: StudySession, params: dict[str, Any], rep: int) -> bool:
    """Whether reproduction ``rep`` of ``params`` has all its rows stored."""
    done = results.reproduction_results(ctx.engine, ctx.study_id, rep)
    same = [r for r in done if canonical_json(r.params) == canonical_json(params)]
    return len(same) == len(ctx.split.folds) + 2


@contextmanager
def _recorded_on_exit(
    ctx: StudySession, params: dict[str, Any], rep: int | None, at: list[int], running: bool = True
) -> Iterator[None]:
    """Reproduction ``rep`` (None: none pending) ends by the one rule if the block raises, at
    fold ``at[0]`` (the block updates it as it goes): a signal records its running folds as
    interrupted and raises :class:`Interrupted` naming it (``running`` False: nothing of it
    runs yet, the signal goes on as it is); a lost database records nothing; any other error
    fails the fold with the one-line error as its reason. The exception goes on (a failure to
    record is only logged)."""
    try:
        yield
    except BaseException as e:
        if rep is None or (not running and interrupt_behind(e) is not None):
            raise
        how, reason = ending(e)
        what = f"reproduction {rep}, fold {at[0]}"
        try:
            if how == INTERRUPTED:
                trials.end_running_folds(
                    ctx.engine, ctx.study_id, "test", params_hash(params), how, how, rep
                )
            elif how == "failed":
                fail_test_fold(ctx, params, rep, at[0], reason)
        except Exception as err:  # noqa: BLE001 — ``e`` is what goes on
            log.warning("%s not recorded as %s (%s)", what, how, store.db_error_line(err))
        if how == INTERRUPTED and not isinstance(e, Interrupted):
            raise Interrupted(what=what) from e
        raise


def fail_test_fold(
    ctx: StudySession, params: dict[str, Any], rep: int, fold: int, reason: str
) -> None:
    """Test fold ``fold`` of reproduction ``rep`` as failed with ``reason`` (its row created if
    the failure came before it started: the untrained baseline's)."""
    job = FoldJob("test", params_hash(params), rep, fold)
    seed = derive_seed(ctx.resolved.study.search.seed, "test", job.params_hash, rep, fold)
    existing = trials.fold_run(ctx.engine, job.key(ctx.study_id), job.what)
    first = {} if existing else {"seed": seed, "device": ctx.device, "code_version": code_version()}
    trials.finish_fold(
        ctx.engine, job.key(ctx.study_id), job.what, status="failed", reason=reason, **first
    )


def _test_metrics(
    ctx: StudySession,
    emb: np.ndarray,
    labels: np.ndarray,
    roles: np.ndarray,
    train_emb: np.ndarray,
) -> dict[str, float]:
    """The test rows' metrics (:func:`mlrc.search.baseline.test_set_metrics`: MAP@R, P@1,
    R-Precision, Recall@K query→gallery where ``roles`` name queries, else all vs all; NMI,
    mAP@1000, ρ, π) and the Metrix utilization of the test embeddings against the training
    embeddings ``train_emb`` (the fold's training classes; for the 512-D row, all train+val
    classes), both L2-normalised."""
    util = metrix_utilization(emb, train_emb, normalize=True, device=ctx.device)
    return {**test_set_metrics(ctx, emb, labels, roles), "metrix_utilization": util}


def run_reproduction(ctx: StudySession, params: dict[str, Any], rep: int) -> str | None:
    """Train and test reproduction ``rep``; its rows are stored together, or a failed fold's
    message is returned. An exception ends it by the one rule (:func:`_recorded_on_exit`)."""
    at = [0]  # the fold being trained or tested; after the last, the last
    with _recorded_on_exit(ctx, params, rep, at):
        return _train_and_test(ctx, params, rep, at)


def _train_and_test(
    ctx: StudySession, params: dict[str, Any], rep: int, at: list[int]
) -> str | None:
    """The body of :func:`run_reproduction`; ``at[0]``: the fold it is at."""
    p = ctx.resolved.preset
    embeddings, seen, labels, rows, test_view = [], [], None, [], None
    for fold in ctx.split.folds:
        at[0] = fold.index
        res = run_fold(ctx, "test", params, rep, fold.index, None)
        if res.status != "complete":
            return f"reproduction {rep}, fold {fold.index}: {res.reason}"
        model = load_model(p, res.checkpoint, ctx.device)
        spec_in = model.trunk.input_spec
        test_view = view_of_test_classes(ctx, spec_in)
        emb, labels = embed(model, test_view, p.eval_batch_size, ctx.device, p.num_workers)
        trainval = eval_inputs(p, ctx.dataset, ctx.split.trainval_classes, spec_in, ctx.progress)
        tv_emb, tv_lab = embed(model, trainval, p.eval_batch_size, ctx.device, p.num_workers)
        embeddings.append(emb)
        seen.append(tv_emb)
        own = np.isin(np.asarray(ctx.split.trainval_classes)[tv_lab], fold.train_classes)
        m = _test_metrics(ctx, emb, labels, test_roles(ctx, test_view), tv_emb[own])
        rows.append(("separated", fold.index, {**m, "best_epoch": float(res.best_epoch)}))
    rows.append(("separated", -1, _separated_row(rep, [m for _, _, m in rows])))
    joined = concatenate_embeddings(embeddings)
    roles = test_roles(ctx, test_view)
    m = _test_metrics(ctx, joined, labels, roles, concatenate_embeddings(seen))
    epochs = [fm["best_epoch"] for _, fold, fm in rows if fold >= 0]
    # best_epoch: the epoch each fold model was taken at (traditional: chosen on the test set)
    rows.append(("concatenated", -1, {**m, "best_epoch": float(np.mean(epochs))}))
    view = _retrieval_view(ctx, joined, test_view, rep)
    stored = _store_embeddings(ctx, params, rep, embeddings, test_view, epochs)
    results.record_reproduction(ctx.engine, ctx.study_id, rep, params, rows, view, stored)
    retention.collect(ctx)  # its folds' checkpoints are read no more (kept under keep: best)
    ctx.tracker.reproduction_finished(rep, params, rows)
    return None


def _store_embeddings(
    ctx: StudySession,
    params: dict[str, Any],
    rep: int,
    separated: list[np.ndarray],
    view: View,
    best_epochs: list[float],
) -> dict[str, Any]:
    """Write reproduction ``rep``'s test embeddings (each fold model's raw rows, the items of
    ``view``; each fold model's best epoch) to its ``.npz`` (:mod:`mlrc.search.embeddings`) and
    return its store fields."""
    arrays = {
        "separated": separated,
        "labels": ctx.dataset.labels[view.indices],  # the dataset's class labels
        "roles": test_roles(ctx, view),
        "super_labels": test_super_labels(ctx, view),
        "best_epochs": np.asarray(best_epochs, dtype=np.int64),
        "dtype": ctx.resolved.study.artifacts.embeddings,
    }
    root, hashed = ctx.artifact_root, params_hash(params)
    return file_fields(ctx.artifacts, root, rep, hashed, arrays)


def _separated_row(rep: int, fold_rows: list[dict[str, float]]) -> dict[str, float]:
    """The separated aggregate of reproduction ``rep``: the mean of its 128-D fold models'
    metrics without the folds whose best epoch is 0 (the reference's ``MeanAggregator``:
    :func:`mlrc.protocol.stats.separated_mean`); they still count in the concatenation."""
    epochs = [int(m["best_epoch"]) for m in fold_rows]
    means, _ = separated_mean(fold_rows, epochs)
    untrained = [fold for fold, e in enumerate(epochs) if e == 0]
    if untrained and len(untrained) < len(epochs):
        log.info(
            "reproduction %d: fold(s) %s kept the untrained model (best epoch 0): left out of "
            "the separated mean, as the reference does",
            rep,
            untrained,
        )
    elif untrained:
        log.warning(
            "reproduction %d: every fold kept the untrained model (best epoch 0): the separated "
            "mean is over all folds (the reference records no trained row)",
            rep,
        )
    return means


def _retrieval_view(ctx: StudySession, joined: np.ndarray, view: View, rep: int) -> dict | None:
    """The dashboard's retrieval view of reproduction ``rep`` from its 512-D test embeddings
    ``joined`` (rows = the items of ``view``), seeded by (study seed, ``rep``); None, with a
    warning, when it cannot be computed (the reproduction's results are stored anyway)."""
    try:
        return retrieval_view(
            joined,
            ctx.dataset.labels[view.indices],
            view.indices,
            ctx.dataset.class_names,
            n_queries=VIEW_QUERIES,
            k=VIEW_K,
            max_points=VIEW_MAP_POINTS,
            seed=[ctx.resolved.study.search.seed, rep],
        )
    except Exception as e:  # noqa: BLE001 — a picture for the dashboard, never worth a result
        log.warning("reproduction %d: no retrieval view for the dashboard (%s)", rep, first_line(e))
        return None
