"""A finished study carried to another store as one file (issue #41): exported from the store it
ran in, imported into an empty SQLite store, its report is the same, its curves and test rows
are the same rows, and ``mlrc campaign run`` on the new store trains nothing."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml
from sqlalchemy import func, select
from typer.testing import CliRunner

from mlrc import store
from mlrc.cli import app
from mlrc.search.artifacts import ARTIFACTS_SETTING
from mlrc.search.replay import recorded_study
from mlrc.search.transfer import export_study, import_study, read_study_file, write_study_file
from mlrc.store.engine import session
from mlrc.store.schema import Baseline, EpochMetric, FoldRun, StudyBaseline, TestResult, Trial

runner = CliRunner()
NAME = "move-glyphs-contrastive"
OTHER = "move-glyphs-ntxent"  # shares NAME's untrained baseline row
TINY = {  # 2 folds, 16-px crops, 2 epochs of 4 iterations: seconds on a CPU
    "iterations_per_epoch": 4,
    "max_epochs": 2,
    "validate_every": {"default": 1},
    "patience": {"default": 5},
    "folds": 2,
    "image": {"resize": 20, "crop": 16},
    "eval_batch_size": 256,
}
CAMPAIGN = {
    "name": "move",
    "datasets": [{"name": "glyphs"}],
    "losses": ["contrastive", "ntxent"],
    "preset": "cpu",
    "search": {"trials": 2, "sampler": "gp", "seed": 0},
    "test": {"reproductions": 2},
    "overrides": TINY,
}


def cli(*args: object, code: int = 0):
    r = runner.invoke(app, [str(a) for a in args])
    assert r.exit_code == code, r.output
    return r


def run(path, url, art) -> None:
    cli("campaign", "run", path, "--storage", url, "--artifacts", art, "--quiet", "--threads", 1)


def counts(url: str) -> dict[str, int]:
    with session(store.connect(url)) as s:
        return {
            m.__tablename__: s.execute(select(func.count()).select_from(m)).scalar()
            for m in (Trial, FoldRun, EpochMetric, TestResult, Baseline, StudyBaseline)
        }


def result_rows(url: str) -> list[tuple]:
    with session(store.connect(url)) as s:
        rows = s.execute(select(TestResult)).scalars()
        return sorted(
            (r.reproduction, r.mode, r.fold, r.map_at_r, r.precision_at_1, r.r_precision,
             json.dumps(r.extra, sort_keys=True), json.dumps(r.params, sort_keys=True))
            for r in rows
        )  # fmt: skip


@pytest.fixture(scope="module")
def moved(tmp_path_factory):
    """The campaign run in store a, its study exported to a file and imported into store b."""
    tmp = tmp_path_factory.mktemp("transfer")
    path = tmp / "move.yaml"
    path.write_text(yaml.safe_dump(CAMPAIGN, sort_keys=False))
    a, b = f"sqlite:///{tmp / 'a.db'}", f"sqlite:///{tmp / 'b.db'}"
    run(path, a, tmp / "art-a")
    file, other = tmp / "study.json.gz", tmp / "other.json.gz"
    assert write_study_file(export_study(a, NAME), file)
    assert write_study_file(export_study(a, OTHER), other)
    import_study(b, read_study_file(file))
    import_study(b, read_study_file(other))  # the baseline they share is written once
    return path, a, b, tmp, file


def test_the_report_and_the_rows_are_the_same(moved):
    _, a, b, _, _ = moved
    for fmt in ("json", "md", "csv"):
        ra = cli("report", "--storage", a, "--campaign", "move", "--format", fmt).output
        rb = cli("report", "--storage", b, "--campaign", "move", "--format", fmt).output
        assert ra == rb
    assert NAME in ra and OTHER in ra
    assert result_rows(a) == result_rows(b)
    assert len(result_rows(a)) == 2 * 2 * (
        2 + 2
    )  # 2 studies × 2 reproductions × (2 folds, mean, 512-D)
    assert counts(a) == counts(b)
    assert counts(a)["mlrc_epoch_metric"] > 0
    assert (counts(b)["mlrc_baseline"], counts(b)["mlrc_study_baseline"]) == (2, 2)  # 2 modes
    # the curves replay reads (the pruning corpus) are the same
    ea, eb = store.connect(a), store.connect(b)
    assert recorded_study(ea, NAME) == recorded_study(eb, NAME)


def test_campaign_run_skips_the_imported_study(moved):
    path, _, b, tmp, _ = moved
    before = export_study(b, NAME)
    run(path, b, tmp / "art-b")  # no checkpoint travels: anything it trained would show
    after = export_study(b, NAME)
    assert after["optuna"] == before["optuna"]  # no trial asked, none told
    # the one change: the study now records the folder of its last run (ARTIFACTS_SETTING)
    moved_to = after["rows"]["study"]["settings"].pop(ARTIFACTS_SETTING)
    before["rows"]["study"]["settings"].pop(ARTIFACTS_SETTING, None)
    assert moved_to == str((tmp / "art-b").resolve())
    assert after == before
    status = cli("campaign", "status", path, "--storage", b).output
    assert "done" in status


def test_a_study_grown_after_the_move_grows_as_it_would_have(moved):
    """The same trial 3 in the original store and in one restored from the file: the same
    parameters, value and validation curves (the same machine; see the results page)."""
    path, a, _, tmp, file = moved
    for suffix in ("", "-wal", "-shm"):  # the original store, left as the other tests read it
        src = tmp / f"a.db{suffix}"
        if src.exists():
            shutil.copy(src, tmp / f"a2.db{suffix}")
    a2, c = f"sqlite:///{tmp / 'a2.db'}", f"sqlite:///{tmp / 'c.db'}"
    import_study(c, read_study_file(file))
    import_study(c, read_study_file(tmp / "other.json.gz"))
    grown = tmp / "grown.yaml"
    grown.write_text(yaml.safe_dump({**CAMPAIGN, "search": {**CAMPAIGN["search"], "trials": 3}}))
    run(grown, a2, tmp / "art-a2")
    run(grown, c, tmp / "art-c")
    there, here = recorded_study(store.connect(a2), NAME), recorded_study(store.connect(c), NAME)
    assert len(there.trials) == 3
    assert there == here


def test_the_file_is_the_same_bytes_and_refuses_a_second_import(moved):
    _, a, b, _, file = moved
    assert not write_study_file(export_study(a, NAME), file)  # unchanged: not rewritten
    with pytest.raises(store.StoreError, match="already exists"):
        import_study(b, read_study_file(file))
    assert counts(a) == counts(b)
