"""A campaign served by a pool of ``mlrc worker CAMPAIGN.yaml`` processes on a real PostgreSQL:
every search and test stage finished, the test rows bit-identical to ``mlrc campaign run`` of the
same campaign in another store, and a worker killed mid-test-fold losing nothing."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
import yaml
from sqlalchemy import select, text
from test_pool import Worker, finish, optuna_trials, with_password

from mlrc import store
from mlrc.store.engine import session
from mlrc.store.schema import CampaignStudy, EpochMetric, FoldRun, Study, TestResult, Trial

LOSSES = ["contrastive", "triplet", "ntxent", "multi_similarity"]
CAMPAIGN = {
    "name": "served",
    "datasets": [{"name": "glyphs"}],
    "losses": LOSSES,
    "preset": "cpu",
    # TPE's first 10 draws are random, each from its sampler position's own seed: the pool
    # draws what one process draws, whatever order its trials end in (the same best)
    "search": {"trials": 2, "seed": 5},
    "test": {"reproductions": 2},
    "overrides": {  # a fold: ~2 s on one core, long enough to be killed in
        "iterations_per_epoch": 12,
        "max_epochs": 2,
        "validate_every": {"default": 1},
        "patience": {"default": 5},
        "folds": 2,
        "image": {"resize": 20, "crop": 16},
        "eval_batch_size": 256,
    },
}
STUDIES = [f"served-glyphs-{loss}" for loss in LOSSES]


def doc_studies(doc: dict) -> list[str]:
    return [f"{doc['name']}-glyphs-{loss}" for loss in doc["losses"]]


def _rows(url: str) -> dict[tuple, tuple]:
    """Every test row by (study, reproduction, mode, fold): its metrics and parameters."""
    engine = store.connect(url)
    with session(engine) as s:
        names = dict(s.execute(select(Study.id, Study.name)).all())
        found = {
            (names[r.study_id], r.reproduction, r.mode, r.fold): (
                r.map_at_r, r.precision_at_1, r.r_precision, r.extra, r.params
            )
            for r in s.execute(select(TestResult)).scalars()
        }  # fmt: skip
    engine.dispose()
    return found


def _test_folds(url: str) -> list[FoldRun]:
    engine = store.connect(url)
    with session(engine) as s:
        runs = s.execute(select(FoldRun).filter_by(kind="test")).scalars().all()
    engine.dispose()
    return runs


def _connections(engine) -> int:  # noqa: ANN001
    """Connections to this database now, this test's own poll excepted."""
    with engine.connect() as c:
        return c.execute(text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        )).scalar()  # fmt: skip


def _held_test_fold(engine) -> FoldRun | None:  # noqa: ANN001
    """A test fold running past its first validated epoch (its ``last.pt`` written)."""
    with session(engine) as s:
        return s.execute(
            select(FoldRun)
            .join(EpochMetric, EpochMetric.fold_run_id == FoldRun.id)
            .filter(FoldRun.kind == "test", FoldRun.status == "running", EpochMetric.epoch >= 1)
            .limit(1)
        ).scalar_one_or_none()


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[tuple, tuple]:
    """``mlrc campaign run`` of the campaign, one process, in a SQLite store of its own."""
    tmp = tmp_path_factory.mktemp("reference")
    path = tmp / "served.yaml"
    path.write_text(yaml.safe_dump(CAMPAIGN))
    url = f"sqlite:///{tmp / 'db.sqlite'}"
    cmd = [sys.executable, "-m", "mlrc.cli", "campaign", "run", str(path), "--storage", url,
           "--artifacts", str(tmp / "art"), "--threads", "1", "--quiet"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    return _rows(url)


def test_three_campaign_workers_finish_it_with_the_rows_of_campaign_run(
    tmp_path, fresh_database, reference
):
    """Three workers, one command each; one SIGKILLed while it trains a test fold. Every
    study ends searched and tested; the killed fold is taken over and completed by another
    worker; the test rows equal ``campaign run``'s bit for bit."""
    url = with_password(fresh_database)
    path = tmp_path / "served.yaml"
    path.write_text(yaml.safe_dump(CAMPAIGN))
    art, extra = tmp_path / "art", ["--threads", "1", "--heartbeat", "1", "--grace", "3"]
    workers = [Worker(path, url, art, tmp_path / f"w{i}.log", *extra) for i in range(3)]
    by_pid = {w.proc.pid: w for w in workers}
    engine = store.connect(url)
    deadline, victim, most = time.monotonic() + 600, None, 0
    while victim is None and time.monotonic() < deadline:
        most = max(most, _connections(engine))
        fold = _held_test_fold(engine)
        holder = fold and by_pid.get(int(fold.provenance["worker"].rsplit(":", 1)[1]))
        if holder is not None and holder.proc.poll() is None:
            victim = (holder, fold)
        time.sleep(0.05)
    assert victim is not None, "no test fold reached its second epoch in a worker"
    worker, killed = victim
    # each worker has the 4 studies open: one shared mlrc engine, Optuna's connections only
    # while in use (a pool per study and per engine: some 10 idle connections per worker)
    assert most <= 3 * 8, f"{most} connections open for 3 workers"
    worker.proc.send_signal(signal.SIGKILL)
    worker.proc.wait()
    finish([w for w in workers if w is not worker], timeout=900)
    engine.dispose()

    runs = _test_folds(url)
    assert len(runs) == len(STUDIES) * 2 * 2 and all(r.status == "complete" for r in runs)
    [again] = [r for r in runs if r.id == killed.id]  # complete, its worker dead: taken over
    with session(store.connect(url)) as s:
        name = s.get(Study, killed.study_id).name
    line = f"{name}: test fold {killed.fold} of reproduction {killed.reproduction}"
    assert any(line in w.output() for w in workers if w is not worker), line
    served = _rows(url)
    assert served.keys() == reference.keys()
    assert len(served) == len(STUDIES) * 2 * 4  # per reproduction: 2 folds, their mean, 512-D
    for key, row in reference.items():
        assert served[key][:3] == row[:3], key  # MAP@R, P@1, R-Precision: the same floats
        assert served[key][3] == row[3] and served[key][4] == row[4], key
    _check_trials_and_members(url)


def _check_trials_and_members(url: str, studies: list[str] = STUDIES) -> None:
    """Every study of the campaign registered once, with its budget of trials complete."""
    engine = store.connect(url)
    with session(engine) as s:
        members = s.execute(select(CampaignStudy)).scalars().all()
        names = dict(s.execute(select(Study.id, Study.name)).all())
        states = [(names[t.study_id], t.state) for t in s.execute(select(Trial)).scalars()]
    engine.dispose()
    assert sorted(names[m.study_id] for m in members) == sorted(studies)
    for name in studies:
        assert [st for n, st in states if n == name].count("complete") == 2, states


def test_a_campaign_worker_refuses_a_study_s_own_options(tmp_path):
    path = tmp_path / "served.yaml"
    path.write_text(yaml.safe_dump(CAMPAIGN))
    done = subprocess.run(
        [sys.executable, "-m", "mlrc.cli", "worker", str(path), "--trials", "3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "error: --trials and --keep are a study's: a campaign takes them from its file"
    )


def test_a_campaign_file_is_told_from_a_study_file(tmp_path):
    from mlrc.config.campaign import is_campaign_file

    campaign, study = tmp_path / "c.yaml", tmp_path / "s.yaml"
    campaign.write_text(yaml.safe_dump(CAMPAIGN))
    study.write_text(yaml.safe_dump({"name": "s", "dataset": {"name": "glyphs"}, "loss": "x"}))
    assert is_campaign_file(campaign) and not is_campaign_file(study)
    assert not is_campaign_file(tmp_path / "missing.yaml")  # the study's loader says why


def test_campaign_run_on_ray_serves_it_with_campaign_workers(tmp_path, fresh_database, reference):
    """``campaign run --backend ray`` on PostgreSQL: two Ray tasks, each a campaign worker, take
    the trials and test folds of every study; the rows are ``campaign run``'s. Two of the four
    losses (the same study names and seeds: the reference's rows for them)."""
    doc = {**CAMPAIGN, "losses": LOSSES[:2]}
    path = tmp_path / "served.yaml"
    path.write_text(yaml.safe_dump(doc))
    cmd = [sys.executable, "-m", "mlrc.cli", "campaign", "run", str(path), "--storage",
           fresh_database, "--artifacts", str(tmp_path / "art"), "--backend", "ray",
           "--max-concurrent", "2", "--threads", "1", "--quiet"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    served = _rows(fresh_database)
    assert served and served == {k: v for k, v in reference.items() if k[0] in doc_studies(doc)}
    _check_trials_and_members(fresh_database, doc_studies(doc))


def test_packed_campaign_workers_share_one_device(tmp_path, fresh_database):
    """``mlrc worker CAMPAIGN.yaml --per-gpu 2``: two campaign workers as children of one
    command (the pre-flight once, in the parent), both serving the campaign to its end."""
    doc = {**CAMPAIGN, "name": "packed", "losses": LOSSES[:2], "search": {"trials": 2, "seed": 1}}
    path = tmp_path / "packed.yaml"
    path.write_text(yaml.safe_dump(doc))
    cmd = [sys.executable, "-m", "mlrc.cli", "worker", str(path), "--storage", fresh_database,
           "--artifacts", str(tmp_path / "art"), "--per-gpu", "2", "--threads", "1"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    pids = [int(p) for p in out.split("pids [", 1)[1].split("]", 1)[0].split(", ")]
    ran = {int(t.user_attrs["worker"].rsplit(":", 1)[1]) for name in doc_studies(doc)
           for t in optuna_trials(fresh_database, name)}  # fmt: skip
    logged = {p for p in pids if f"worker {p} INFO" in out}  # a test fold or rows it took
    assert len(pids) == 2 and ran <= set(pids) and ran | logged == set(pids), (ran, logged)
    shown = subprocess.run(
        [sys.executable, "-m", "mlrc.cli", "campaign", "status", str(path), "--storage",
         fresh_database, "--json"], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    studies = json.loads(shown.stdout)["studies"]
    assert [s["state"] for s in studies] == ["done", "done"], shown.stdout
