"""A study's ``split:``: the dataset's own train/test lists (``predefined``), a split file, or
a split file's content inline (as ``mlrc study export`` writes it).

A split file (YAML or JSON) names classes by the dataset's class names (``class_names``; a YAML
integer such as ``7`` means the class named ``"7"``, never label 7)::

    test: [A, B, C, ...]          # the test classes (≥ 2)
    folds: [[a, b], [c, d], ...]  # the validation classes of each fold (≥ 2 folds, ≥ 2 each)

or, instead of fold lists, ``scheme: mlrc | kfold`` (default: the preset's ``split_scheme``)
and optionally ``folds: N`` (default: the preset's ``folds``) to cut the other classes into
folds as :func:`mlrc.protocol.mlrc_split` cuts the first half. Train+val is every class not in
``test``; a fold trains on the train+val classes it does not validate on.

:func:`resolve_split` reads and checks the file when a study is resolved (everything that does
not need the dataset: format, class names listed twice, overlaps, counts) and returns a
:class:`ResolvedSplit`, which is part of the study's identity; :func:`build_split` checks it
against the dataset (every name known) and returns the :class:`~mlrc.protocol.splits.Split`.
Every mistake is one :class:`ConfigError` line: ``study.yaml: split: FILE: what is wrong``.

A dataset with query/gallery roles (``ImageDataset.roles``: In-Shop, an image folder with
``query/`` and ``gallery/``) tests the classes of its query and gallery images whatever the
split (:func:`role_test_classes`): without ``split:`` they replace MLRC's second half, and a
split file's ``test`` must list exactly them; its other classes are cut into folds as usual.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from mlrc.config.load import ConfigError, did_you_mean, load_yaml, validate_model
from mlrc.config.schema import Strict
from mlrc.protocol.splits import SCHEMES, Split, SplitError, custom_split, mlrc_split

if TYPE_CHECKING:
    from mlrc.data.base import ImageDataset

PREDEFINED = "predefined"

# Datasets with train/test class lists of their own, and what those are.
PREDEFINED_LISTS = {
    "cub200": "classes 001–100 train, 101–200 test (the class-level split of the DML papers)",
    "cars196": "classes 1–98 train, 99–196 test (the class-level split of the DML papers)",
    "sop": "the classes of Ebay_train.txt (1–11318) train, of Ebay_test.txt (11319–22634) test",
    "inshop": "the train items train, the query and gallery items test",
}


def _class_name(value: Any) -> str:
    """A class name as written: a string, or an integer meaning the name it prints as."""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise ValueError(f"a class name must be a string, got {value!r}")


class SplitFile(Strict):
    """The content of a split file (see the module's docstring)."""

    test: list[Any]
    folds: list[list[Any]] | int | None = None
    scheme: Literal["kfold", "mlrc"] | None = None

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        """An unknown key first (a misspelt ``test`` is not "test: Field required")."""
        if isinstance(data, dict):
            for key in data:
                if key not in cls.model_fields:
                    raise ValueError(f"unknown key {key!r}{did_you_mean(key, cls.model_fields)}")
        return data

    @field_validator("test")
    @classmethod
    def _test_names(cls, v: list[Any]) -> list[str]:
        return [_class_name(x) for x in v]

    @field_validator("folds", mode="before")
    @classmethod
    def _fold_names(cls, v: Any) -> Any:
        if isinstance(v, bool):
            raise ValueError("expected a list of validation class lists or a number of folds")
        if isinstance(v, list):
            if not all(isinstance(f, list) for f in v):
                raise ValueError("expected a list of validation class lists, one per fold")
            return [[_class_name(x) for x in f] for f in v]
        return v

    @model_validator(mode="after")
    def _one_way(self) -> SplitFile:
        if isinstance(self.folds, list) and self.scheme is not None:
            raise ValueError("give either folds as validation class lists or a scheme, not both")
        return self


class ResolvedSplit(Strict):
    """A study's split as it defines the numbers: the test classes (names, sorted, or
    ``"predefined"``) and the folds (validation class names per fold, each sorted, or a
    number of folds for ``scheme``). Where the file is (``file``) is not part of it."""

    test: list[str] | Literal["predefined"]
    folds: list[list[str]] | int
    scheme: Literal["kfold", "mlrc", "traditional"] | None = None
    file: str | None = Field(None, exclude=True)  # the split file as written, for messages


def resolve_split(
    value: str | dict[str, Any] | None,
    dataset: str,
    n_folds: int,
    scheme: str,
    where: str = "study: split",
    base: Path | None = None,
) -> ResolvedSplit | None:
    """``split:`` of a study (None, ``predefined``, a file path, relative to ``base``: the
    study file's folder, or a file's content inline) read and checked as far as it can be
    without the dataset; ``n_folds`` and ``scheme`` are the defaults (the preset's ``folds``
    and ``split_scheme``). Errors start with ``where`` (``"study.yaml: split"``)."""
    if value is None:
        return None
    if scheme not in SCHEMES:
        raise ConfigError(f"{where}: unknown scheme {scheme!r}")
    if isinstance(value, dict):  # inline (an exported study file carries its split so)
        return _resolve_content(value, n_folds, scheme, where, None)
    if not value:
        raise ConfigError(f"{where}: expected 'predefined' or a split file's path, got ''")
    if value == PREDEFINED:
        if dataset not in PREDEFINED_LISTS:
            raise ConfigError(
                f"{where}: predefined: dataset {dataset!r} has no train/test lists of its "
                f"own (only {', '.join(PREDEFINED_LISTS)} have); give a split file instead"
            )
        return ResolvedSplit(test=PREDEFINED, folds=n_folds, scheme=scheme)  # type: ignore[arg-type]
    path = Path(value).expanduser()
    if not path.is_absolute():
        path = (base if base is not None else Path.cwd()) / path
    where = f"{where}: {value}"
    if not path.is_file():
        raise ConfigError(f"{where}: no such file (looked for {path.resolve()})")
    try:
        data = _load_json(path) if path.suffix.lower() == ".json" else load_yaml(path)
    except ConfigError as e:  # "<path>: problem" → "study: split: <value>: problem"
        raise ConfigError(f"{where}: {str(e).removeprefix(f'{path}: ')}") from None
    return _resolve_content(data, n_folds, scheme, where, value)


def _resolve_content(
    data: Any, n_folds: int, scheme: str, where: str, file: str | None
) -> ResolvedSplit:
    """A split file's content checked (everything but the class names) and resolved."""
    spec = validate_model(SplitFile, data, where)
    if scheme == "traditional":  # the preset's: one model, validated on the test classes
        if spec.folds is not None or spec.scheme is not None:
            raise ConfigError(
                f"{where}: the traditional preset has no folds: give the test classes only"
            )
        _check_lists(spec.test, [], where)
        return ResolvedSplit(test=sorted(spec.test), folds=1, scheme="traditional", file=file)
    if isinstance(spec.folds, list):
        _check_lists(spec.test, spec.folds, where)
        folds: list[list[str]] | int = [sorted(f) for f in spec.folds]
    else:
        _check_lists(spec.test, [], where)
        folds = spec.folds if spec.folds is not None else n_folds
        if folds < 2:
            raise ConfigError(f"{where}: folds: at least 2 folds are needed, got {folds}")
    return ResolvedSplit(
        test=sorted(spec.test),
        folds=folds,
        scheme=None if isinstance(folds, list) else (spec.scheme or scheme),  # type: ignore[arg-type]
        file=file,
    )


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes())
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"{path}: line {e.lineno}, column {e.colno}: malformed JSON ({e.msg})"
        ) from None


def _check_lists(test: list[str], folds: list[list[str]], where: str) -> None:
    """Counts and disjointness of the named classes: ≥ 2 test classes, ≥ 2 folds of ≥ 2
    validation classes each, no class named twice (within a list or across lists)."""
    if len(test) < 2:
        raise ConfigError(f"{where}: test: the test set needs at least 2 classes, got {len(test)}")
    if folds and len(folds) < 2:
        raise ConfigError(f"{where}: folds: at least 2 folds are needed, got {len(folds)}")
    seen: dict[str, str] = {}
    for part, names in [("test", test), *((f"folds.{k}", f) for k, f in enumerate(folds))]:
        if part != "test" and len(names) < 2:
            raise ConfigError(
                f"{where}: {part}: every fold needs at least 2 validation classes, got {len(names)}"
            )
        for name in names:
            if name in seen:
                also = "listed twice" if seen[name] == part else f"also in {seen[name]}"
                raise ConfigError(f"{where}: {part}: class {name!r} is {also}")
            seen[name] = part


def predefined_test_classes(ds: ImageDataset) -> list[int]:
    """The test class ids of the dataset's own train/test lists (:data:`PREDEFINED_LISTS`);
    a ValueError when the dataset has none or its classes do not fit them."""
    names = ds.class_names
    if ds.name == "cub200":
        numbers = [n.split(".", 1)[0] for n in names]
        if not all(x.isdigit() for x in numbers):
            bad = next(n for n, x in zip(names, numbers, strict=True) if not x.isdigit())
            raise ValueError(f"cub200: class folder {bad!r} does not start with its number")
        return [c for c, x in enumerate(numbers) if int(x) > 100]
    if ds.name == "cars196":
        if ds.num_classes != 196:  # labels are the class ids 1..196 renumbered from 0
            raise ValueError(
                f"cars196: the predefined split needs 196 classes, got {ds.num_classes}"
            )
        return list(range(98, 196))
    if ds.name == "sop":
        return [c for c, n in enumerate(names) if n.isdigit() and int(n) > 11318]
    if ds.name == "inshop":
        test = role_test_classes(ds)
        if test is None:
            raise ValueError("inshop: the dataset has no train/query/gallery roles")
        return test
    raise ValueError(f"dataset {ds.name!r} has no train/test lists of its own")


def dataset_roles(ds: ImageDataset) -> np.ndarray | None:
    """The per-item roles (``train`` / ``query`` / ``gallery``) of ``ds``, or None without."""
    roles = getattr(ds, "roles", None)
    if roles is None:
        roles = getattr(ds, "partition", None)  # a dataset object of before roles
    return None if roles is None else np.asarray(roles, dtype=object).astype(str)


def role_test_classes(ds: ImageDataset) -> list[int] | None:
    """The test classes of a query/gallery dataset: the classes of its ``query`` and ``gallery``
    items (sorted); None for a dataset without roles. A class with training images and
    query/gallery images is a ValueError: a class-disjoint split cannot place it."""
    roles = dataset_roles(ds)
    if roles is None:
        return None
    labels = np.asarray(ds.labels)
    tested = roles != "train"
    both = np.intersect1d(labels[tested], labels[~tested])
    if len(both):
        c = int(both[0])
        origins = getattr(ds, "origins", None) or [f"{ds.name}[{i}]" for i in range(len(labels))]
        i = int(np.flatnonzero((labels == c) & ~tested)[0])
        j = int(np.flatnonzero((labels == c) & tested)[0])
        more = f" (and {len(both) - 1} more such classes)" if len(both) > 1 else ""
        raise ValueError(
            f"{ds.name}: class {ds.class_names[c]!r} has training images ({origins[i]}) and "
            f"{roles[j]} images ({origins[j]}): a test class cannot train{more}"
        )
    return np.unique(labels[tested]).tolist()


def build_split(
    spec: ResolvedSplit | None,
    ds: ImageDataset,
    n_folds: int,
    scheme: str,
    where: str = "study: split",
) -> Split:
    """The :class:`Split` of ``ds``: MLRC's (``n_folds``, ``scheme``) when ``spec`` is None,
    else the study's split with every class name checked against the dataset (errors start
    with ``where``; a study's ``FILE: split`` names ``FILE: dataset`` when MLRC's split finds
    too few classes)."""
    if spec is None and dataset_roles(ds) is not None:
        return _role_split(ds, n_folds, scheme, where)
    if spec is None:
        try:
            return mlrc_split(ds.labels, n_folds=n_folds, scheme=scheme)
        except SplitError as e:  # too few classes: the study file's dataset and its folds
            source = where.removesuffix(": split")
            if source == where:  # the command line's (--split, --folds): as it is
                raise
            raise ConfigError(
                f"{source}: dataset: {ds.name} (preset.folds {n_folds}): {e}"
            ) from None
    if spec.test == PREDEFINED:
        where = f"{where}: {PREDEFINED}"
        try:
            test = predefined_test_classes(ds)
        except ValueError as e:
            raise ConfigError(f"{where}: {e}") from None
        val = None
        origin = f"{ds.name}'s own train/test lists"
    else:
        where = f"{where}: {spec.file}" if spec.file else where
        index = _name_index(ds, where)
        test = _labels(spec.test, index, ds, f"{where}: test")
        val = (
            [_labels(f, index, ds, f"{where}: folds.{k}") for k, f in enumerate(spec.folds)]
            if isinstance(spec.folds, list)
            else None
        )
        origin = spec.file or "the study file"
        _check_role_test(ds, test, f"{where}: test")
    try:
        return custom_split(
            ds.labels,
            test,
            val,
            n_folds=spec.folds if isinstance(spec.folds, int) else 0,
            scheme=spec.scheme or scheme,
            origin=origin,
        )
    except SplitError as e:
        raise ConfigError(f"{where}: {e}") from None


def _role_split(ds: ImageDataset, n_folds: int, scheme: str, where: str) -> Split:
    """The split of a query/gallery dataset without ``split:``: the classes of its query and
    gallery images test; the other classes are cut into folds by ``scheme`` (validation stays
    all against all among them). An error names where the roles come from, and ``where``'s
    study file (``FILE: dataset``) — not a ``split`` or ``--split`` nobody gave."""
    try:
        test = role_test_classes(ds)
        assert test is not None
        return custom_split(
            ds.labels,
            test,
            None,
            n_folds=n_folds,
            scheme=scheme,
            origin=f"the query/gallery images of {ds.name}",
        )
    except ValueError as e:  # SplitError included
        roles = f" (query/gallery roles from {getattr(ds, 'roles_source', None) or ds.name})"
        source = where.removesuffix(": split")
        prefix = "" if source == where else f"{source}: dataset: "  # the command line: no prefix
        raise ConfigError(f"{prefix}{e}{roles}") from None


def _check_role_test(ds: ImageDataset, test: list[int], where: str) -> None:
    """A split file's test classes on a query/gallery dataset: exactly the classes of its query
    and gallery images (a ConfigError line naming the first class that differs)."""
    try:
        expected = role_test_classes(ds)
    except ValueError as e:
        raise ConfigError(f"{where}: {e}") from None
    if expected is None:
        return
    extra, missing = sorted(set(test) - set(expected)), sorted(set(expected) - set(test))
    if extra:
        raise ConfigError(
            f"{where}: class {ds.class_names[extra[0]]!r} has no query or gallery image in "
            f"{ds.name}: its test classes are those of its query and gallery images"
        )
    if missing:
        raise ConfigError(
            f"{where}: class {ds.class_names[missing[0]]!r} has query or gallery images in "
            f"{ds.name} but is not listed: its test classes are those of its query and gallery "
            "images"
        )


def _name_index(ds: ImageDataset, where: str) -> dict[str, int]:
    index: dict[str, int] = {}
    for label, name in enumerate(ds.class_names):
        if name in index:
            raise ConfigError(
                f"{where}: {ds.name} has two classes named {name!r}; it cannot be split by name"
            )
        index[name] = label
    return index


def _labels(names: list[str], index: dict[str, int], ds: ImageDataset, where: str) -> list[int]:
    out = []
    for name in names:
        if name not in index:
            raise ConfigError(
                f"{where}: {name!r} is not a class of {ds.name}{did_you_mean(name, index)}"
            )
        out.append(index[name])
    return out
