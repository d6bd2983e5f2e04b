"""How work ends, one rule for every command: a trial, test fold or reproduction is
*interrupted* only by a signal (Ctrl-C, SIGTERM), a lost worker or a lost database; anything else
*fails* it with its reason — the one-line error the command printed — shown by ``study status``
and ``campaign status``. Real ``mlrc`` commands in forked children (:class:`Child`), a real
SQLite store, a real image folder whose image is made corrupt (garbage bytes in a ``.png``).

A pre-flight check may refuse a corrupt image before a study is registered; these tests are about
a failure in the middle of a run, so they pass ``--skip-checks`` where the command has it.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import numpy as np
import optuna
import pandas as pd
import pytest
import typer.main
import yaml
from PIL import Image

from .test_runtime import (
    GLYPHS,
    INTERRUPTED,
    TINY,
    Child,
    _linger_after_epochs,
    optuna_trials,
    sql,
    trials,
    until,
)

OVER = {**TINY, "folds": 2}
GARBAGE = b"garbage bytes, not a PNG at all\n" * 4


def skip_checks(*command: str) -> list[str]:
    """``["--skip-checks"]`` when ``mlrc COMMAND`` has that option, else ``[]``."""
    from mlrc.cli import app

    cmd = typer.main.get_command(app)
    for word in command:
        cmd = cmd.commands[word]
    return ["--skip-checks"] if any("--skip-checks" in p.opts for p in cmd.params) else []


def image_folder(root: Path, classes: int = 32, per_class: int = 4) -> Path:
    """``root/c<k>/<i>.png``: random 24-px RGB images, enough classes for 2 folds of
    8-class batches."""
    rng = np.random.default_rng(0)
    for c in range(classes):
        for i in range(per_class):
            path = root / f"c{c:02}" / f"{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 256, (24, 24, 3), dtype=np.uint8)).save(path)
    return root


def unreadable(path: Path) -> str:
    """The reason (the one line, less ``error:``) of a PNG holding garbage bytes."""
    return f"{path}: unreadable or corrupt image (cannot identify image file '{path}')"


def study_file(tmp: Path, name: str, root: Path, trials_: int = 2) -> Path:
    doc = {
        "name": name,
        "dataset": {"name": "image_folder", "root": str(root)},
        "preset": "cpu",
        "loss": {"name": "contrastive"},
        "search": {"trials": trials_, "sampler": "tpe", "seed": 0},
        "test": {"reproductions": 2},
        "overrides": OVER,
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def folds(db: Path, kind: str) -> list[tuple]:
    """(reproduction, fold, status, reason) of the fold runs of ``kind``."""
    query = (
        "select reproduction, fold, status, reason from mlrc_fold_run where kind = ? order by 1, 2"
    )
    return sql(db, query, kind)


def nothing_running(db: Path) -> None:
    assert sql(db, "select number from mlrc_trial where state = 'running'") == []
    assert sql(db, "select id from mlrc_fold_run where status = 'running'") == []


# --- a corrupt image in a training class ---------------------------------------------------------


@pytest.fixture(scope="module")
def corrupt_search(tmp_path_factory):
    """``study run`` on an image folder with a garbage ``.png`` in a training class (budget 2),
    then ``study status``."""
    tmp = tmp_path_factory.mktemp("corrupt")
    root = image_folder(tmp / "images")
    fake = root / "c01" / "fake.png"
    fake.write_bytes(GARBAGE)
    path, db = study_file(tmp, "corrupt", root), tmp / "db.sqlite"
    url = f"sqlite:///{db}"
    run = ["study", "run", path, "--storage", url, "--artifacts", tmp / "art", "--quiet"]
    child = Child([run + skip_checks("study", "run")], tmp / "run")
    child.wait()
    status = Child([["study", "status", "corrupt", "--storage", url]], tmp / "status")
    assert status.wait() == 0, status.output()
    return child, status, db, url, unreadable(fake)


def test_a_corrupt_image_fails_the_trial_with_the_line_the_user_saw(corrupt_search):
    child, _, db, url, reason = corrupt_search
    assert child.code == 2, child.output()
    assert child.stderr_lines()[-1] == f"error: {reason}"
    assert not [ln for ln in child.stderr_lines() if "Traceback" in ln or "interrupted" in ln]
    assert trials(db) == {0: ("failed", reason, trials(db)[0][2], None)}
    [o] = optuna_trials(url, "corrupt")
    assert o.state == optuna.trial.TrialState.FAIL and o.user_attrs["reason"] == reason
    assert "retry_of" not in o.user_attrs  # failed: counted, not retried
    assert folds(db, "search") == [(0, 0, "failed", reason)]  # the fold it failed in
    nothing_running(db)


def test_study_status_shows_the_failed_trial_and_its_reason(corrupt_search):
    _, status, *_, reason = corrupt_search
    out = status.output()
    assert f"trial 0 failed: {reason}" in out
    assert "0 complete, 0 running, 1 failed, 0 interrupted, 0 pruned" in out
    assert "trial 0 interrupted" not in out


def test_the_report_keeps_the_failed_trial_and_its_reason(corrupt_search, tmp_path):
    """The image removed, the study goes on (trial 1) and is tested: the report's notes (md),
    its CSV and its JSON say trial 0 failed, with the reason."""
    _, _, db, url, reason = corrupt_search
    [(config,)] = sql(db, "select config from mlrc_study where name = 'corrupt'")
    root = Path(json.loads(config)["study"]["dataset"]["root"])
    (root / "c01" / "fake.png").unlink()
    path = study_file(tmp_path, "corrupt", root)
    common = ["--storage", url, "--artifacts", db.parent / "art", "--quiet"]
    report = ["report", "--study", "corrupt", "--storage", url]
    child = Child(
        [
            ["study", "run", path, *common],
            ["study", "test", path, *common],
            [*report, "--format", "csv", "--out", tmp_path / "r.csv"],
            [*report, "--format", "json", "--out", tmp_path / "r.json"],
        ],
        tmp_path / "finish",
    )
    assert child.wait() == 0, child.output()
    note = f"contrastive (image_folder): trial 0 failed: {reason}."
    assert note in child.output()  # study test prints the report, notes included
    table = pd.read_csv(tmp_path / "r.csv")
    study = table[table["study"] == "corrupt"]
    assert len(study) and (study["failed_trials"] == 1).all()
    assert (study["failures"] == f"trial 0 failed: {reason}").all()
    doc = json.loads((tmp_path / "r.json").read_text())
    assert note in doc["legend"]
    assert {ln["failures"] for ln in doc["lines"] if ln["study"] == "corrupt"} == {
        f"trial 0 failed: {reason}"
    }
    assert [t[:2] for _, t in sorted(trials(db).items())] == [
        ("failed", reason),
        ("complete", None),
    ]


def test_a_campaign_cell_shows_the_failed_trial(tmp_path):
    """The same corrupt image in a campaign: the study is reported failed with the reason (exit
    1), and ``campaign status`` counts the cell as failed, not pending."""
    root = image_folder(tmp_path / "images")
    fake = root / "c02" / "fake.png"
    fake.write_bytes(GARBAGE)
    doc = {
        "name": "bad",
        "datasets": [{"name": "image_folder", "root": str(root)}],
        "losses": ["contrastive"],
        "preset": "cpu",
        "search": {"trials": 2, "seed": 0},
        "test": {"reproductions": 2},
        "overrides": OVER,
    }
    path = tmp_path / "campaign.yaml"
    path.write_text(yaml.safe_dump(doc))
    db = tmp_path / "db.sqlite"
    url = f"sqlite:///{db}"
    run = ["campaign", "run", path, "--storage", url, "--artifacts", tmp_path / "art", "--quiet"]
    child = Child([run + skip_checks("campaign", "run")], tmp_path / "run")
    assert child.wait() == 1, child.output()
    reason = unreadable(fake)
    name = "bad-image_folder-contrastive"
    assert f"study 1/1 failed: {name}: {reason}" in child.output()
    assert trials(db)[0][:2] == ("failed", reason)
    nothing_running(db)
    status = Child([["campaign", "status", "bad", "--storage", url]], tmp_path / "status")
    assert status.wait() == 0, status.output()
    assert f"{name}: failed: trial 0: {reason}" in status.output()
    assert "1 study: 1 failed" in status.output()


# --- a failure of the test stage -------------------------------------------------------------------


def test_a_test_stage_failure_fails_the_reproduction_with_its_reason(tmp_path):
    """The search completes; an image of a training class is then overwritten with garbage:
    ``study test`` fails at reproduction 1, fold 0 with the one line, recorded with the fold
    (nothing left running), shown by ``study status``."""
    root = image_folder(tmp_path / "images")
    path, db = study_file(tmp_path, "tst", root, trials_=1), tmp_path / "db.sqlite"
    url, art = f"sqlite:///{db}", tmp_path / "art"
    common = ["--storage", url, "--artifacts", art, "--quiet"]
    search = Child([["study", "run", path, *common]], tmp_path / "search")
    assert search.wait() == 0, search.output()
    victim = root / "c03" / "0.png"  # a training class of both folds' test models
    victim.write_bytes(GARBAGE)
    test = Child(
        [["study", "test", path, *common, *skip_checks("study", "test")]], tmp_path / "test"
    )
    assert test.wait() == 2, test.output()
    reason = unreadable(victim)
    assert test.stderr_lines()[-1] == f"error: {reason}"
    assert folds(db, "test") == [(1, 0, "failed", reason)]
    assert sql(db, "select count(*) from mlrc_test_result") == [(0,)]
    nothing_running(db)
    status = Child([["study", "status", "tst", "--storage", url]], tmp_path / "status")
    assert status.wait() == 0, status.output()
    assert f"reproduction 1, fold 0 failed: {reason}" in status.output()


# --- Ctrl-C and SIGTERM during a campaign ----------------------------------------------------------


def _training(db: Path, kind: str) -> bool:
    """A fold of ``kind`` is training: its row is running and an epoch of it is stored."""
    return bool(
        sql(
            db,
            "select 1 from mlrc_fold_run f join mlrc_epoch_metric e on e.fold_run_id = f.id "
            "where f.status = 'running' and f.kind = ?",
            kind,
        )
    )


@pytest.fixture(scope="module")
def signalled_campaign(tmp_path_factory):
    """One campaign run three times: SIGTERM while trial 0 trains, Ctrl-C while a test fold
    trains, then to the end."""
    tmp = tmp_path_factory.mktemp("campaign-signals")
    doc = {
        "name": "sig",
        "datasets": [{"name": "glyphs", "params": GLYPHS}],
        "losses": ["contrastive"],
        "preset": "cpu",
        "search": {"trials": 1, "seed": 0},
        "test": {"reproductions": 2},
        "overrides": OVER,
    }
    path = tmp / "campaign.yaml"
    path.write_text(yaml.safe_dump(doc))
    db = tmp / "db.sqlite"
    url = f"sqlite:///{db}"
    run = ["campaign", "run", path, "--storage", url, "--artifacts", tmp / "art", "--quiet"]
    runs = {}
    for name, sig, kind in (
        ("sigterm", signal.SIGTERM, "search"),
        ("sigint", signal.SIGINT, "test"),
    ):
        child = Child([run], tmp / name, hook=_linger_after_epochs)
        until(child, lambda kind=kind: _training(db, kind))
        child.signal(sig)
        child.wait()
        status = Child([["campaign", "status", "sig", "--storage", url]], tmp / f"{name}-status")
        assert status.wait() == 0, status.output()
        runs[name] = (child, sql(db, "select kind, reproduction, fold, status from mlrc_fold_run"),
                      trials(db), status.output())  # fmt: skip
    final = Child([run], tmp / "final")
    final.wait()
    return runs, final, db


def test_sigterm_during_a_campaign_search_marks_the_trial_interrupted(signalled_campaign):
    runs, _, _ = signalled_campaign
    child, fold_rows, trial_rows, status = runs["sigterm"]
    assert child.code == 143, child.output()
    assert child.stderr_lines() == [
        f"interrupted (SIGTERM): trial 0 marked interrupted; {INTERRUPTED}"
    ]
    assert trial_rows[0][:2] == ("interrupted", "interrupted")
    assert "running" not in {r[3] for r in fold_rows}
    assert ("search", 0, 0, "interrupted") in fold_rows
    # no unit of work is running (the work table's header names the word "running")
    assert "(1 running)" not in status and "running: " not in status
    assert "1 study: 1 pending" in status


def test_ctrl_c_during_a_campaign_test_stage_marks_the_fold_interrupted(signalled_campaign):
    runs, _, _ = signalled_campaign
    child, fold_rows, trial_rows, status = runs["sigint"]
    assert child.code == 130, child.output()
    [(rep, fold)] = [(r[1], r[2]) for r in fold_rows if r[0] == "test" and r[3] == "interrupted"]
    assert child.stderr_lines() == [
        f"interrupted (SIGINT): reproduction {rep}, fold {fold} marked interrupted; {INTERRUPTED}"
    ]
    assert "running" not in {r[3] for r in fold_rows}
    assert "running" not in {t[0] for t in trial_rows.values()}
    assert "(1 running)" not in status and "1 study: 1 partial" in status


def test_the_interrupted_campaign_resumes_to_the_end(signalled_campaign):
    _, final, db = signalled_campaign
    assert final.code == 0, final.output()
    assert "1 study: 1 done" in final.output()
    assert {s for (s,) in sql(db, "select status from mlrc_fold_run")} == {"complete"}
    assert [t[0] for _, t in sorted(trials(db).items())] == ["interrupted", "complete"]


# --- the rule itself -----------------------------------------------------------------------------


def _raised_while(handling: BaseException, raised: BaseException) -> BaseException:
    """``raised`` as Python leaves it when raised inside ``except`` of ``handling``."""
    try:
        try:
            raise handling
        except BaseException:
            raise raised  # noqa: B904 — the implicit context is the point
    except BaseException as e:  # noqa: BLE001
        return e


def test_the_rule_interrupted_only_for_a_signal_or_a_lost_database():
    import sqlite3

    from sqlalchemy.exc import OperationalError

    from mlrc.data.base import DatasetError
    from mlrc.search.errors import Interrupted, ending
    from mlrc.store import StoreError

    assert ending(KeyboardInterrupt()) == ("interrupted", None)
    assert ending(Interrupted(3)) == ("interrupted", None)
    # torch.save's zip writer raises a RuntimeError while a Ctrl-C unwinds: still the signal
    assert ending(
        _raised_while(KeyboardInterrupt(), RuntimeError("PytorchStreamWriter failed"))
    ) == (
        "interrupted",
        None,
    )
    lost = OperationalError("select 1", {}, sqlite3.OperationalError("disk I/O error"))
    assert ending(lost) == ("lost", None)
    assert ending(StoreError("sqlite:///x.db: the database is unreachable")) == ("lost", None)
    # everything else fails, with the line the command prints (less "error: ")
    assert ending(DatasetError("/d/c1/x.png: unreadable or corrupt image (truncated)")) == (
        "failed",
        "/d/c1/x.png: unreadable or corrupt image (truncated)",
    )
    worker = (
        "Caught DatasetError in DataLoader worker process 0.\nOriginal Traceback (most recent "
        'call last):\n  File "x.py", line 1\nDatasetError: /d/c1/x.png: image file is missing'
    )
    assert ending(DatasetError(worker)) == ("failed", "/d/c1/x.png: image file is missing")
    assert ending(ValueError("no query has another item of its class\nmore")) == (
        "failed",
        "ValueError: no query has another item of its class",
    )
    assert ending(MemoryError()) == ("failed", "MemoryError")
