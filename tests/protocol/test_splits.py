"""MLRC splits: exact published windows, sklearn KFold equivalence, properties, errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.model_selection import KFold

from mlrc.protocol.splits import SplitError, mlrc_split


def _rng(a: int, b: int) -> set[int]:
    return set(range(a, b + 1))


@pytest.mark.parametrize(
    ("num_classes", "trainval", "val_windows"),
    [
        # notes/protocol-and-anchors.md §1.2, from powerful-benchmarker's MLRCSplitManager
        (200, 100, [_rng(75, 99), _rng(0, 24), _rng(25, 49), _rng(50, 74)]),  # CUB-200
        (196, 98, [_rng(74, 97), _rng(0, 23), _rng(25, 48), _rng(49, 72)]),  # Cars196
        (
            22634,
            11317,
            [_rng(8488, 11316), _rng(0, 2828), _rng(2829, 5657), _rng(5658, 8486)],
        ),  # SOP
    ],
)
def test_mlrc_scheme_reproduces_published_windows(num_classes, trainval, val_windows):
    s = mlrc_split(np.arange(num_classes), scheme="mlrc")
    assert s.trainval_classes == tuple(range(trainval))
    assert s.test_classes == tuple(range(trainval, num_classes))
    for fold, expected_val in zip(s.folds, val_windows, strict=True):
        assert set(fold.val_classes) == expected_val
        assert set(fold.train_classes) == set(range(trainval)) - expected_val


def test_mlrc_scheme_never_validates_cars_classes_24_and_73():
    s = mlrc_split(range(196), scheme="mlrc")
    validated = set().union(*(f.val_classes for f in s.folds))
    assert set(range(98)) - validated == {24, 73}


def test_mlrc_scheme_matches_the_reference_windowing_rule():
    """Independent re-statement of MLRCSplitManager (lengths from the total class count C).

    For odd C the reference's train window is one class longer and overlaps validation (its
    own disjointness assertion would fail); there we require the disjoint complement instead.
    """
    for C in (16, 17, 50, 99, 200, 201, 1000):
        n_tv = int(C * 0.5)
        val_len = int(C * (1 / 4) * 0.5)
        train_len = C - n_tv - val_len if C % 2 == 0 else n_tv - val_len
        s = mlrc_split(range(C), scheme="mlrc")
        for p, fold in enumerate(s.folds):
            start = int(p / 4 * n_tv)
            train = {(start + i) % n_tv for i in range(train_len)}
            val = {(start + train_len + i) % n_tv for i in range(val_len)}
            assert set(fold.train_classes) == train and set(fold.val_classes) == val


@pytest.mark.parametrize(
    ("C", "n_folds"), [(8, 2), (9, 2), (12, 3), (31, 3), (16, 4), (33, 4), (200, 4), (201, 4)]
)
def test_kfold_scheme_is_sklearn_kfold_without_shuffle(C, n_folds):
    s = mlrc_split(range(C), n_folds=n_folds, scheme="kfold")
    trainval = np.arange(C // 2)
    for fold, (tr, va) in zip(
        s.folds, KFold(n_splits=n_folds, shuffle=False).split(trainval), strict=True
    ):
        assert fold.train_classes == tuple(trainval[tr]) and fold.val_classes == tuple(trainval[va])


def test_classes_are_sorted_by_id_and_per_sample_labels_work():
    labels = np.array([7, 3, 3, 11, 5, 1, 9, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31] * 2)
    s = mlrc_split(labels)
    ids = sorted(set(labels.tolist()))
    assert s.trainval_classes == tuple(ids[: len(ids) // 2])
    assert s.test_classes == tuple(ids[len(ids) // 2 :])


@settings(max_examples=150, deadline=None)
@given(
    ids=st.sets(st.integers(0, 10_000), min_size=8, max_size=300),
    n_folds=st.integers(2, 6),
    scheme=st.sampled_from(["kfold", "mlrc"]),
)
def test_split_properties(ids, n_folds, scheme):
    try:
        s = mlrc_split(sorted(ids, reverse=True), n_folds=n_folds, scheme=scheme)
    except SplitError:
        assert len(ids) // 2 // n_folds < 2
        return
    ordered = sorted(ids)
    trainval, test = set(s.trainval_classes), set(s.test_classes)
    assert trainval | test == ids and not trainval & test
    assert s.trainval_classes == tuple(ordered[: len(ids) // 2])
    vals = [set(f.val_classes) for f in s.folds]
    for f in s.folds:
        tr, va = set(f.train_classes), set(f.val_classes)
        assert not tr & va and not (tr | va) & test  # class-disjoint, test never seen
        assert tr | va <= trainval and len(va) >= 2 and len(tr) >= 2
    for i in range(len(vals)):  # validation partitions pairwise disjoint
        for j in range(i + 1, len(vals)):
            assert not vals[i] & vals[j]
    if scheme == "kfold":  # KFold validates every train+val class exactly once
        assert set().union(*vals) == trainval
        assert all(set(f.train_classes) | set(f.val_classes) == trainval for f in s.folds)
    assert mlrc_split(ordered, n_folds=n_folds, scheme=scheme) == s  # deterministic


@pytest.mark.parametrize(
    ("classes", "n_folds", "message"),
    [
        (7, 4, r"^4 folds need at least 16 classes: 8 train\+val .*; found 7 \(3 train\+val\)$"),
        (8, 4, r"^4 folds need at least 16 classes: 8 train\+val .*; found 8 \(4 train\+val\)$"),
        (15, 4, r"^4 folds need at least 16 classes: .*; found 15 \(7 train\+val\)$"),
        (
            31,
            8,
            r"^8 folds need at least 32 classes: 16 train\+val .*; found 31 \(15 train\+val\)$",
        ),
    ],
)
def test_too_few_classes_is_a_clear_error(classes, n_folds, message):
    with pytest.raises(SplitError, match=message):
        mlrc_split(range(classes), n_folds=n_folds, scheme="kfold")


def test_unknown_scheme_is_a_clear_error():
    with pytest.raises(SplitError, match="unknown split scheme 'random'"):
        mlrc_split(range(100), scheme="random")
