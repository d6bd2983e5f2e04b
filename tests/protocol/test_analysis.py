"""Analysis metrics vs independent references: naive loops, PML, sklearn and numpy SVD."""

from __future__ import annotations

import faiss
import numpy as np
import pytest
import torch
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
from scipy.spatial import distance
from scipy.stats import entropy
from sklearn.metrics import normalized_mutual_info_score
from test_metrics import clustered

from mlrc.protocol import analysis as A
from mlrc.protocol.analysis import (
    analysis_metrics,
    embedding_density,
    map_at_1000,
    metrix_utilization,
    nmi,
    pi_ratio,
    recall_at_k,
    spectral_decay,
)


def ranked_others(x: np.ndarray, i: int) -> np.ndarray:
    """Other items by float64 Euclidean distance to item i, ties by index."""
    others = np.delete(np.arange(len(x)), i)
    d = ((x[others] - x[i]) ** 2).sum(1)
    return others[np.argsort(d, kind="stable")]


def unit64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def naive_recall(x: np.ndarray, y: np.ndarray, ks) -> dict[str, float]:
    x = unit64(x)
    hits = dict.fromkeys(ks, 0)
    for i in range(len(x)):
        ranked = ranked_others(x, i)
        for k in ks:
            hits[k] += any(y[j] == y[i] for j in ranked[:k])
    return {f"recall_at_{k}": hits[k] / len(x) for k in ks}


def naive_map_at_1000(x: np.ndarray, y: np.ndarray, divisor: str = "class_size") -> float:
    x = unit64(x)
    sizes = {c: int((y == c).sum()) for c in np.unique(y)}
    aps = []
    for i in range(len(x)):
        rel = (y[ranked_others(x, i)[:1000]] == y[i]).astype(np.float64)
        precision = np.cumsum(rel) / np.arange(1, len(rel) + 1)
        n_c = sizes[y[i]]
        denominator = n_c if divisor == "class_size" else max(1, min(n_c - 1, 1000))
        aps.append(float((precision * rel).sum()) / denominator)
    return float(np.mean(aps))


def revisiting_map_1000(x: np.ndarray, y: np.ndarray) -> float:
    """The Revisiting code's metrics/mAP_1000.py logic (faiss float32, column 0 = the query)."""
    feats = unit64(x).astype(np.float32)
    labels, freqs = np.unique(y, return_counts=True)
    index = faiss.IndexFlatL2(feats.shape[1])
    index.add(feats)
    nn_labels = y[index.search(feats, 1001)[1][:, 1:]]
    aps = []
    for label, freq in zip(labels, freqs, strict=True):
        for row in np.where(y == label)[0]:
            occ = nn_labels[row] == label
            aps.append(np.sum(np.cumsum(occ) * occ / np.arange(1, 1001)) / freq)
    return float(np.mean(aps))


# --- Recall@k ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("seed", "dim"), [(0, 8), (1, 64), (2, 128)])
def test_recall_against_naive_loop(seed, dim):
    x, y = clustered(30, dim, seed, spread=1.5)
    got, want = recall_at_k(x, y), naive_recall(x, y, (1, 2, 4, 8))
    assert set(got) == {"recall_at_1", "recall_at_2", "recall_at_4", "recall_at_8"}
    for k in want:
        assert got[k] == pytest.approx(want[k], abs=1e-12)
    assert got["recall_at_1"] <= got["recall_at_2"] <= got["recall_at_4"] <= got["recall_at_8"]


def test_recall_at_1_equals_pml_precision_at_1_over_non_lone_queries():
    """PML leaves out queries alone in their class; Revisiting counts them as misses."""
    x, y = clustered(100, 128, seed=5, spread=2.0, singletons=7)
    calc = AccuracyCalculator(include=("precision_at_1",), k=1)
    ref = calc.get_accuracy(torch.nn.functional.normalize(torch.from_numpy(x)), torch.from_numpy(y))
    got = recall_at_k(x, y, ks=(1,))["recall_at_1"]
    non_lone = int((np.bincount(y)[y] > 1).sum())
    assert 0.1 < got < 0.9
    assert got * len(y) == pytest.approx(ref["precision_at_1"] * non_lone, abs=1e-3)


def test_recall_k_beyond_n_is_capped_and_blocks_agree(monkeypatch):
    x, y = clustered(5, 4, 3, singletons=0)
    whole = recall_at_k(x, y, ks=(1, 3, 10_000))
    assert whole["recall_at_10000"] == 1.0  # every query has a classmate somewhere
    monkeypatch.setattr(A, "BLOCK_BYTES", 4 * len(x) * 3)  # 3 queries per block
    assert recall_at_k(x, y, ks=(1, 3, 10_000)) == whole
    with pytest.raises(ValueError, match="positive"):
        recall_at_k(x, y, ks=(0,))


def test_duplicates_of_self_count_and_torch_input():
    x = np.repeat(np.eye(3, dtype=np.float32), [2, 1, 3], axis=0)
    y = np.repeat(np.arange(3), [2, 1, 3])
    got = recall_at_k(torch.from_numpy(x), torch.from_numpy(y), ks=(1,))
    assert got["recall_at_1"] == pytest.approx(5 / 6)  # the singleton class misses


# --- mAP@1000 ---------------------------------------------------------------------------------


def big_classes(seed: int = 0):
    """1,300 items in a few large, overlapping classes, so the 1000-window truncates."""
    rng = np.random.default_rng(seed)
    sizes = np.array([700, 350, 150, 60, 30, 8, 2])
    y = np.repeat(np.arange(len(sizes)), sizes)
    x = 0.8 * rng.standard_normal((len(sizes), 16))[y] + rng.standard_normal((len(y), 16))
    perm = rng.permutation(len(y))
    return x[perm].astype(np.float32), y[perm]


def test_map_at_1000_against_naive_loop_and_revisiting_code():
    x, y = big_classes()
    got = map_at_1000(x, y)
    assert got == pytest.approx(naive_map_at_1000(x, y), abs=1e-12)
    assert got == pytest.approx(revisiting_map_1000(x, y), abs=1e-5)  # faiss float32 near-ties
    strict = map_at_1000(x, y, divisor="min_r")
    assert strict == pytest.approx(naive_map_at_1000(x, y, "min_r"), abs=1e-12)
    assert strict > got


def test_map_at_1000_small_set_uses_every_other_item():
    x, y = clustered(20, 32, 4)
    assert map_at_1000(x, y) == pytest.approx(naive_map_at_1000(x, y), abs=1e-12)
    perfect = np.repeat(np.eye(4, dtype=np.float32), [3, 1, 4, 2], axis=0)
    labels = np.repeat(np.arange(4), [3, 1, 4, 2])
    assert map_at_1000(perfect, labels) == pytest.approx((2 + 0 + 3 + 1) / 10)
    assert map_at_1000(perfect, labels, divisor="min_r") == pytest.approx(9 / 10)


# --- NMI --------------------------------------------------------------------------------------


def test_nmi_is_sklearns_score_of_the_cluster_assignment(monkeypatch):
    x, y = clustered(15, 16, 6)
    assignment = np.random.default_rng(0).integers(0, 18, len(y))
    seen = {}

    def fake(points, k, seed):
        seen.update(k=k, seed=seed, norms=np.linalg.norm(points, axis=1))
        return assignment

    monkeypatch.setattr(A, "kmeans_assign", fake)
    assert nmi(x, y, seed=7) == normalized_mutual_info_score(y, assignment)
    assert seen["k"] == len(np.unique(y)) and seen["seed"] == 7
    np.testing.assert_allclose(seen["norms"], 1.0, atol=1e-6)


def test_nmi_of_separated_clusters_is_one():
    rng = np.random.default_rng(1)
    sizes = np.array([40, 25, 60, 10, 33])
    y = np.repeat(np.arange(5), sizes)
    x = 10 * np.eye(5, 32)[y] + 0.01 * rng.standard_normal((len(y), 32))
    assert nmi(x, y, seed=0) == pytest.approx(1.0)
    assert nmi(x, y, seed=0) == nmi(x, y, seed=0)  # deterministic for a fixed seed


def test_nmi_of_random_labels_is_near_zero():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2000, 16))
    y = rng.integers(0, 10, 2000)
    assert 0.0 <= nmi(x, y) < 0.05


# --- spectral decay ---------------------------------------------------------------------------


def numpy_rho(x: np.ndarray, drop: int, normalize: bool = True) -> float:
    x = unit64(x) if normalize else x.astype(np.float64)
    s = np.linalg.svd(x, compute_uv=False)[drop:]
    s_norm = s / s.sum()
    uniform = np.ones(len(s)) / len(s)
    return float(entropy(uniform, s_norm))  # the code's scipy call: KL(uniform ‖ spectrum)


@pytest.mark.parametrize("drop", [0, 1, 3])
@pytest.mark.parametrize("normalize", [True, False])
def test_spectral_decay_against_numpy_svd(drop, normalize):
    x, _ = clustered(40, 32, 8)
    got = spectral_decay(x, drop_largest=drop, normalize=normalize)
    assert got == pytest.approx(numpy_rho(x, drop, normalize), rel=1e-9)


def test_spectral_decay_is_uncentred_and_defaults_to_the_paper():
    x, _ = clustered(40, 32, 9)
    assert spectral_decay(x) == pytest.approx(numpy_rho(x, 1), rel=1e-9)
    shifted = x + 5.0  # centring would remove the shift; the uncentred spectrum changes
    assert spectral_decay(shifted, normalize=False) != pytest.approx(
        spectral_decay(x, normalize=False), rel=1e-3
    )


def test_isotropic_cloud_decays_less_than_a_rank_deficient_one():
    rng = np.random.default_rng(3)
    iso = rng.standard_normal((3000, 64))
    low = rng.standard_normal((3000, 8)) @ rng.standard_normal((8, 64))
    low += 1e-3 * rng.standard_normal(low.shape)
    rho_iso, rho_low = spectral_decay(iso), spectral_decay(low)
    assert 0.0 <= rho_iso < 0.05  # nearly flat spectrum
    assert rho_low > rho_iso + 1.0
    assert spectral_decay(np.eye(6)) == pytest.approx(0.0, abs=1e-12)


def test_spectral_decay_with_fewer_rows_than_columns_uses_min_n_d_values():
    x = np.random.default_rng(4).standard_normal((10, 50))
    assert spectral_decay(x) == pytest.approx(numpy_rho(x, 1), rel=1e-9)
    assert np.isfinite(spectral_decay(x))


# --- π_ratio ----------------------------------------------------------------------------------


def loop_density(x: np.ndarray, y: np.ndarray, normalize: bool = True) -> dict[str, float]:
    """Revisiting metrics/dists.py, with singletons set to the max as the code means to."""
    x = x.astype(np.float64)
    classes = np.unique(y)
    intra = []
    for c in classes:
        members = x[y == c]
        if len(members) < 2:
            intra.append(np.nan)
            continue
        total = 0.0
        for i in range(len(members)):
            for j in range(len(members)):
                if i != j:
                    total += distance.cosine(members[i], members[j])
        intra.append(total / (len(members) ** 2 - len(members)))
    intra = np.array(intra)
    intra[np.isnan(intra)] = np.nanmax(intra)
    source = unit64(x) if normalize else x
    means = [source[y == c].mean(0) for c in classes]
    means = [m / np.linalg.norm(m) for m in means]
    inter = np.mean(
        [distance.cosine(a, b) for i, a in enumerate(means) for j, b in enumerate(means) if i != j]
    )
    return {"pi_intra": intra.mean(), "pi_inter": inter, "pi_ratio": intra.mean() / inter}


@pytest.mark.parametrize("normalize", [True, False])
def test_density_against_a_direct_loop(normalize):
    x, y = clustered(25, 16, 10)
    x *= np.random.default_rng(0).uniform(0.3, 3.0, (len(x), 1)).astype(np.float32)
    got, want = embedding_density(x, y, normalize=normalize), loop_density(x, y, normalize)
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-9)
    assert pi_ratio(x, y, normalize=normalize) == got["pi_ratio"]


def test_density_matches_scipy_cdist_as_the_revisiting_code_does():
    x, y = clustered(12, 8, 11, singletons=0)
    intra = np.mean(
        [
            distance.cdist(x[y == c], x[y == c], "cosine").sum()
            / ((y == c).sum() ** 2 - (y == c).sum())
            for c in np.unique(y)
        ]
    )
    coms = np.array([unit64(x)[y == c].mean(0) for c in np.unique(y)])
    coms /= np.linalg.norm(coms, axis=1, keepdims=True)
    d = distance.cdist(coms, coms, "cosine")
    inter = d.sum() / (len(d) ** 2 - len(d))
    assert pi_ratio(x, y) == pytest.approx(intra / inter, rel=1e-9)


def test_density_rejects_undefined_inputs():
    with pytest.raises(ValueError, match="two classes"):
        pi_ratio(np.ones((3, 2)), np.zeros(3))
    with pytest.raises(ValueError, match="at least two items"):
        pi_ratio(np.eye(3), np.arange(3))
    with pytest.raises(ValueError, match="zero vector"):
        pi_ratio(np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]]), np.array([0, 0, 1]))


# --- utilization ------------------------------------------------------------------------------


@pytest.mark.parametrize("normalize", [False, True])
def test_utilization_against_a_direct_loop(normalize):
    rng = np.random.default_rng(12)
    test = rng.standard_normal((150, 24)).astype(np.float32)
    train = rng.standard_normal((400, 24)).astype(np.float32)
    t64, r64 = test.astype(np.float64), train.astype(np.float64)
    if normalize:
        t64, r64 = unit64(t64), unit64(r64)
    want = np.mean([min(((r64 - q) ** 2).sum(1)) for q in t64])
    got = metrix_utilization(test, train, normalize=normalize)
    assert got == pytest.approx(want, rel=1e-12)


def test_utilization_shrinks_when_mixed_points_are_added_and_is_zero_on_the_train_set(
    monkeypatch,
):
    rng = np.random.default_rng(13)
    train = rng.standard_normal((300, 16))
    test = rng.standard_normal((100, 16))
    lam = rng.beta(2, 2, (600, 1))
    i, j = rng.integers(0, 300, (2, 600))
    mixed = lam * train[i] + (1 - lam) * train[j]
    clean = metrix_utilization(test, train)
    monkeypatch.setattr(A, "BLOCK_BYTES", 8 * 900 * 7)  # 7 queries per block
    assert metrix_utilization(test, np.vstack([train, mixed])) <= clean
    assert metrix_utilization(train, train) == 0.0


# --- all together -----------------------------------------------------------------------------


def test_analysis_metrics_equals_the_single_functions():
    x, y = clustered(40, 32, 14, spread=1.5)
    got = analysis_metrics(x, y, seed=3)
    want = {
        **recall_at_k(x, y),
        "nmi": nmi(x, y, seed=3),
        "map_at_1000": map_at_1000(x, y),
        "spectral_decay": spectral_decay(x),
        "pi_ratio": pi_ratio(x, y),
    }
    assert set(got) == set(want)
    for key, value in want.items():
        assert isinstance(got[key], float)
        assert got[key] == pytest.approx(value, abs=1e-12), key


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="need embeddings"):
        recall_at_k(np.zeros((3, 2)), np.zeros(4))
    with pytest.raises(ValueError, match="NaN"):
        map_at_1000(np.array([[np.nan, 1.0], [1.0, 1.0]]), np.array([0, 0]))
    with pytest.raises(ValueError, match="divisor"):
        map_at_1000(np.eye(3), np.arange(3), divisor="hits")
    with pytest.raises(ValueError, match="test"):
        metrix_utilization(np.zeros((3, 2)), np.zeros((3, 4)))


def test_map_exact_ties_at_the_window_boundary_go_to_the_lower_index(monkeypatch):
    """Groups of identical vectors under different labels: the 1000-window cuts through a tie."""
    rng = np.random.default_rng(15)
    x = np.repeat(rng.standard_normal((3, 8)), [500, 700, 300], axis=0).astype(np.float32)
    y = rng.integers(0, 6, len(x))
    assert map_at_1000(x, y) == pytest.approx(naive_map_at_1000(x, y), abs=1e-12)
    small = recall_at_k(x, y, ks=(1, 8))
    monkeypatch.setattr(A, "SMALL_K", 0)  # rank small k with the float64 path too
    assert recall_at_k(x, y, ks=(1, 8)) == small == naive_recall(x, y, (1, 8))


def test_map_blocks_agree(monkeypatch):
    x, y = big_classes(1)
    whole = map_at_1000(x, y)
    monkeypatch.setattr(A, "BLOCK_BYTES", 8 * len(x) * 97)  # 97 queries per block
    assert map_at_1000(x, y) == pytest.approx(whole, abs=1e-15)


@pytest.mark.parametrize(
    "metric",
    [
        lambda x, y: recall_at_k(x, y, (1, 2)),
        map_at_1000,
        nmi,
        embedding_density,
        pi_ratio,
        analysis_metrics,
    ],
    ids=["recall_at_k", "map_at_1000", "nmi", "embedding_density", "pi_ratio", "all"],
)
def test_labels_that_are_not_whole_numbers_are_refused_and_whole_floats_are_classes(metric):
    """Labels 0.01 … 0.04 used to be cast to one class (0) silently; whole-number floats
    (``2.0``) are class ids and give the same value as the integer labels."""
    x, y = clustered(4, 8, 3, singletons=0)
    with pytest.raises(ValueError, match=r"^labels must be integer class ids, got 0\.\d+ "):
        metric(x, (y + 1) / 100.0)
    assert metric(x, y.astype(np.float64)) == metric(x, y)
