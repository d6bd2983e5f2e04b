"""Retrieval metrics vs a naive loop over the definitions and vs PML's AccuracyCalculator."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

from mlrc.protocol import metrics as M
from mlrc.protocol.metrics import concatenate_embeddings, retrieval_metrics


def clustered(
    n_classes: int,
    dim: int,
    seed: int,
    spread: float = 0.9,
    singletons: int = 3,
    sizes: tuple[int, int] = (2, 25),
) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian clusters with uneven class sizes (``sizes``, inclusive) plus a few one-item
    classes; float32 embeddings and int labels, rows shuffled."""
    rng = np.random.default_rng(seed)
    sizes = np.concatenate(
        [rng.integers(sizes[0], sizes[1] + 1, n_classes), np.ones(singletons, dtype=int)]
    )
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


def spy(monkeypatch, name: str) -> list[tuple]:
    """Record the arguments of every call to metrics.<name>."""
    calls: list[tuple] = []
    original = getattr(M, name)
    monkeypatch.setattr(M, name, lambda *a: calls.append(a) or original(*a))
    return calls


@pytest.fixture
def torch_path(monkeypatch):
    """Run retrieval_metrics's torch path (the one used on CUDA) on CPU."""
    monkeypatch.setattr(M, "_NUMPY_ON_CPU", False)


@pytest.fixture
def small_tiles(monkeypatch):
    """Several tiles, strips and pool prunings even on a few hundred items."""
    monkeypatch.setattr(M, "_DENSE_PER_CANDIDATE", 0)
    monkeypatch.setattr(M, "_TILE", 64)
    monkeypatch.setattr(M, "_STRIP", 16)
    monkeypatch.setattr(M, "_POOL_SLACK", 8)


def test_collapsed_embeddings_fall_back_to_the_exact_ranking(monkeypatch):
    """float32 cannot separate nearly collinear embeddings: no query is certified from the
    float32 search and all go to the float64 ranking, which still matches the naive loop."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 40, 600)
    x = (np.ones(64) + 1e-4 * rng.standard_normal((600, 64))).astype(np.float32)
    calls = spy(monkeypatch, "_rank_exactly")
    got, want = retrieval_metrics(x, y), naive_metrics(x, y)
    assert sum(len(c[1]) for c in calls) == int((np.bincount(y)[y] > 1).sum())
    for k in M.METRICS:
        assert got[k] == pytest.approx(want[k], abs=1e-12)


def test_nearly_collapsed_embeddings_use_every_certificate(monkeypatch):
    """Near-ties at the float32 resolution: some queries are certified from float32 alone, some
    after re-scoring their candidates in float64, some only with 4× more candidates."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 40, 600)
    x = (np.ones(8) + 1e-2 * rng.standard_normal((600, 8))).astype(np.float32)
    certify, wider = spy(monkeypatch, "_certify"), spy(monkeypatch, "_certify_wider")
    got, want = retrieval_metrics(x, y), naive_metrics(x, y)
    retried = sum(len(c[1]) for c in wider)
    rescored = sum(len(c[1]) for c in certify) - retried  # _certify_wider calls _certify
    assert 0 < retried < rescored < int((np.bincount(y)[y] > 1).sum())
    for k in M.METRICS:
        assert got[k] == pytest.approx(want[k], abs=1e-12)


def exact_copies(
    copies: int = 60, labels: int = 10, groups: int = 6
) -> tuple[np.ndarray, np.ndarray]:
    """Groups of identical vectors under random labels: exact ties everywhere."""
    rng = np.random.default_rng(1)
    centres = rng.standard_normal((groups, 16))
    x = np.repeat(centres, copies, axis=0).astype(np.float32)
    return x, rng.integers(0, labels, len(x))


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize(
    ("copies", "labels", "groups", "path"),
    [(60, 10, 6, "_certify_wider"), (120, 60, 4, "_rank_exactly")],
)
def test_exact_ties_go_to_the_lower_index(monkeypatch, normalize, copies, labels, groups, path):
    """More exact copies than R + 4 candidates: ties at the boundary cannot be certified; those
    queries get 4× more candidates, or (more copies still) are ranked over all items, and every
    tie goes to the lower index."""
    x, y = exact_copies(copies, labels, groups)
    calls = spy(monkeypatch, path)
    got, want = retrieval_metrics(x, y, normalize=normalize), naive_metrics(x, y, normalize)
    assert sum(len(c[1]) for c in calls) > 0
    for k in M.METRICS:
        assert got[k] == pytest.approx(want[k], abs=1e-12)


def test_near_ties_inside_the_top_r_are_resorted_in_float64(monkeypatch):
    """Duplicated items tie in float32 inside the top R while the boundary is clear: the fast
    certificate re-scores just those runs in float64 (ties by index), no full ranking needed."""
    x, y = clustered(40, 32, 4, spread=0.3, singletons=0)
    x, y = np.concatenate([x, x[::3]]), np.concatenate([y, y[::3]])  # a copy of every third
    pairs, full = spy(monkeypatch, "_pair_scores"), spy(monkeypatch, "_rank_exactly")
    got, want = retrieval_metrics(x, y), naive_metrics(x, y)
    assert sum(len(c[1]) for c in pairs) > 0
    assert sum(len(c[1]) for c in full) == 0
    for k in M.METRICS:
        assert got[k] == pytest.approx(want[k], abs=1e-12)


@pytest.mark.parametrize("normalize", [True, False])
def test_many_tiles_strips_and_prunings_give_the_naive_values(small_tiles, monkeypatch, normalize):
    """Upper-triangle tiles (each feeding its rows and its columns), a short last block, pools
    pruned all the time: the same values as the naive loop."""
    x, y = clustered(25, 24, 9, spread=1.2)  # ~350 items: 6 blocks of 64, the last one short
    x *= np.random.default_rng(1).uniform(0.5, 2.0, (len(x), 1)).astype(np.float32)
    prunes = spy(monkeypatch, "_certified_top_k")
    got, want = retrieval_metrics(x, y, normalize=normalize), naive_metrics(x, y, normalize)
    assert len(prunes) == -(-len(x) // 64)
    for k in M.METRICS:
        assert got[k] == pytest.approx(want[k], abs=1e-12)


def test_float32_overflow_ranks_everything_in_float64():
    """Unnormalised embeddings too large for float32 scores: the exact float64 ranking alone."""
    x, y = clustered(10, 8, 2)
    x = x.astype(np.float64) * 1e30
    got, want = retrieval_metrics(x, y, normalize=False), naive_metrics(x, y, normalize=False)
    for k in M.METRICS:
        assert got[k] == pytest.approx(want[k], abs=1e-12)


def test_torch_path_ties_at_the_candidate_boundary_fall_back_to_a_full_ranking(
    torch_path, monkeypatch
):
    """The torch path (CUDA): ties at the boundary of the float32 candidates cannot be
    certified, so those queries are ranked over all items (ties by index)."""
    x, y = exact_copies()
    calls = spy(monkeypatch, "_score64")
    got, want = retrieval_metrics(x, y), naive_metrics(x, y)
    assert any(c[2].shape[1] == len(x) for c in calls)  # the full float64 ranking ran
    for k in M.METRICS:
        assert got[k] == pytest.approx(want[k], abs=1e-12)


@pytest.mark.parametrize("normalize", [True, False])
def test_torch_path_equals_the_numpy_path(torch_path, monkeypatch, normalize):
    x, y = clustered(30, 48, 6)
    got = retrieval_metrics(x, y, normalize=normalize)
    monkeypatch.setattr(M, "_NUMPY_ON_CPU", True)
    assert got == pytest.approx(retrieval_metrics(x, y, normalize=normalize), abs=1e-12)


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


def test_against_pml_on_several_tiles():
    """~3,000 items in 128-D: two 2,048-row blocks, the off-diagonal tile read both ways."""
    x, y = clustered(200, 128, seed=5, spread=2.0, sizes=(2, 28))
    calc = AccuracyCalculator(
        include=("mean_average_precision_at_r", "precision_at_1", "r_precision"), k="max_bin_count"
    )
    ref = calc.get_accuracy(torch.nn.functional.normalize(torch.from_numpy(x)), torch.from_numpy(y))
    got = retrieval_metrics(x, y)
    assert len(x) > M._TILE and 0.05 < got["map_at_r"] < 0.95
    assert got["map_at_r"] == pytest.approx(ref["mean_average_precision_at_r"], abs=1e-6)
    assert got["precision_at_1"] == pytest.approx(ref["precision_at_1"], abs=1e-6)
    assert got["r_precision"] == pytest.approx(ref["r_precision"], abs=1e-6)


def test_torch_path_blocked_computation_equals_one_block(torch_path, monkeypatch):
    x, y = clustered(40, 32, 3)
    whole = retrieval_metrics(x, y)
    monkeypatch.setattr(M, "_BLOCK_BYTES", 4 * len(x) * 37)  # 37 queries per block
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
