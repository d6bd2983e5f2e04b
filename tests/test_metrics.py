"""Retrieval metrics vs a naive loop over the definitions and vs PML's AccuracyCalculator."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

from mlrc.protocol import metrics as M
from mlrc.protocol.metrics import concatenate_embeddings, retrieval_metrics


def clustered(n_classes: int, dim: int, seed: int, spread: float = 0.9, singletons: int = 3):
    """Gaussian clusters with uneven class sizes (2..25) plus a few one-item classes."""
    rng = np.random.default_rng(seed)
    sizes = np.concatenate([rng.integers(2, 26, n_classes), np.ones(singletons, dtype=int)])
    centres = rng.standard_normal((len(sizes), dim))
    labels = np.repeat(np.arange(len(sizes)), sizes)
    x = centres[labels] + spread * rng.standard_normal((len(labels), dim))
    perm = rng.permutation(len(labels))
    return x[perm].astype(np.float32), labels[perm]


def naive_metrics(x: np.ndarray, y: np.ndarray, normalize: bool = True) -> dict[str, float]:
    """The MLRC definitions, one query at a time, in float64."""
    x = x.astype(np.float64)
    if normalize:
        x = x / np.linalg.norm(x, axis=1, keepdims=True)
    maps, p1s, rps = [], [], []
    for i in range(len(x)):
        others = np.delete(np.arange(len(x)), i)
        R = int((y[others] == y[i]).sum())
        if R == 0:
            continue
        d = ((x[others] - x[i]) ** 2).sum(1)
        ranked = others[np.argsort(d, kind="stable")]
        rel = [1.0 if y[j] == y[i] else 0.0 for j in ranked[:R]]
        precision_at = [sum(rel[: t + 1]) / (t + 1) for t in range(R)]
        maps.append(sum(p * r for p, r in zip(precision_at, rel, strict=True)) / R)
        p1s.append(rel[0])
        rps.append(sum(rel) / R)
    return {"map_at_r": np.mean(maps), "precision_at_1": np.mean(p1s), "r_precision": np.mean(rps)}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("dim", [8, 128])
def test_against_naive_loop(seed, dim):
    x, y = clustered(30, dim, seed)
    got, want = retrieval_metrics(x, y), naive_metrics(x, y)
    for k in M.METRICS:
        assert got[k] == pytest.approx(want[k], abs=1e-6)
    assert got["num_queries"] == int((np.bincount(y)[y] > 1).sum())


@pytest.mark.parametrize("normalize", [True, False])
def test_collapsed_embeddings_are_ranked_exactly(normalize):
    """Nearly collinear embeddings: float32 distances tie or misorder; the float64 re-ranking
    must still agree with the float64 naive loop."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 40, 600)
    x = (np.ones(64) + 1e-4 * rng.standard_normal((600, 64))).astype(np.float32)
    got, want = retrieval_metrics(x, y, normalize=normalize), naive_metrics(x, y, normalize)
    for k in M.METRICS:
        assert got[k] == pytest.approx(want[k], abs=1e-12)


def test_exact_ties_at_the_candidate_boundary_fall_back_to_a_full_float64_ranking(monkeypatch):
    """Groups of identical vectors under different labels: ties at the boundary of the float32
    candidates cannot be certified, so those queries are ranked over all items (ties by index)."""
    rng = np.random.default_rng(1)
    centres = rng.standard_normal((6, 16))
    x = np.repeat(centres, 60, axis=0).astype(np.float32)  # 60 exact copies > k + 8 candidates
    y = rng.integers(0, 10, len(x))
    calls = []
    original = M._score64
    monkeypatch.setattr(M, "_score64", lambda *a: calls.append(a[2].shape) or original(*a))
    got, want = retrieval_metrics(x, y), naive_metrics(x, y)
    assert any(shape[1] == len(x) for shape in calls)  # the full float64 ranking ran
    for k in M.METRICS:
        assert got[k] == pytest.approx(want[k], abs=1e-12)


def test_unnormalised_ranks_by_euclidean_distance():
    x, y = clustered(20, 16, 7)
    x *= np.random.default_rng(0).uniform(0.2, 5.0, (len(x), 1)).astype(np.float32)
    got, want = retrieval_metrics(x, y, normalize=False), naive_metrics(x, y, normalize=False)
    for k in M.METRICS:
        assert got[k] == pytest.approx(want[k], abs=1e-6)
    assert got["map_at_r"] != pytest.approx(retrieval_metrics(x, y)["map_at_r"], abs=1e-4)


@pytest.mark.parametrize(
    ("n_classes", "dim", "spread"), [(100, 128, 2.0), (60, 512, 2.5), (200, 64, 1.5)]
)
@pytest.mark.parametrize("normalize", [True, False])
def test_against_pml_accuracy_calculator(n_classes, dim, spread, normalize):
    """PML's tester L2-normalises before AccuracyCalculator, which itself ranks by raw L2."""
    x, y = clustered(n_classes, dim, seed=n_classes, spread=spread)
    calc = AccuracyCalculator(
        include=("mean_average_precision_at_r", "precision_at_1", "r_precision"), k="max_bin_count"
    )
    q = torch.from_numpy(x)
    ref = calc.get_accuracy(
        torch.nn.functional.normalize(q) if normalize else q, torch.from_numpy(y)
    )
    got = retrieval_metrics(x, y, normalize=normalize)
    assert 0.05 < got["map_at_r"] < 0.95  # a regime where a wrong ranking would show
    assert got["map_at_r"] == pytest.approx(ref["mean_average_precision_at_r"], abs=1e-6)
    assert got["precision_at_1"] == pytest.approx(ref["precision_at_1"], abs=1e-6)
    assert got["r_precision"] == pytest.approx(ref["r_precision"], abs=1e-6)


def test_blocked_computation_equals_one_block(monkeypatch):
    x, y = clustered(40, 32, 3)
    whole = retrieval_metrics(x, y)
    monkeypatch.setattr(M, "_BLOCK_BYTES", 4 * len(x) * 7)  # 7 queries per block
    assert retrieval_metrics(x, y) == pytest.approx(whole, abs=1e-12)


def test_lone_queries_are_excluded_and_duplicates_of_self_count():
    x = np.repeat(np.eye(4, dtype=np.float32), [3, 1, 4, 2], axis=0)
    y = np.repeat(np.arange(4), [3, 1, 4, 2])
    got = retrieval_metrics(x, y)
    assert got["num_queries"] == 9
    assert got["map_at_r"] == got["precision_at_1"] == got["r_precision"] == 1.0


def test_torch_input_and_device_argument_give_the_same_numbers():
    x, y = clustered(25, 16, 5)
    a = retrieval_metrics(x, y)
    b = retrieval_metrics(torch.from_numpy(x), torch.from_numpy(y), device="cpu")
    assert a == b


def test_cuda_matches_cpu():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device on this machine; the CPU path is tested above")
    x, y = clustered(50, 128, 11)
    cpu, gpu = retrieval_metrics(x, y), retrieval_metrics(x, y, device="cuda")
    for k in M.METRICS:
        assert gpu[k] == pytest.approx(cpu[k], abs=1e-6)


@pytest.mark.parametrize(
    ("x", "y", "message"),
    [
        (np.zeros((3, 2)), np.zeros(4), "need embeddings"),
        (np.array([[np.nan, 1.0], [1.0, 1.0]]), np.array([0, 0]), "NaN"),
        (np.eye(3), np.arange(3), "no query has another item"),
    ],
)
def test_bad_input_is_a_clear_error(x, y, message):
    with pytest.raises(ValueError, match=message):
        retrieval_metrics(x, y)


def test_concatenate_embeddings_normalises_each_part_then_the_whole():
    rng = np.random.default_rng(0)
    parts = [rng.standard_normal((10, 128)) * s for s in (0.1, 1.0, 10.0, 3.0)]
    got = concatenate_embeddings(parts)
    unit = [p / np.linalg.norm(p, axis=1, keepdims=True) for p in parts]
    want = np.concatenate(unit, axis=1) / 2.0  # four unit parts → norm 2
    assert isinstance(got, np.ndarray) and got.shape == (10, 512)
    np.testing.assert_allclose(got, want, atol=1e-6)
    t = concatenate_embeddings([torch.from_numpy(p) for p in parts])
    assert isinstance(t, torch.Tensor)
    np.testing.assert_allclose(t.numpy(), want, atol=1e-6)
    with pytest.raises(ValueError, match="different numbers of rows"):
        concatenate_embeddings([parts[0], parts[1][:5]])
