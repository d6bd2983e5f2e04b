"""Custom splits (a study's ``split:``): the split file's format and checks, ``predefined``, the
study's identity, ``mlrc data summary --split`` and a study that runs on a split file.

Expected splits are written here from explicit class lists, and the scheme rules are re-derived
naively from the protocol note (notes/protocol-and-anchors.md §1.2), never from mlrc_split."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from mlrc import data
from mlrc.cli import app
from mlrc.config import ConfigError, StudyConfig, load_study, resolve, validate_model
from mlrc.config.identity import artifact_key, artifact_scope
from mlrc.config.splits import build_split, resolve_split

runner = CliRunner()
TINY = {
    "iterations_per_epoch": 3,
    "max_epochs": 2,
    "validate_every": {"default": 1},
    "patience": {"default": 5},
}


@pytest.fixture(scope="module")
def glyphs():
    return data.build("glyphs")


@pytest.fixture(scope="module")
def names(glyphs) -> list[str]:
    return list(glyphs.class_names)


def write(path: Path, doc: object) -> Path:
    if path.suffix == ".json":
        path.write_text(json.dumps(doc, ensure_ascii=False))
    else:
        path.write_text(yaml.safe_dump(doc, allow_unicode=True))
    return path


def study_doc(name: str = "cs", **extra) -> dict:
    return {
        "name": name,
        "dataset": {"name": "glyphs"},
        "preset": "cpu",
        "loss": {"name": "contrastive"},
        "search": {"trials": 1, "sampler": "tpe", "seed": 0},
        "test": {"reproductions": 2},
        "overrides": TINY,
        **extra,
    }


def split_of(path: Path, ds, n_folds: int = 4, scheme: str = "mlrc"):
    spec = resolve_split(path.name, ds.name, n_folds, scheme, "study.yaml: split", path.parent)
    return build_split(spec, ds, n_folds, scheme, "study.yaml: split")


# --- naive definitions (from the protocol note, not from mlrc) ---------------------------------


def naive_mlrc(trainval: list[int], n: int) -> list[tuple[list[int], list[int]]]:
    """MLRCSplitManager: fold p starts at int(p/n·N); train = a wrap-around window of
    N − ⌊N/n⌋ classes from there, val = the next ⌊N/n⌋ classes."""
    N = len(trainval)
    val_len = N // n
    train_len = N - val_len
    out = []
    for p in range(n):
        s = int(p / n * N)
        val = sorted(trainval[(s + train_len + i) % N] for i in range(val_len))
        out.append(([c for c in trainval if c not in val], val))
    return out


def naive_kfold(trainval: list[int], n: int) -> list[tuple[list[int], list[int]]]:
    """sklearn KFold without shuffling: contiguous blocks, the first N mod n one class longer."""
    N, out, start = len(trainval), [], 0
    for p in range(n):
        size = N // n + (1 if p < N % n else 0)
        val = trainval[start : start + size]
        start += size
        out.append(([c for c in trainval if c not in val], list(val)))
    return out


# --- the split file ----------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_a_split_file_gives_exactly_its_classes(tmp_path, glyphs, names, suffix):
    test_ids = [3, 17, 40, 41, 90, 110]
    folds_ids = [[0, 5, 9], [2, 60], [99, 100, 101, 7]]
    doc = {
        "test": [names[c] for c in test_ids],
        "folds": [[names[c] for c in f] for f in folds_ids],
    }
    split = split_of(write(tmp_path / f"s{suffix}", doc), glyphs)
    assert split.test_classes == tuple(sorted(test_ids))
    trainval = [c for c in range(111) if c not in test_ids]
    assert split.trainval_classes == tuple(trainval)
    assert len(split.folds) == 3
    for fold, val in zip(split.folds, folds_ids, strict=True):
        assert fold.val_classes == tuple(sorted(val))
        assert fold.train_classes == tuple(c for c in trainval if c not in val)
    # classes in no validation list train in every fold, and the summary says so
    assert "never validated" in split.summary()


@pytest.mark.parametrize("scheme,naive", [("mlrc", naive_mlrc), ("kfold", naive_kfold)])
@pytest.mark.parametrize("n_folds", [2, 3, 4])
def test_a_scheme_cuts_the_other_classes_as_the_protocol_does(
    tmp_path, glyphs, names, scheme, naive, n_folds
):
    rng = np.random.default_rng(n_folds)
    test_ids = sorted(int(c) for c in rng.choice(111, size=50, replace=False))
    doc = {"test": [names[c] for c in test_ids], "scheme": scheme, "folds": n_folds}
    split = split_of(write(tmp_path / "s.yaml", doc), glyphs, n_folds=7, scheme="kfold")
    trainval = [c for c in range(111) if c not in test_ids]
    assert split.test_classes == tuple(test_ids) and split.trainval_classes == tuple(trainval)
    assert split.scheme == scheme
    got = [(list(f.train_classes), list(f.val_classes)) for f in split.folds]
    assert got == naive(trainval, n_folds)


def test_scheme_and_folds_default_to_the_preset_s(tmp_path, glyphs, names):
    path = write(tmp_path / "s.yaml", {"test": names[:20]})
    split = split_of(path, glyphs, n_folds=3, scheme="kfold")
    assert split.scheme == "kfold" and len(split.folds) == 3
    assert [list(f.val_classes) for f in split.folds] == [
        v for _, v in naive_kfold(list(range(20, 111)), 3)
    ]
    resolved = load_study(write(tmp_path / "st.yaml", study_doc(split="s.yaml")))
    assert resolved.split.scheme == resolved.preset.split_scheme == "mlrc"
    assert resolved.split.folds == resolved.preset.folds


def test_the_test_half_of_mlrc_written_as_a_file_is_mlrc_s_split(tmp_path, glyphs, names):
    """MLRC's split (second half of the classes for test, 4 mlrc folds) as a split file."""
    doc = {"test": names[55:], "scheme": "mlrc", "folds": 4}
    split = split_of(write(tmp_path / "s.yaml", doc), glyphs)
    got = [(list(f.train_classes), list(f.val_classes)) for f in split.folds]
    assert got == naive_mlrc(list(range(55)), 4)


def test_integers_in_a_split_file_are_class_names_not_labels(tmp_path):
    ds = SimpleNamespace(
        name="sop", class_names=[str(i) for i in range(1, 13)], labels=np.arange(12), num_classes=12
    )
    path = write(tmp_path / "s.yaml", {"test": [1, 2, 3], "folds": [[4, 5], [6, 7]]})
    split = split_of(path, ds)
    assert split.test_classes == (0, 1, 2)  # class "1" has label 0
    assert [f.val_classes for f in split.folds] == [(3, 4), (5, 6)]


# --- predefined --------------------------------------------------------------------------------


def fake(name: str, class_names: list[str], **more) -> SimpleNamespace:
    labels = np.repeat(np.arange(len(class_names)), 2)
    return SimpleNamespace(
        name=name, class_names=class_names, labels=labels, num_classes=len(class_names), **more
    )


def predefined(ds, n_folds: int = 4, scheme: str = "mlrc"):
    spec = resolve_split("predefined", ds.name, n_folds, scheme, "s.yaml: split")
    return build_split(spec, ds, n_folds, scheme, "s.yaml: split")


def test_predefined_cub_and_cars_are_mlrc_s_halves():
    cub = predefined(fake("cub200", [f"{i:03d}.Bird_{i}" for i in range(1, 201)]))
    assert cub.test_classes == tuple(range(100, 200))
    got = [(list(f.train_classes), list(f.val_classes)) for f in cub.folds]
    assert got == naive_mlrc(list(range(100)), 4)
    assert [f.val_classes[0] for f in cub.folds] == [75, 0, 25, 50]  # the note's CUB windows
    cars = predefined(fake("cars196", [f"Car {i}" for i in range(1, 197)]))
    assert cars.test_classes == tuple(range(98, 196))
    never = set(range(98)) - {c for f in cars.folds for c in f.val_classes}
    assert never == {24, 73}  # as in the paper's Cars196 folds


def test_predefined_sop_and_inshop_follow_the_official_lists():
    sop = predefined(fake("sop", [str(i) for i in range(1, 22635)]))
    assert len(sop.test_classes) == 11316 and len(sop.trainval_classes) == 11318
    assert sop.test_classes[0] == 11318  # class_id 11319 (Ebay_test.txt's first)
    partition = ["train", "train", "query", "gallery", "train", "train", "gallery", "query"] * 3
    inshop = fake("inshop", [f"id_{i:08d}" for i in range(12)], partition=partition)
    expected_test = sorted(
        {c for c, p in zip(inshop.labels, partition, strict=True) if p != "train"}
    )
    split = predefined(inshop, n_folds=2, scheme="kfold")
    assert list(split.test_classes) == expected_test


def test_predefined_without_lists_is_one_line(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_study(write(tmp_path / "s.yaml", study_doc(split="predefined")))
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path / 's.yaml'}: split: predefined: dataset 'glyphs' has no")
    assert "\n" not in msg


# --- checks: one line each ---------------------------------------------------------------------

# case: (the file's content, or its raw text; two parts of the one-line message); the last
# two are found against the dataset (class names, class counts), the others on reading the file
A, B, C, D, E, F = (f"U+00{x} {chr(int(x, 16))}" for x in ("41", "42", "43", "44", "45", "46"))
BAD = {
    "test-in-a-fold": (
        {"test": [A, B], "folds": [[A, C], [D, E]]},
        "folds.0: class",
        "also in test",
    ),
    "two-folds-share": ({"test": [A, B], "folds": [[C, D], [D, E]]}, "folds.1", "also in folds.0"),
    "twice-in-test": (
        {"test": [A, B, A], "folds": [[C, D], [E, F]]},
        "test: class",
        "listed twice",
    ),
    "twice-in-a-fold": ({"test": [A, B], "folds": [[C, C], [E, F]]}, "folds.0", "listed twice"),
    "one-val-class": ({"test": [A, B], "folds": [[C], [E, F]]}, "folds.0", "at least 2 validation"),
    "one-test-class": ({"test": [A], "folds": [[C, D], [E, F]]}, "test", "at least 2 classes"),
    "one-fold": ({"test": [A, B], "folds": [[C, D]]}, "folds", "at least 2 folds"),
    "one-fold-count": ({"test": [A, B], "folds": 1}, "folds", "at least 2 folds"),
    "lists-and-scheme": (
        {"test": [A, B], "folds": [[C, D], [E, F]], "scheme": "mlrc"},
        "",
        "not both",
    ),
    "unknown-key": ({"tests": [A, B]}, "unknown key 'tests'", "did you mean 'test'"),
    "no-test": ({"folds": [[C, D], [E, F]]}, "test", "required"),
    "bad-scheme": ({"test": [A, B], "scheme": "random"}, "scheme", "mlrc"),
    "float-name": ({"test": [A, 1.5], "folds": 2}, "test", "must be a string"),
    "not-a-mapping": ([A, B], "", "expected a mapping"),
    "empty": ("", "", "empty"),
    "malformed": ("test: [A, B\n", "line 2", "malformed YAML"),
    "unknown-class": (
        {"test": [A, "U+0041 a"], "folds": 2},
        "test: 'U+0041 a' is not a class of glyphs",
        "did you mean 'U+0061 a'",
    ),
    "too-few-for-the-scheme": (None, "4 folds need at least 8 train+val classes", "found "),
}


@pytest.mark.parametrize("case", BAD)
def test_every_mistake_is_one_line_naming_the_study_and_the_split_file(
    tmp_path, glyphs, names, case
):
    content, where, what = BAD[case]
    if content is None:  # 7 train+val classes for 4 folds
        content = {"test": names[7:], "scheme": "mlrc"}
    split_file = tmp_path / "my split.yaml"
    if isinstance(content, str):
        split_file.write_text(content)
    else:
        write(split_file, content)
    study = write(tmp_path / "st.yaml", study_doc(split="my split.yaml"))
    with pytest.raises(ConfigError) as e:
        resolved = load_study(study)
        build_split(resolved.split, glyphs, 4, "mlrc", f"{study}: split")
    msg = str(e.value)
    assert msg.startswith(f"{study}: split: my split.yaml: "), msg
    assert where in msg and what in msg, msg
    assert "\n" not in msg


def test_json_and_missing_files_are_one_line(tmp_path):
    (tmp_path / "s.json").write_text('{"test": ["a", "b"],')
    for value, what in (("s.json", "malformed JSON"), ("nothere.yaml", "no such file")):
        study = write(tmp_path / "st.yaml", study_doc(split=value))
        with pytest.raises(ConfigError) as e:
            load_study(study)
        assert str(e.value).startswith(f"{study}: split: {value}: ") and what in str(e.value)
        assert "\n" not in str(e.value)


def test_data_summary_shows_the_split_and_its_errors_in_one_line(tmp_path, monkeypatch, names):
    monkeypatch.chdir(tmp_path)  # a relative --split is read from the working directory
    write(tmp_path / "s.yaml", {"test": names[:4], "folds": [names[4:6], names[6:9]]})
    r = runner.invoke(app, ["data", "summary", "glyphs", "--split", "s.yaml"])
    assert r.exit_code == 0, r.output
    assert "107 train+val classes, 4 test classes, 2 folds (scheme 'given')" in r.output
    assert "test: 0–3 (from s.yaml)" in r.output
    assert "fold 0: train 105 classes, val 2 classes 4–5" in r.output
    assert "fold 1: train 104 classes, val 3 classes 6–8" in r.output
    assert f"fold 1 validation classes: {names[6]}, {names[7]}, {names[8]}" in r.output
    assert "never validated (train in every fold): 9–110" in r.output
    bad = write(tmp_path / "b.yaml", {"test": names[:4], "folds": [names[4:6], names[5:9]]})
    r = runner.invoke(app, ["data", "summary", "glyphs", "--split", str(bad)])
    assert r.exit_code == 2
    lines = r.output.strip().splitlines()
    assert (
        lines[-1].startswith(f"error: --split: {bad}: folds.1: class ") and "also in" in lines[-1]
    )
    assert not any(line.startswith("error") for line in lines[:-1])
    r = runner.invoke(app, ["data", "summary", "glyphs", "--split", "predefined"])
    assert r.exit_code == 2 and "dataset 'glyphs' has no train/test lists" in r.output


# --- identity ----------------------------------------------------------------------------------


def resolved_with(tmp_path: Path, split: dict | None, file: str = "s.yaml"):
    extra = {}
    if split is not None:
        write(tmp_path / file, split)
        extra["split"] = file
    return load_study(write(tmp_path / "st.yaml", study_doc(**extra)))


def test_a_study_without_split_keeps_its_fingerprint(tmp_path):
    fp = resolved_with(tmp_path, None).fingerprint()
    assert "split" not in fp and "split" not in fp["study"]
    assert "split" not in artifact_scope(resolved_with(tmp_path, None).fingerprint())
    # the same study resolved from a StudyConfig without the field at all
    plain = resolve(validate_model(StudyConfig, study_doc(), "s"), "s").fingerprint()
    assert plain == fp


def test_the_split_s_content_is_the_study_s_identity(tmp_path, names):
    doc = {"test": names[:6], "folds": [names[6:9], names[9:12]]}
    for sub in "abcd":
        (tmp_path / sub).mkdir()
    a = resolved_with(tmp_path / "a", doc)
    # the same content elsewhere, in another order within its lists: the same identity
    shuffled = {"folds": [names[8:5:-1], names[11:8:-1]], "test": names[5::-1]}
    b = resolved_with(tmp_path / "b", shuffled, file="other.yaml")
    assert a.fingerprint() == b.fingerprint() and artifact_key(a.fingerprint()) == artifact_key(
        b.fingerprint()
    )
    assert a.fingerprint()["split"] == {
        "test": sorted(names[:6]),
        "folds": [sorted(names[6:9]), sorted(names[9:12])],
        "scheme": None,
    }
    # another class in the test set, or the folds in another order: another study
    c = resolved_with(tmp_path / "c", {**doc, "test": names[:5] + names[12:14]})
    d = resolved_with(tmp_path / "d", {**doc, "folds": doc["folds"][::-1]})
    plain = resolved_with(tmp_path, None)
    keys = {artifact_key(x.fingerprint()) for x in (a, c, d, plain)}
    assert len(keys) == 4
    # the file's content inline in the study file: the same study
    inline = load_study(write(tmp_path / "inline.yaml", study_doc(split=shuffled)))
    assert inline.fingerprint() == a.fingerprint()


# --- a study on a split file, end to end -------------------------------------------------------


def test_a_study_runs_on_exactly_its_split_file_s_classes(tmp_path, monkeypatch, glyphs, names):
    import mlrc.search.baseline as baseline_module
    import mlrc.search.folds as folds_module
    import mlrc.search.reproductions as test_stage_module

    test_ids = [1, 12, 23, 34, 45, 56, 67, 78]
    folds_ids = [[2, 3, 4, 5], [100, 101, 102]]
    split_file = write(
        tmp_path / "split.yaml",
        {"test": [names[c] for c in test_ids], "folds": [[names[c] for c in f] for f in folds_ids]},
    )
    study = write(tmp_path / "study.yaml", study_doc("cs", split="split.yaml"))
    url, art = f"sqlite:///{tmp_path / 'db.sqlite'}", tmp_path / "art"

    seen_folds, seen_test = [], set()
    fold_spec = folds_module.fold_spec

    def record_fold(ctx, job, *args):
        spec = fold_spec(ctx, job, *args)
        seen_folds.append((job.kind, job.fold, spec.train_classes, spec.val_classes))
        return spec

    def record_test(view_of):
        def wrapped(ctx, spec_in):
            view = view_of(ctx, spec_in)
            seen_test.update(int(c) for c in np.unique(ctx.dataset.labels[view.indices]))
            return view

        return wrapped

    monkeypatch.setattr(folds_module, "fold_spec", record_fold)
    for module in (baseline_module, test_stage_module):
        monkeypatch.setattr(
            module, "view_of_test_classes", record_test(module.view_of_test_classes)
        )
    for command in ("run", "test"):
        r = runner.invoke(
            app,
            ["study", command, str(study), "--storage", url, "--artifacts", str(art), "--quiet"],
        )
        assert r.exit_code == 0, r.output

    trainval = [c for c in range(111) if c not in test_ids]
    expected = {
        (k, tuple(c for c in trainval if c not in v), tuple(sorted(v)))
        for k, v in enumerate(folds_ids)
    }
    assert {(k, tr, va) for kind, k, tr, va in seen_folds if kind == "search"} == expected
    assert {(k, tr, va) for kind, k, tr, va in seen_folds if kind == "test"} == expected
    assert seen_test == set(test_ids)

    out = runner.invoke(app, ["study", "status", str(study), "--storage", url]).output
    assert "error" not in out

    # an exported study file carries the split inline: the same protocol, the same folds
    exported = tmp_path / "elsewhere" / "exported.yaml"
    exported.parent.mkdir()
    r = runner.invoke(app, ["study", "export", "cs", "--storage", url, "--out", str(exported)])
    assert r.exit_code == 0, r.output
    assert isinstance(yaml.safe_load(exported.read_text())["split"], dict)
    again = load_study(exported)
    assert again.split.model_dump() == load_study(study).split.model_dump()
    assert artifact_scope(again.fingerprint()) == artifact_scope(load_study(study).fingerprint())

    # the split file changed: the stored study refuses it as another configuration
    write(
        split_file,
        {
            "test": [names[c] for c in test_ids[:-1]],
            "folds": [[names[c] for c in f] for f in folds_ids],
        },
    )
    r = runner.invoke(
        app, ["study", "run", str(study), "--storage", url, "--artifacts", str(art), "--quiet"]
    )
    assert r.exit_code == 2
    assert "study 'cs' already exists in the store with a different configuration (split.test:" in (
        r.output
    )
    # an invalid split file is refused before the study is looked at
    write(split_file, {"test": [names[1], "nope"], "folds": 2})
    r = runner.invoke(
        app, ["study", "run", str(study), "--storage", url, "--artifacts", str(art), "--quiet"]
    )
    assert r.exit_code == 2
    assert f"error: {study}: split: split.yaml: test: 'nope' is not a class of glyphs" in r.output
