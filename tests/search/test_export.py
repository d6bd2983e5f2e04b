"""Exports that reproduce (issue #16): ``mlrc study export`` writes a study file with the best
parameters fixed and the whole resolved preset, whose test stage — re-run on a new store —
gives the original's test numbers bit for bit; ``mlrc report --format json`` holds what the
table shows (checked against the CSV and the markdown table, not against itself)."""

from __future__ import annotations

import io
import json

import pandas as pd
import pytest
import yaml
from sqlalchemy import select
from typer.testing import CliRunner

from mlrc import store
from mlrc.cli import app
from mlrc.config import load_study
from mlrc.config.identity import artifact_scope
from mlrc.store.engine import session
from mlrc.store.schema import TestResult, Trial

runner = CliRunner()
TINY = {"iterations_per_epoch": 3, "max_epochs": 1, "validate_every": {"default": 1}}


def cli(*args: object, code: int = 0):
    r = runner.invoke(app, [str(a) for a in args])
    assert r.exit_code == code, r.output
    return r


def results(url: str) -> list[tuple]:
    with session(store.connect(url)) as s:
        rows = s.execute(select(TestResult)).scalars()
        return sorted(
            (
                r.reproduction,
                r.mode,
                r.fold,
                r.map_at_r,
                r.precision_at_1,
                r.r_precision,
                json.dumps(r.extra, sort_keys=True),
                json.dumps(r.params, sort_keys=True),
            )  # fmt: skip
            for r in rows
        )


SETUPS = {
    # a miner's parameters go back under miner.params
    "miner": {"loss": {"name": "multi_similarity"}, "miner": {"name": "multi_similarity"}},
    # a loss with parameters of its own: loss_lr goes back under loss.params
    "loss_lr": {"loss": {"name": "proxy_anchor"}},
}


@pytest.fixture(scope="module", params=list(SETUPS))
def tested(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(request.param)
    doc = {
        "name": "orig",
        "dataset": {"name": "glyphs"},
        "preset": "cpu",
        **SETUPS[request.param],
        "search": {"trials": 2, "sampler": "tpe", "seed": 3},
        "test": {"reproductions": 2},
        "overrides": TINY,
    }
    path = tmp / "orig.yaml"
    path.write_text(yaml.safe_dump(doc))
    url, art = f"sqlite:///{tmp / 'db.sqlite'}", tmp / "art"
    for stage in ("run", "test"):
        cli("study", stage, path, "--storage", url, "--artifacts", art, "--quiet")
    return tmp, path, url


def test_an_exported_study_re_runs_the_test_stage_to_the_same_numbers(tested):
    tmp, path, url = tested
    out = tmp / "exported.yaml"
    said = cli("study", "export", "orig", "--storage", url, "--out", out).output
    assert f"wrote {out} (study orig-exported)" in said
    doc = yaml.safe_load(out.read_text())
    assert doc["search"]["trials"] == 1 and doc["loss"]["search"] == {}
    with session(store.connect(url)) as s:
        best = max(
            s.execute(select(Trial).filter_by(state="complete")).scalars(),
            key=lambda t: (t.value, -t.number),
        )
    exported = load_study(out)
    assert {**exported.fixed} == best.params  # every parameter fixed, nothing to search
    assert exported.space == {}
    assert artifact_scope(exported.fingerprint()) == artifact_scope(
        load_study(path).fingerprint()
    )  # same folds, same seeds
    new = f"sqlite:///{tmp / 'new.sqlite'}"
    cli("study", "test", out, "--storage", new, "--artifacts", tmp / "art-new", "--quiet")
    assert results(new) == results(url)  # no search ran: the test stage alone, bit for bit


def test_export_errors_are_one_line(tested, tmp_path):
    _, _, url = tested
    r = cli("study", "export", "nope", "--storage", url, "--out", tmp_path / "x.yaml", code=2)
    assert r.output.strip() == "error: no study 'nope' in the store"
    (tmp_path / "a-file").write_text("")
    r = cli("study", "export", "orig", "--storage", url, "--out", tmp_path / "a-file" / "x.yaml",
            code=2)  # fmt: skip
    assert r.output.strip().startswith("error: --out ") and "is a file, not a folder" in r.output


def test_the_json_report_holds_what_the_csv_and_the_table_show(tested):
    _, _, url = tested
    doc = json.loads(cli("report", "--storage", url, "--format", "json").output)
    csv = pd.read_csv(io.StringIO(cli("report", "--storage", url, "--format", "csv").output))
    lines = pd.DataFrame(doc["lines"])
    assert list(lines.columns) == list(csv.columns)
    assert len(lines) == len(csv)
    for c in ("mean", "half_width", "low", "high", "p_value"):
        pd.testing.assert_series_equal(lines[c].astype(float), csv[c].astype(float), rtol=1e-9)
    assert (lines["study"] == csv["study"]).all() and (lines["metric"] == csv["metric"]).all()
    md = cli("report", "--storage", url).output
    for block in doc["blocks"]:
        for row in block["rows"]:
            cells = [row["cells"][k]["text"] for k in row["cells"] if row["cells"][k]]
            line = next(ln for ln in md.splitlines() if ln.startswith(f"| {row['label']} |"))
            for text in cells:
                assert text in line
    assert doc["legend"] and all(note in md for note in doc["legend"][:1])
