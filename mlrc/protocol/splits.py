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

``"traditional"`` is not a cross-validation scheme: the seed papers' own tables train one model on
every train+val class and watch it on the test classes, so its single fold (index 0) trains on
train+val and "validates" on the test classes — test-set selection, which the reality check
criticises and a report marks as such (:func:`traditional_fold`).

:func:`custom_split` builds the same :class:`Split` from given test classes and either given
validation classes per fold or one of the schemes over the other classes (a study's ``split:``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

SCHEMES = ("kfold", "mlrc", "traditional")


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
    scheme: str  # "kfold", "mlrc", or "given" (validation classes listed per fold)
    origin: str = ""  # where the test classes come from; "": the second half of the classes

    def summary(self) -> str:
        """A one-paragraph human summary with class ranges per fold."""
        if self.scheme == "traditional":
            return (
                f"{len(self.trainval_classes)} train classes, {len(self.test_classes)} test "
                "classes, no folds (scheme 'traditional'): one model trains on every train "
                "class and is validated on the test classes (test-set selection)"
                + (
                    f"\n  test: {_ranges(self.test_classes)} (from {self.origin})"
                    if self.origin
                    else ""
                )
            )
        lines = [
            f"{len(self.trainval_classes)} train+val classes, {len(self.test_classes)} test "
            f"classes, {len(self.folds)} folds (scheme {self.scheme!r})"
        ]
        if self.origin:
            lines.append(f"  test: {_ranges(self.test_classes)} (from {self.origin})")
        for f in self.folds:
            lines.append(
                f"  fold {f.index}: train {len(f.train_classes)} classes, "
                f"val {len(f.val_classes)} classes {_ranges(f.val_classes)}"
            )
        if self.origin:
            validated = {c for f in self.folds for c in f.val_classes}
            never = [c for c in self.trainval_classes if c not in validated]
            if never:
                lines.append(f"  never validated (train in every fold): {_ranges(never)}")
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
    classes = np.unique(np.asarray(list(labels) if not isinstance(labels, np.ndarray) else labels))
    C = len(classes)
    n_trainval = C // 2  # first ⌊C/2⌋ classes: train+val; the rest: test
    if scheme == "traditional":
        if n_trainval < 2:
            raise SplitError(
                f"the traditional split needs at least 4 classes (2 to train, 2 to test); found {C}"
            )
        return traditional_split(classes[:n_trainval], classes[n_trainval:])
    if n_folds < 2:
        raise SplitError(f"n_folds must be at least 2, got {n_folds}")
    if n_trainval // n_folds < 2:
        raise SplitError(
            f"{n_folds} folds need at least {4 * n_folds} classes: {2 * n_folds} train+val "
            f"(2 validation classes per fold) and as many to test; found {C} "
            f"({n_trainval} train+val)"
        )
    trainval, test = classes[:n_trainval], classes[n_trainval:]
    return Split(
        trainval_classes=tuple(int(c) for c in trainval),
        test_classes=tuple(int(c) for c in test),
        folds=_scheme_folds(trainval, n_folds, scheme),
        scheme=scheme,
    )


def traditional_split(trainval: Iterable[int], test: Iterable[int], origin: str = "") -> Split:
    """The traditional protocol's split: one fold (index 0) training on every train+val class
    and validating on the test classes (:func:`traditional_fold`)."""
    trainval, test = tuple(int(c) for c in trainval), tuple(int(c) for c in test)
    return Split(trainval, test, (traditional_fold(trainval, test),), "traditional", origin)


def traditional_fold(trainval: tuple[int, ...], test: tuple[int, ...]) -> Fold:
    """Fold 0 of the traditional protocol: train = train+val, validation = test (leakage)."""
    return Fold(0, trainval, test)


def _scheme_folds(trainval: np.ndarray, n_folds: int, scheme: str) -> tuple[Fold, ...]:
    """The folds of ``scheme`` over the sorted train+val class ids."""
    n = len(trainval)
    windows = _kfold_windows(n, n_folds) if scheme == "kfold" else _mlrc_windows(n, n_folds)
    return tuple(
        Fold(p, tuple(int(c) for c in trainval[tr]), tuple(int(c) for c in trainval[va]))
        for p, (tr, va) in enumerate(windows)
    )


def custom_split(
    labels: Iterable[int] | np.ndarray,
    test_classes: Iterable[int],
    val_classes: Iterable[Iterable[int]] | None = None,
    n_folds: int = 4,
    scheme: str = "mlrc",
    origin: str = "a split file",
) -> Split:
    """A split with the given test classes; train+val = every other class in ``labels``.

    ``val_classes``: the validation classes of each fold (a fold trains on the other train+val
    classes; a class in no list trains in every fold, as MLRC's Cars196 classes 24 and 73);
    ``None``: ``scheme`` cuts the sorted train+val classes into ``n_folds`` folds as
    :func:`mlrc_split` does. Class-disjointness, ≥ 2 test classes, ≥ 2 folds and ≥ 2 validation
    classes per fold are checked (:class:`SplitError`, messages with class ids)."""
    classes = np.unique(np.asarray(list(labels) if not isinstance(labels, np.ndarray) else labels))
    known = {int(c) for c in classes}
    test = _distinct("test", test_classes, known)
    if len(test) < 2:
        raise SplitError(f"the test set needs at least 2 classes, got {len(test)}")
    trainval = np.array([c for c in classes if int(c) not in test], dtype=classes.dtype)
    if scheme == "traditional":
        if val_classes is not None:
            raise SplitError("the traditional scheme has no folds: give the test classes only")
        if len(trainval) < 2:
            raise SplitError(f"the training set needs at least 2 classes, got {len(trainval)}")
        return traditional_split(trainval, sorted(test), origin)
    if val_classes is None:
        folds = _cut_folds(trainval, n_folds, scheme)
    else:
        folds = _given_folds(trainval, test, val_classes, known)
        scheme = "given"
    return Split(
        trainval_classes=tuple(int(c) for c in trainval),
        test_classes=tuple(sorted(test)),
        folds=folds,
        scheme=scheme,
        origin=origin,
    )


def _cut_folds(trainval: np.ndarray, n_folds: int, scheme: str) -> tuple[Fold, ...]:
    """``n_folds`` folds cut from the sorted train+val classes by ``scheme``, checked."""
    if scheme not in SCHEMES:
        raise SplitError(f"unknown split scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")
    if n_folds < 2:
        raise SplitError(f"at least 2 folds are needed, got {n_folds}")
    if len(trainval) // n_folds < 2:
        raise SplitError(
            f"{n_folds} folds need at least {2 * n_folds} train+val classes (2 validation "
            f"classes per fold); found {len(trainval)}"
        )
    return _scheme_folds(trainval, n_folds, scheme)


def _given_folds(
    trainval: np.ndarray,
    test: set[int],
    val_classes: Iterable[Iterable[int]],
    known: set[int],
) -> tuple[Fold, ...]:
    """The folds of given validation classes: each fold trains on the other train+val classes;
    ≥ 2 folds, ≥ 2 validation classes per fold, no class in two places."""
    vals = [_distinct(f"fold {k}", v, known) for k, v in enumerate(val_classes)]
    if len(vals) < 2:
        raise SplitError(f"at least 2 folds are needed, got {len(vals)}")
    seen: dict[int, str] = dict.fromkeys(test, "the test set")
    for k, val in enumerate(vals):
        if len(val) < 2:
            raise SplitError(
                f"fold {k} has {len(val)} validation class(es); every fold needs at least 2"
            )
        for c in sorted(val):
            if c in seen:
                raise SplitError(f"class {c} is in fold {k} and in {seen[c]}")
            seen[c] = f"fold {k}"
    return tuple(
        Fold(k, tuple(int(c) for c in trainval if int(c) not in val), tuple(sorted(val)))
        for k, val in enumerate(vals)
    )


def _distinct(where: str, ids: Iterable[int], known: set[int]) -> set[int]:
    """``ids`` as a set; a repeated or unknown id is a :class:`SplitError`."""
    out: set[int] = set()
    for c in ids:
        c = int(c)
        if c not in known:
            raise SplitError(f"{where}: class {c} is not in the dataset")
        if c in out:
            raise SplitError(f"{where}: class {c} is listed twice")
        out.add(c)
    return out


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
