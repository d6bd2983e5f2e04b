"""Where commands write, and what they say: every ``--out`` creates its folder and never
overwrites the file a command reads (``study export`` and ``export-model`` also refuse any
existing file without ``--force``); ``data check`` lists every bad file; the errors of a too
small dataset, a missing root and a root that does not exist name the study file and its key;
no ``<database>.<name>.lock`` file outlives a command, and removing it keeps one process per
study. Each case asserts the exit code, the one line, and what the disk and store hold."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image
from sqlalchemy import select

from mlrc import store
from mlrc.store.engine import session
from mlrc.store.schema import Study, TestResult

from .conftest import invoke

STUDY = {
    "name": "s1",
    "dataset": {"name": "glyphs"},
    "preset": "cpu",
    "loss": {"name": "contrastive", "params": {"pos_margin": 0.0, "neg_margin": 1.0}},
    "search": {"trials": 1},
    "test": {"reproductions": 2},
    "overrides": {"iterations_per_epoch": 2, "max_epochs": 1},
}


def one_line(result, code: int = 2) -> str:
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


def write_study(folder: Path, doc: dict, name: str = "s1.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def searched(tmp_path_factory) -> tuple[Path, str]:
    """A study file and a store where its search ran (one trial, glyphs, seconds)."""
    folder = tmp_path_factory.mktemp("searched")
    path = write_study(folder, STUDY)
    url = f"sqlite:///{folder / 'mlrc.db'}"
    r = invoke(["study", "run", path, "--storage", url, "--artifacts", folder / "art", "--quiet"])
    assert r.exit_code == 0, r.output
    return path, url


def filled_store(path: Path) -> str:
    """A store with one study and two final test results, written by hand."""
    url = f"sqlite:///{path}"
    engine = store.connect(url)
    with session(engine) as s:
        st = Study(
            name="a", dataset="d", loss="contrastive", preset="cpu", config={}, code_version="t"
        )
        s.add(st)
        s.flush()
        for rep in (1, 2):
            for mode in ("separated", "concatenated"):
                values = {"map_at_r": 0.1 * rep, "precision_at_1": 0.2, "r_precision": 0.3}
                s.add(
                    TestResult(
                        study_id=st.id, reproduction=rep, mode=mode, fold=-1, params={}, **values
                    )
                )
    engine.dispose()
    return url


# --- --out --------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["md", "csv", "json"])
def test_report_out_creates_its_folder_and_writes_what_stdout_shows(tmp_path, fmt):
    url = filled_store(tmp_path / "s.db")
    out = tmp_path / "no-such-dir" / "deeper" / f"t.{fmt}"
    r = invoke(["report", "--storage", url, "--format", fmt, "--out", out])
    assert one_line(r, 0) == f"wrote {out}"
    shown = invoke(["report", "--storage", url, "--format", fmt]).stdout
    assert out.read_text(encoding="utf-8") == shown
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name]  # no temporary file left


@pytest.mark.parametrize("where", ["a-folder", "under-a-file"])
def test_report_out_that_cannot_be_a_file_is_one_line_and_writes_nothing(tmp_path, where):
    url = filled_store(tmp_path / "s.db")
    before = sorted(p.name for p in tmp_path.iterdir())
    if where == "a-folder":
        out, reason = tmp_path, "is a folder; name a file in it"
    else:
        out, reason = tmp_path / "s.db" / "t.md", f"cannot create its folder ({tmp_path / 's.db'}"
    line = one_line(invoke(["report", "--storage", url, "--out", out]))
    assert line.startswith(f"error: --out {out}: {reason}")
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_export_refuses_to_overwrite_the_study_file_it_reads(searched):
    path, url = searched
    before = path.read_bytes()
    for out, extra in ((path, []), (path, ["--force"]), (Path(os.path.relpath(path)), ["--force"])):
        r = invoke(["study", "export", path, "--out", out, "--storage", url, *extra])
        assert (
            one_line(r)
            == f"error: --out {out}: that is the input file {path}; write to another file"
        )
    assert path.read_bytes() == before


def test_export_refuses_an_existing_file_without_force(searched, tmp_path):
    path, url = searched
    out = tmp_path / "sub" / "exported.yaml"
    r = invoke(["study", "export", path, "--out", out, "--storage", url])
    assert one_line(r, 0) == f"wrote {out} (study s1-exported)"
    assert yaml.safe_load(out.read_text())["name"] == "s1-exported"
    out.write_text("mine\n")
    r = invoke(["study", "export", path, "--out", out, "--storage", url, "--name", "x"])
    assert one_line(r) == f"error: --out {out}: the file exists; pass --force to overwrite it"
    assert out.read_text() == "mine\n"
    r = invoke(["study", "export", path, "--out", out, "--storage", url, "--name", "x", "--force"])
    assert one_line(r, 0) == f"wrote {out} (study x)"
    assert yaml.safe_load(out.read_text())["name"] == "x"


def test_export_model_refuses_the_study_file_and_an_existing_file(searched, tmp_path):
    path, url = searched
    before = path.read_bytes()
    r = invoke(["study", "export-model", path, "--out", path, "--storage", url, "--force"])
    assert one_line(r).startswith(f"error: --out {path}: that is the input file")
    assert path.read_bytes() == before
    out = tmp_path / "m.pt"
    out.write_bytes(b"mine")
    r = invoke(["study", "export-model", path, "--out", out, "--storage", url])
    assert one_line(r) == f"error: --out {out}: the file exists; pass --force to overwrite it"
    assert out.read_bytes() == b"mine"
    # with --force the export itself says why it cannot (no test yet); the file is left alone
    deeper = tmp_path / "new" / "m.pt"
    r = invoke(["study", "export-model", path, "--out", deeper, "--storage", url, "--force"])
    assert one_line(r) == "error: study 's1' has no test results yet: run `mlrc study test` first"
    assert not (tmp_path / "new").exists()  # the folder made for it is gone again


# --- data check ---------------------------------------------------------------------------------


def test_data_check_lists_every_bad_file_of_every_kind(tmp_path):
    rng = np.random.default_rng(0)
    for c in range(3):
        for i in range(3):
            path = tmp_path / f"c{c}" / f"{i}.png"
            path.parent.mkdir(exist_ok=True)
            Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(path)
    (tmp_path / "c0" / "empty.png").write_bytes(b"")
    (tmp_path / "c1" / "empty.jpg").write_bytes(b"")
    (tmp_path / "c2" / "text.png").write_bytes(b"not an image")
    good = (tmp_path / "c2" / "0.png").read_bytes()
    (tmp_path / "c2" / "cut.png").write_bytes(good[: len(good) // 2])
    r = invoke(["data", "check", "image_folder", "--root", tmp_path])
    assert r.exit_code == 1, r.output
    bad = sorted(line for line in r.stdout.splitlines() if line.startswith("bad: "))
    assert [line.split(": ")[1] for line in bad] == [
        str(tmp_path / "c0" / "empty.png"),
        str(tmp_path / "c1" / "empty.jpg"),
        str(tmp_path / "c2" / "cut.png"),
        str(tmp_path / "c2" / "text.png"),
    ]
    assert "image file is empty (0 bytes)" in bad[0] and "image file is empty" in bad[1]
    assert "9 of 13 images readable" in r.stdout


def test_data_check_without_a_needed_root_names_the_option():
    r = invoke(["data", "check", "image_folder"])
    assert (
        one_line(r) == "error: --root: dataset 'image_folder' needs a root directory (--root PATH)"
    )


# --- wording of the study file's dataset --------------------------------------------------------


def test_too_few_classes_says_what_is_needed_and_found_and_names_the_file(tmp_path):
    for c in range(3):
        (tmp_path / "img" / f"c{c}").mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (8, 8), (c * 50, i * 50, 0)).save(tmp_path / "img" / f"c{c}/{i}.png")
    doc = {**STUDY, "dataset": {"name": "image_folder", "root": str(tmp_path / "img")}}
    path = write_study(tmp_path, doc)
    url = f"sqlite:///{tmp_path / 'mlrc.db'}"
    line = one_line(invoke(["study", "run", path, "--storage", url, "--quiet"]))
    assert line == (
        f"error: {path}: dataset: image_folder (preset.folds 4): 4 folds need at least 16 "
        "classes: 8 train+val (2 validation classes per fold) and as many to test; found 3 "
        "(1 train+val)"
    )
    if (tmp_path / "mlrc.db").exists():  # nothing registered
        engine = store.connect(url, read_only=True)
        with session(engine) as s:
            assert s.scalars(select(Study)).all() == []


@pytest.mark.parametrize(
    ("dataset", "expected"),
    [
        (
            {"name": "image_folder"},
            "dataset.root: dataset 'image_folder' needs a root directory, and none is given "
            "(root: PATH)",
        ),
        ({"name": "cub200"}, "dataset.root: dataset 'cub200' needs a root directory, and none..."),
        (
            {"name": "glyphs", "root": "."},
            "dataset.root: dataset 'glyphs' is built in and takes no root",
        ),
    ],
)
def test_a_missing_or_needless_root_names_the_file_and_key(tmp_path, dataset, expected):
    path = write_study(tmp_path, {**STUDY, "dataset": dataset})
    line = one_line(invoke(["study", "run", path, "--storage", f"sqlite:///{tmp_path / 'x.db'}"]))
    prefix = f"error: {path}: "
    assert line.startswith(prefix)
    if expected.endswith("..."):
        assert line.removeprefix(prefix).startswith(expected.removesuffix("..."))
    else:
        assert line.removeprefix(prefix) == expected
    assert not (tmp_path / "x.db").exists()


def test_a_root_that_does_not_exist_lists_each_place_looked_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write_study(tmp_path, {**STUDY, "dataset": {"name": "image_folder", "root": "/no/x"}})
    line = one_line(invoke(["study", "run", path, "--storage", f"sqlite:///{tmp_path / 'x.db'}"]))
    assert line == f"error: {path}: dataset.root: /no/x does not exist (looked in /no/x)"
    rel = write_study(
        tmp_path, {**STUDY, "dataset": {"name": "image_folder", "root": "nx"}}, "r.yaml"
    )
    line = one_line(
        invoke(["study", "run", "r.yaml", "--storage", f"sqlite:///{tmp_path / 'x.db'}"])
    )
    assert line == f"error: r.yaml: dataset.root: nx does not exist (looked in {tmp_path / 'nx'})"
    assert rel.is_file() and not (tmp_path / "x.db").exists()


# --- lock files ---------------------------------------------------------------------------------


def test_no_lock_file_outlives_a_command(searched):
    path, url = searched
    folder = path.parent
    for args in (
        ["study", "run", path, "--storage", url, "--artifacts", folder / "art", "--quiet"],
        ["study", "status", path, "--storage", url],
        ["report", "--storage", url],
    ):
        r = invoke(args)
        assert r.exit_code == 0, r.output
        assert list(folder.glob("*.lock")) == [], args


def _hold(path: str, log: str, rounds: int) -> None:
    """Take the lock ``rounds`` times, writing enter/leave lines while holding it."""
    from filelock import Timeout

    from mlrc.store import removed_lock_file

    done = 0
    while done < rounds:
        try:
            with removed_lock_file(path, blocking=False), open(log, "a") as f:
                f.write(f"in {os.getpid()}\n")
                f.flush()
                time.sleep(0.001)
                f.write(f"out {os.getpid()}\n")
            done += 1
        except Timeout:
            time.sleep(0.0005)


def test_removing_the_lock_file_keeps_one_holder_at_a_time(tmp_path):
    """Four processes take and release the same lock (its file removed each time) 150 times
    each; their enter/leave lines never interleave and no file is left."""
    lock, log = str(tmp_path / "db.s.lock"), str(tmp_path / "log")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_hold, args=(lock, log, 150)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    lines = Path(log).read_text().splitlines()
    assert len(lines) == 4 * 150 * 2
    for enter, leave in zip(lines[::2], lines[1::2], strict=True):
        assert enter.startswith("in ") and leave == "out " + enter.removeprefix("in ")
    assert not os.path.exists(lock)
