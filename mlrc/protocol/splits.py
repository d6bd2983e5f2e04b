"""Class-disjoint splits of the metric-learning reality check (MLRC).

Classes are sorted by id. The first ⌊C/2⌋ classes are train+val, the remaining classes are the
test set, never seen during the search. The train+val classes are cut into `n_folds`
class-disjoint validation partitions; fold i validates on partition i and trains on the rest.

Two schemes:

- ``"kfold"``: contiguous blocks of the sorted train+val classes, exactly sklearn
  ``KFold(n_splits, shuffle=False)`` (the first ``N mod n`` blocks get one extra class).
  powerful-benchmarker's ``ClassDisjointSplitManager``.
- ``"mlrc"``: the wrap-around windows of powerful-benchmarker's ``MLRCSplitManager``, which the
  paper's published numbers used (notes/protocol-and-anchors.md §1.2). With N train+val classes,
  ``val_len = ⌊N/n⌋`` and ``train_len = N − val_len``; fold p starts at ``s = int(p/n · N)``,
  trains on the window ``[s, s + train_len)`` and validates on the next ``val_len`` classes, all
  indices modulo N. When n does not divide N some classes are never validated
  (Cars196: 24 and 73). For an even total class count this is the reference exactly; for an odd
  count the reference's train window is one class longer and overlaps validation by one class,
  which breaks class-disjointness, so here train is always the other N − val_len classes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

SCHEMES = ("kfold", "mlrc")


class SplitError(ValueError):
    """The classes cannot be split as asked (too few classes, unknown scheme)."""


@dataclass(frozen=True)
class Fold:
    """One fold: class ids (not sample indices) used for training and validation."""

    index: int
    train_classes: tuple[int, ...]
    val_classes: tuple[int, ...]


@dataclass(frozen=True)
class Split:
    """The whole MLRC split of one dataset's classes (class ids, sorted ascending)."""

    trainval_classes: tuple[int, ...]
    test_classes: tuple[int, ...]
    folds: tuple[Fold, ...]
    scheme: str

    def summary(self) -> str:
        """A one-paragraph human summary with class ranges per fold."""
        lines = [
            f"{len(self.trainval_classes)} train+val classes, {len(self.test_classes)} test "
            f"classes, {len(self.folds)} folds (scheme {self.scheme!r})"
        ]
        for f in self.folds:
            lines.append(
                f"  fold {f.index}: train {len(f.train_classes)} classes, "
                f"val {len(f.val_classes)} classes {_ranges(f.val_classes)}"
            )
        return "\n".join(lines)


def mlrc_split(
    labels: Iterable[int] | np.ndarray, n_folds: int = 4, scheme: str = "kfold"
) -> Split:
    """Split the classes present in ``labels`` as the MLRC protocol does.

    ``labels`` may be per-sample labels or the list of class ids; only the set of distinct ids
    matters. Deterministic: no randomness anywhere.
    """
    if scheme not in SCHEMES:
        raise SplitError(f"unknown split scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")
    if n_folds < 2:
        raise SplitError(f"n_folds must be at least 2, got {n_folds}")
    classes = np.unique(np.asarray(list(labels) if not isinstance(labels, np.ndarray) else labels))
    C = len(classes)
    n_trainval = C // 2  # first ⌊C/2⌋ classes: train+val; the rest: test
    if n_trainval // n_folds < 2:
        raise SplitError(
            f"{n_trainval} train+val classes are too few for {n_folds} folds: every fold needs "
            f"at least 2 validation classes ({2 * n_folds} train+val classes, {4 * n_folds} in all)"
        )
    trainval, test = classes[:n_trainval], classes[n_trainval:]
    windows = (
        _kfold_windows(n_trainval, n_folds)
        if scheme == "kfold"
        else _mlrc_windows(n_trainval, n_folds)
    )
    folds = [
        Fold(p, tuple(int(c) for c in trainval[tr]), tuple(int(c) for c in trainval[va]))
        for p, (tr, va) in enumerate(windows)
    ]
    return Split(
        trainval_classes=tuple(int(c) for c in trainval),
        test_classes=tuple(int(c) for c in test),
        folds=tuple(folds),
        scheme=scheme,
    )


def _kfold_windows(N: int, n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """sklearn KFold(n, shuffle=False): block p has ⌊N/n⌋ (+1 for the first N mod n) items."""
    sizes = np.full(n, N // n)
    sizes[: N % n] += 1
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    idx = np.arange(N)
    return [
        (np.setdiff1d(idx, idx[bounds[p] : bounds[p + 1]]), idx[bounds[p] : bounds[p + 1]])
        for p in range(n)
    ]


def _mlrc_windows(N: int, n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """MLRCSplitManager: wrap-around train window from int(p/n·N), val window right after it."""
    val_len = N // n
    train_len = N - val_len
    out = []
    for p in range(n):
        s = int(p / n * N)
        train_idx = np.sort((s + np.arange(train_len)) % N)
        val_idx = np.sort((s + train_len + np.arange(val_len)) % N)
        out.append((train_idx, val_idx))
    return out


def _ranges(ids: Iterable[int]) -> str:
    """Compact ranges, e.g. (0, 1, 2, 7, 8) → '0–2, 7–8'."""
    ids = sorted(ids)
    parts, start, prev = [], None, None
    for c in ids:
        if start is None:
            start = prev = c
        elif c == prev + 1:
            prev = c
        else:
            parts.append(f"{start}–{prev}" if prev != start else f"{start}")
            start = prev = c
    if start is not None:
        parts.append(f"{start}–{prev}" if prev != start else f"{start}")
    return ", ".join(parts)
