"""The untrained baseline: the trunk before any training, measured on the test classes (the
tables' "Pretrained" row, or "Random init" for a trunk trained from scratch)."""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import numpy as np

from mlrc import store
from mlrc.config import ResolvedStudy
from mlrc.config.identity import canonical_json, code_version
from mlrc.protocol import retrieval_metrics
from mlrc.protocol.analysis import analysis_metrics, recall_ks
from mlrc.protocol.scoring import score
from mlrc.search.session import StudySession
from mlrc.store import results
from mlrc.store.embeddings import ALL_VS_ALL, QUERY_GALLERY, retrieval_of
from mlrc.train import UNTRAINED_SEED, View, embed, untrained_trunk
from mlrc.train.setup import eval_inputs

log = logging.getLogger("mlrc")


def baseline_of(r: ResolvedStudy) -> dict[str, Any]:
    """What defines the untrained row's numbers: the dataset, the trunk and its weights, the
    eval transform (the test classes are the second half of the classes, or the query/gallery
    classes of a dataset with roles, whatever the folds)."""
    p = r.preset
    return {
        "dataset": r.study.dataset.model_dump(mode="json"),
        "trunk": p.trunk,
        "pretrained": p.pretrained,
        "seed": None if p.pretrained else UNTRAINED_SEED,
        "resize": p.image.resize,
        "crop": p.image.crop,
    }


def ensure_baseline(ctx: StudySession) -> None:
    """The untrained trunk on the test classes (the tables' "Pretrained" row, or "Random init"
    for a trunk trained from scratch), computed once per :func:`baseline_of` key and linked to
    this study. Separated = concatenated = the trunk's own features (L2-normalised by the
    metrics), as the reference harness does for untrained status."""
    config = baseline_of(ctx.resolved)
    if getattr(ctx.dataset, "roles", None) is not None:  # ranked query→gallery (not as before)
        config["retrieval"] = QUERY_GALLERY
    key = hashlib.sha256(canonical_json(config).encode()).hexdigest()[:16]
    with store.advisory_lock(ctx.engine, f"mlrc-baseline:{key}"):  # a pool's studies share it
        if not results.has_baseline(ctx.engine, key):
            _compute_baseline(ctx, key, config)
    results.link_baseline(ctx.engine, ctx.study_id, key)


def _compute_baseline(ctx: StudySession, key: str, config: dict[str, Any]) -> None:
    """Embed the test classes with the untrained trunk, measure and store them under ``key``."""
    r, p = ctx.resolved, ctx.resolved.preset
    kind = "pretrained" if p.pretrained else "random_init"
    label = f"{'Pretrained' if p.pretrained else 'Random init'} ({p.trunk})"
    log.info("computing the untrained baseline row: %s on the test classes", label)
    model = untrained_trunk(p).to(ctx.device)
    emb, labels = embed(
        model, view_of_test_classes(ctx, model.trunk.input_spec), p.eval_batch_size, ctx.device
    )
    view = view_of_test_classes(ctx, model.trunk.input_spec)
    m = test_set_metrics(ctx, emb, labels, test_roles(ctx, view))  # as the reproductions' rows
    results.record_baseline(
        ctx.engine,
        key,
        m,
        dataset=r.study.dataset.name,
        kind=kind,
        label=label,
        trunk=p.trunk,
        config=config,
        device=ctx.device,
        code_version=code_version(),
    )


def test_set_metrics(
    ctx: StudySession, emb: np.ndarray, labels: np.ndarray, roles: np.ndarray
) -> dict[str, float]:
    """The test rows' metrics (fractions) of embeddings ``emb`` (n × d, raw: L2-normalised
    here) with class ``labels`` and ``roles`` (:func:`test_roles`): MAP@R, P@1, R-Precision and
    Recall@K (K = 1, 2, 4, 8 and the dataset's own) rank, for each query, the gallery
    (query→gallery, as In-Shop's benchmark) when the roles name queries, else every other test
    item (all vs all, MLRC); the analysis metrics (NMI, mAP@1000, ρ, π) are computed on all the
    test rows either way (a clustering or a property of the embedding space, not a ranking of
    queries; mAP@1000 keeps the Revisiting paper's all-vs-all definition)."""
    seed = ctx.resolved.study.search.seed
    ks = tuple(sorted({1, 2, 4, 8, *recall_ks(ctx.resolved.study.dataset.name)}))
    out = analysis_metrics(emb, labels, seed=seed, ks=ks)
    if retrieval_of(roles) == ALL_VS_ALL:
        m = retrieval_metrics(emb, labels, device=ctx.device)
        m.pop("num_queries")
        return {**m, **out}
    q, g = roles == "query", roles == "gallery"
    asked = ["map_at_r", "precision_at_1", "r_precision", *(f"recall_at_k@{k}" for k in ks)]
    ranked = score(",".join(asked), emb[q], labels[q], emb[g], labels[g], device=ctx.device)
    return {**out, **ranked}  # Recall@K query→gallery replaces the all-vs-all one


def view_of_test_classes(ctx: StudySession, input_spec: dict) -> View:
    """The test classes, with the preset's evaluation crops for a trunk's ``input_spec``
    (:func:`~mlrc.train.setup.eval_inputs`: computed once under ``decoded_cache``)."""
    p = ctx.resolved.preset
    return eval_inputs(p, ctx.dataset, ctx.split.test_classes, input_spec, ctx.progress)


def test_roles(ctx: StudySession, view: View) -> np.ndarray:
    """Per row of a test view (:func:`view_of_test_classes`): ``"query"`` or ``"gallery"``
    where the dataset gives its test images roles (In-Shop, an image folder with ``query/`` and
    ``gallery/``), else ``"all"`` (every image is a query against all the others). A ``str``
    array of ``len(view)``; a training image among the rows is a ValueError (the split keeps
    the test classes those of the query and gallery images)."""
    roles = getattr(view.ds, "roles", None)
    if roles is None:
        roles = getattr(
            ctx.dataset, "roles", None
        )  # the view reads the dataset itself or its cached crops
    if roles is None:
        return np.full(len(view), "all", dtype="<U7")
    if len(roles) != len(view.ds):
        raise ValueError(f"{ctx.dataset.name}: {len(roles)} roles for {len(view.ds)} images")
    out = np.asarray(roles)[view.indices].astype("<U7")
    if (out == "train").any():
        i = int(view.indices[np.flatnonzero(out == "train")[0]])
        raise ValueError(f"{view.ds.origins[i]}: a training image is in the test view")
    return out


def test_super_labels(ctx: StudySession, view: View) -> np.ndarray | None:
    """Per row of a test view: the dataset's super-class label (SOP's categories,
    ``super_class_id − 1``), or None when the dataset has none."""
    supers = getattr(view.ds, "super_labels", None)
    if supers is None:
        supers = getattr(ctx.dataset, "super_labels", None)
    return None if supers is None else np.asarray(supers)[view.indices].astype(np.int64)


test_roles.__test__ = False  # type: ignore[attr-defined]  # not a test when a test imports it
test_super_labels.__test__ = False  # type: ignore[attr-defined]
