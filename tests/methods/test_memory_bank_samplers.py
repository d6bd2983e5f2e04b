"""Memory-bank samplers (GC, D², DDM, FRD): checked against brute-force / independent computations."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import train_tiny_fold
from scipy import linalg
from scipy.spatial.distance import cdist, pdist

import mlrc.methods.samplers.memory_bank as mb
from mlrc.methods import samplers

NAMES = ["greedy_coreset", "d2_coreset", "distance_histogram_matching", "fid_matching"]


def _build(name, labels, bank=None, *, batch_size=8, m=2, iterations=5, seed=0, **params):
    s = samplers.build(
        name, labels=labels, batch_size=batch_size, m=m, iterations=iterations, seed=seed, **params
    )
    if bank is not None:
        s.set_bank(torch.as_tensor(bank, dtype=torch.float32))
    return s


def _check_spc(batch, labels, batch_size, m):
    assert len(batch) == batch_size
    assert all(0 <= i < len(labels) for i in batch)
    for g in range(0, batch_size, m):
        group = batch[g : g + m]
        assert len(set(labels[group].tolist())) == 1  # m items of one class
        if (labels == labels[group[0]]).sum() >= m:
            assert len(set(group)) == m  # distinct items when the class has enough


def test_registered_with_params():
    assert set(NAMES) <= set(samplers.available())
    assert samplers.params("greedy_coreset") == {"big_batch": 1024}
    assert samplers.params("d2_coreset") == {"big_batch": 1024}
    assert samplers.params("distance_histogram_matching") == {
        "big_batch": 1024,
        "candidates": 10,
        "bins": 50,
    }
    assert samplers.params("fid_matching") == {"big_batch": 1024, "candidates": 10}
    for name in NAMES:
        assert _build(name, np.repeat(np.arange(4), 2)).needs_bank


def test_greedy_coreset_on_a_line_takes_the_far_end_then_max_min():
    x = np.arange(10.0)[:, None]  # points 0..9 on a line, one class each
    labels = np.arange(10)
    s = _build("greedy_coreset", labels, x, batch_size=4, m=1, big_batch=1024)
    firsts = set()
    for _ in range(60):
        seeds = s.next_batch()
        firsts.add(seeds[0])
        assert seeds[1] == (0 if seeds[0] >= 5 else 9)  # the farther end
        # brute force: every next seed maximises the distance to its nearest earlier seed
        for j in range(2, 4):
            dmin = np.abs(x[:, 0][:, None] - x[seeds[:j], 0][None, :]).min(1)
            assert dmin[seeds[j]] == dmin.max()
    assert len(firsts) > 5  # the first seed is random


def test_greedy_coreset_covers_separated_clusters_and_is_max_min():
    rng = np.random.default_rng(0)
    centres = np.array([[0, 0], [100, 0], [0, 100], [100, 100]], dtype=float)
    bank = np.repeat(centres, 5, axis=0) + rng.normal(0, 1, (20, 2))
    labels = np.repeat(np.arange(4), 5)  # class = cluster
    s = _build("greedy_coreset", labels, bank, batch_size=8, m=2)
    for batch in s:
        _check_spc(batch, labels, 8, 2)
        assert sorted(labels[batch[0::2]].tolist()) == [0, 1, 2, 3]  # one seed per cluster

    # random bank, big batch = whole set: brute-force max-min check of every seed
    bank = rng.normal(size=(40, 3))
    labels = np.repeat(np.arange(20), 2)
    s = _build("greedy_coreset", labels, bank, batch_size=12, m=2, big_batch=1024, iterations=20)
    d2 = cdist(bank, bank, "sqeuclidean")
    for batch in s:
        seeds = batch[0::2]
        assert len(set(seeds)) == len(seeds)
        for j in range(1, len(seeds)):
            dmin = d2[:, seeds[:j]].min(1)
            assert np.isclose(dmin[seeds[j]], dmin.max())


def test_d2_seeding_frequencies_match_squared_distances():
    x = np.array([[0.0], [1.0], [3.0], [6.0]])
    labels = np.arange(4)
    s = _build("d2_coreset", labels, x, batch_size=2, m=1, iterations=4000, seed=3)
    pairs = np.array([b for b in s])
    first_freq = np.bincount(pairs[:, 0], minlength=4) / len(pairs)
    assert np.allclose(first_freq, 0.25, atol=0.04)
    d2 = (x - x.T) ** 2
    for f in range(4):  # conditional on the (random) first seed
        second = pairs[pairs[:, 0] == f, 1]
        freq = np.bincount(second, minlength=4) / len(second)
        assert np.allclose(freq, d2[f] / d2[f].sum(), atol=0.06), (f, freq)


def _capture(sampler):
    """Record the big batch and the candidates of every next_batch."""
    seen = []
    draw = sampler.draw

    def spy():
        out = draw()
        seen.append(out)
        return out

    sampler.draw = spy
    return seen


def _frechet_by_eigenvalues(a, b):
    mu = a.mean(0) - b.mean(0)
    ca, cb = np.cov(a.T), np.cov(b.T)
    ev = np.linalg.eigvals(ca @ cb).real
    return mu @ mu + np.trace(ca) + np.trace(cb) - 2 * np.sqrt(np.clip(ev, 0, None)).sum()


def test_fid_matching_picks_the_smallest_frechet_distance():
    rng = np.random.default_rng(1)
    labels = np.repeat(np.arange(12), 6)
    bank = rng.normal(size=(72, 3)) * rng.uniform(0.5, 2, size=(72, 1)) + labels[:, None] % 3
    s = _build("fid_matching", labels, bank, batch_size=12, m=3, big_batch=36, candidates=6)
    seen = _capture(s)
    for _ in range(8):
        batch = s.next_batch()
        _check_spc(batch, labels, 12, 3)
        big, cands = seen[-1]
        assert len(cands) == 6 and all(set(c) <= set(big) for c in cands)
        assert len(set(labels[big].tolist())) == 12  # SPC big batch: 36 // 3 distinct classes
        fids = [_frechet_by_eigenvalues(bank[big], bank[c]) for c in cands]
        assert batch == cands[int(np.argmin(fids))].tolist()
    a, b = bank[:30], bank[30:50]
    root = linalg.sqrtm(np.cov(a.T) @ np.cov(b.T)).real
    direct = ((a.mean(0) - b.mean(0)) ** 2).sum() + np.trace(np.cov(a.T) + np.cov(b.T) - 2 * root)
    assert mb.frechet_distance(a, b) == pytest.approx(direct, rel=1e-6)


def _disthist_cost_direct(big, cand, bins):
    """The reference cost, written out independently: W1 as ∫|CDF_h − CDF_h*| on the bins."""
    db, dc = pdist(big), pdist(cand)
    lo, hi = db.min(), db.max()
    hb = np.histogram(db, bins=bins, range=(lo, hi))[0].astype(float)
    hc = np.histogram(np.clip(dc, lo, hi), bins=bins, range=(lo, hi))[0].astype(float)
    hb, hc = hb / hb.sum(), hc / hc.sum()
    w1 = np.abs(np.cumsum(hb) - np.cumsum(hc))[:-1].sum() * (hi - lo) / bins
    mu = np.linalg.norm(big.mean(0) - cand.mean(0))
    sd = np.linalg.norm(big.std(0) - cand.std(0))
    return mu + sd + 75 * 2 * w1


def test_distance_histogram_cost_and_choice():
    rng = np.random.default_rng(2)
    big, cand = rng.normal(size=(50, 5)), rng.normal(size=(12, 5)) * 1.3
    for bins in (1, 7, 50):
        assert mb.disthist_cost(big, cand, bins) == pytest.approx(
            _disthist_cost_direct(big, cand, bins), rel=1e-9
        )

    labels = np.repeat(np.arange(10), 5)
    bank = rng.normal(size=(50, 4)) + labels[:, None] % 4
    s = _build(
        "distance_histogram_matching", labels, bank, batch_size=8, m=2, big_batch=20, bins=20
    )
    seen = _capture(s)
    for _ in range(8):
        batch = s.next_batch()
        _check_spc(batch, labels, 8, 2)
        big_idx, cands = seen[-1]
        assert len(cands) == 10
        costs = [_disthist_cost_direct(bank[big_idx], bank[c], 20) for c in cands]
        assert batch == cands[int(np.argmin(costs))].tolist()


@pytest.mark.parametrize("name", NAMES)
def test_spc_structure_and_small_classes(name):
    rng = np.random.default_rng(4)
    sizes = [1, 2, 3, 4, 5, 6, 7, 8] * 3  # some classes smaller than m = 4
    labels = np.repeat(np.arange(len(sizes)), sizes)
    bank = rng.normal(size=(len(labels), 6))
    for big_batch in (16, 48, 10_000):  # 10 000 > training set: the whole set
        s = _build(name, labels, bank, batch_size=16, m=4, iterations=15, big_batch=big_batch)
        for batch in s:
            _check_spc(batch, labels, 16, 4)
            if name in ("distance_histogram_matching", "fid_matching"):
                assert len(set(labels[batch].tolist())) == 4  # distinct candidate classes


@pytest.mark.parametrize("name", NAMES)
def test_bank_update_state_and_errors(name):
    labels = np.repeat(np.arange(6), 4)
    bank = np.random.default_rng(5).normal(size=(24, 3)).astype(np.float32)
    s = _build(name, labels, batch_size=8, m=2, big_batch=12)
    with pytest.raises(RuntimeError, match="set_bank"):
        s.next_batch()
    with pytest.raises(ValueError, match="one embedding row per training item"):
        s.set_bank(torch.zeros(23, 3))
    s.set_bank(torch.from_numpy(bank))
    bank[0] = 99  # the sampler keeps its own copy
    assert s.bank[0, 0] != 99
    s.update(torch.tensor([3, 7]), torch.full((2, 3), 5.0))
    assert np.all(s.bank[[3, 7]] == 5.0) and np.all(s.bank[[2, 4]] != 5.0)

    b = _build(name, labels, s.bank, batch_size=8, m=2, big_batch=12, seed=9)
    [s.next_batch() for _ in range(3)]
    state = s.state()
    rest = [s.next_batch() for _ in range(4)]
    b.set_state(state)
    assert [b.next_batch() for _ in range(4)] == rest

    with pytest.raises(ValueError, match="big_batch"):
        _build(name, labels, big_batch=1)


def test_fewer_classes_than_a_batch_uses_them_all():
    labels = np.repeat(np.arange(3), 5)
    bank = np.random.default_rng(6).normal(size=(15, 2))
    for name in NAMES:
        with pytest.warns(UserWarning, match="using all 3 classes"):
            s = _build(name, labels, bank, batch_size=16, m=4, big_batch=8)
        for batch in s:
            _check_spc(batch, labels, 12, 4)


@pytest.mark.parametrize("name", NAMES)
def test_each_memory_bank_sampler_trains_a_fold(name, glyphs_ds, tmp_path, monkeypatch):
    updates = []
    update = mb.MemoryBankSampler.update
    monkeypatch.setattr(
        mb.MemoryBankSampler,
        "update",
        lambda self, i, e: (updates.append(len(i)), update(self, i, e))[1],
    )
    res = train_tiny_fold(
        glyphs_ds, tmp_path, iterations=2, sampler=name, sampler_params={"big_batch": 64}
    )
    assert res.status == "complete"
    assert len(updates) == 2 and all(u == 32 for u in updates)  # the cpu preset's batch
