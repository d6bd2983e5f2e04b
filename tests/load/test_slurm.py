"""``mlrc slurm`` against a real single-node Slurm (munged, slurmctld, slurmd started here, see
``tests/load/slurm_cluster.py``) and a throwaway PostgreSQL: three worker jobs share one study, one
is cancelled mid-trial with ``scancel``, another gets the time limit's SIGUSR2 and is requeued,
and the study still ends with exactly its budget of complete trials."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import require
from optuna.trial import TrialState
from slurm_cluster import SlurmUnavailable, missing, single_node_slurm
from sqlalchemy import func, select
from test_pool import _engine, check_complete_study, optuna_trials, with_password

from mlrc.store.engine import session
from mlrc.store.schema import FoldRun, Study, Trial

SMALL = {  # cpu preset on 24-px glyphs: a trial is some 10 s on 2 cores, long enough to scancel
    "iterations_per_epoch": 10,
    "max_epochs": 5,
    "validate_every": {"default": 1},
    "patience": {"default": 10},
    "image": {"resize": 18, "crop": 16},
}
TRIALS = 10  # the cancel/requeue test's budget
ENDED = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY"}


def write_study(tmp: Path, name: str, trials: int, **over: object) -> Path:
    doc = {
        "name": name,
        "dataset": {"name": "glyphs", "params": {"size": 24}},
        "preset": "cpu",
        "loss": {"name": "contrastive"},
        "search": {"trials": trials, "sampler": "tpe", "seed": 0},
        "test": {"reproductions": 2},
        "overrides": {**SMALL, **over},
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    require(missing() is None, missing() or "")
    root = tmp_path_factory.mktemp("slurm")
    try:
        with single_node_slurm(root) as c, pytest.MonkeyPatch.context() as mp:
            mp.setenv(
                "SLURM_CONF", str(c.conf)
            )  # for mlrc.search.backends.slurm called in this process
            yield c
    except SlurmUnavailable as e:
        require(False, f"the single-node Slurm did not start: {e}")


def mlrc(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mlrc.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def job_states(cluster, ids: list[str]) -> dict[str, str]:
    out = cluster.run("squeue", "-h", "-r", "--states=all", "-o", "%i|%T", check=False)
    states = dict(line.split("|", 1) for line in out.split() if "|" in line)
    return {i: states.get(i, "GONE") for i in ids}


def test_three_jobs_one_cancelled_one_requeued(cluster, tmp_path, fresh_database):
    from mlrc.search.backends import slurm

    url = with_password(fresh_database)
    # 10 trials for 3 workers: a second job still runs one after the first is cancelled, even
    # when Slurm starts the jobs seconds apart on a loaded machine (with 8, a run beside the
    # pool bench once ended before the second look found a trial to stop)
    study = write_study(tmp_path, "slurm-a", trials=TRIALS)
    art = tmp_path / "shared-artifacts"
    env = {**cluster.env(), "MLRC_STORAGE": url, "OMP_NUM_THREADS": "1"}
    out = mlrc(
        *("slurm", "submit", str(study), "--workers", "3", "--partition", cluster.partition),
        *("--time", "00:10:00", "--artifacts", str(art), "--threads", "1"),
        *("--heartbeat", "1", "--grace", "4"),
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert "submitted 3 worker jobs for study slurm-a" in out.stdout
    ids = [j["id"] for j in json.loads((art / "slurm/slurm-a/jobs.json").read_text())["jobs"]]
    assert len(ids) == 3 and out.stdout.split(": ", 1)[1].split() == ids
    assert "s3cret" not in out.stdout + out.stderr

    def job_running_a_trial(but: tuple[str, ...] = ()) -> slurm.JobRow:
        """A job whose worker runs a trial (Slurm's view and the store's, joined by mlrc.search.backends.slurm)."""
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            st = slurm.slurm_status("slurm-a", url, art)
            assert st.counts["complete"] < TRIALS, "the study ended before a job could be stopped"
            running = [j for j in st.jobs if j.state == "RUNNING" and j.trials and j.id not in but]
            job = next((j for j in running if just_started(j.trials[0])), None)
            if job is not None:
                return job
            time.sleep(0.5)
        pytest.fail(f"no job ran a trial: {st}\n{cluster.logs()}")

    def just_started(trial: int) -> bool:
        """At most 1 of its 4 folds done: half of it is still to run when the signal comes (a
        trial that ends between this look and scancel would be complete, not interrupted). Not
        a time since it started: on a loaded machine a look takes seconds."""
        with session(_engine(url)) as s:
            done = s.execute(
                select(func.count())
                .select_from(FoldRun)
                .join(Study, FoldRun.study_id == Study.id)
                .filter(Study.name == "slurm-a", FoldRun.trial_number == trial)
                .filter(FoldRun.kind == "search", FoldRun.status == "complete")
            ).scalar()
        return done <= 1

    def log(job: str) -> str:
        return (art / f"slurm/slurm-a/{job}/{job}_0_log.out").read_text()

    # scancel: Slurm's SIGTERM reaches the workers, the trial is marked interrupted at once
    cancelled = job_running_a_trial()
    cluster.run("scancel", cancelled.id)
    shown = mlrc("slurm", "status", str(study), "--artifacts", str(art), env=env)
    assert shown.returncode == 0, shown.stderr
    assert all(i in shown.stdout for i in ids) and "RUNNING" in shown.stdout, shown.stdout
    assert "trials:" in shown.stdout and f"of {TRIALS}" in shown.stdout, shown.stdout

    # the time limit's (or a preemption's) SIGUSR2: submitit stops the workers and requeues
    requeued = job_running_a_trial(but=(cancelled.id,))
    cluster.run("scancel", "--signal=USR2", requeued.id)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and job_states(cluster, [requeued.id])[requeued.id] not in (
        "PENDING",
        "REQUEUED",
    ):
        time.sleep(0.5)
    assert job_states(cluster, [requeued.id])[requeued.id] in ("PENDING", "REQUEUED")
    assert f"Requeued job {requeued.id}" in log(requeued.id), log(requeued.id)
    cluster.run("scancel", requeued.id)  # Slurm holds a requeued job back for minutes

    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not set(job_states(cluster, ids).values()) <= ENDED:
        time.sleep(1)
    states = job_states(cluster, ids)
    logs = "\n".join(p.read_text() for p in art.glob("slurm/slurm-a/*/*.out"))
    assert set(states.values()) <= ENDED, f"{states}\n{logs}"
    assert states[cancelled.id] == states[requeued.id] == "CANCELLED"
    assert [s for i, s in states.items() if i not in (cancelled.id, requeued.id)] == ["COMPLETED"]

    check_complete_study(url, "slurm-a", TRIALS)  # exactly the budget; one fold row per fold
    ts = {t.number: t for t in optuna_trials(url, "slurm-a")}
    for job in (cancelled, requeued):
        trial = job.trials[0]
        assert ts[trial].state == TrialState.FAIL
        # its retries (a retry may itself be stopped: the other job's signal can reach it
        # there, and it is retried in turn): every one interrupted but the last, which completes
        family, grown = {trial}, True
        while grown:
            more = {n for n, t in ts.items() if t.user_attrs.get("retry_of") in family}
            grown, family = not more <= family, family | more
        retries = sorted((ts[n] for n in family - {trial}), key=lambda t: t.number)
        assert [t.state for t in retries] == [TrialState.FAIL] * (len(retries) - 1) + [
            TrialState.COMPLETE
        ]
        assert all(t.params == ts[trial].params for t in retries)
        with session(_engine(url)) as s:
            row = s.execute(select(Trial).filter_by(number=trial)).scalar_one()
        assert row.state == "interrupted"
        # stopped by a SIGTERM, recorded at once (not found stale after the heartbeat's grace)
        assert f"interrupted (SIGTERM): trial {trial} marked interrupted" in log(job.id), logs
    assert "s3cret" not in logs  # the URL reached the workers by environment, masked in logs

    shown = mlrc("slurm", "status", str(study), "--artifacts", str(art), env=env)
    assert shown.returncode == 0, shown.stderr
    assert f"{TRIALS} complete of {TRIALS}" in shown.stdout, shown.stdout
    assert "CANCELLED" in shown.stdout, shown.stdout


def test_a_job_runs_one_two_rank_worker(cluster, tmp_path, fresh_database):
    """``--procs-per-trial 2`` on a CPU job: one worker whose folds train as 2 gloo ranks, the
    job's CPUs counting both."""
    from mlrc.search.backends import slurm

    url = with_password(fresh_database)
    # its crops are random: K is the study's (processes_per_trial), the flag must match it
    study = write_study(tmp_path, "slurm-k2", trials=1, processes_per_trial=2)
    art = tmp_path / "shared-artifacts"
    env = {**cluster.env(), "MLRC_STORAGE": url, "OMP_NUM_THREADS": "1"}
    out = mlrc(
        *("slurm", "submit", str(study), "--workers", "1", "--partition", cluster.partition),
        *("--time", "00:10:00", "--artifacts", str(art), "--procs-per-trial", "2"),
        env=env,
    )
    assert out.returncode == 0, out.stderr
    (job,) = [j["id"] for j in json.loads((art / "slurm/slurm-k2/jobs.json").read_text())["jobs"]]
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and job_states(cluster, [job])[job] not in ENDED:
        time.sleep(1)
    log = "\n".join(p.read_text() for p in art.glob("slurm/slurm-k2/*/*.out"))
    assert job_states(cluster, [job])[job] == "COMPLETED", f"{log}\n{cluster.logs()}"
    assert "--procs-per-trial 2" in " ".join(
        slurm.WorkerJob("s", "u", "a", "f", procs=2).commands()[0]
    )
    check_complete_study(url, "slurm-k2", 1)
    with session(_engine(url)) as s:
        rows = s.execute(select(FoldRun)).scalars().all()
    assert len(rows) == 4 and all(r.provenance["processes"] == 2 for r in rows)


def test_procs_per_trial_and_gpus_that_do_not_split_are_refused(tmp_path):
    study = write_study(tmp_path, "slurm-d", trials=1)
    out = mlrc(
        *("slurm", "submit", str(study), "--workers", "1", "--time", "1:00:00"),
        *("--storage", "postgresql+psycopg://u@localhost/db", "--artifacts", str(tmp_path / "a")),
        *("--procs-per-trial", "2", "--gpus-per-worker", "3"),
    )
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "multiple of 2" in out.stderr, out.stderr


def test_sqlite_is_refused_in_one_line(tmp_path):
    study = write_study(tmp_path, "slurm-b", trials=1)
    out = mlrc(
        *("slurm", "submit", str(study), "--workers", "2", "--time", "1:00:00"),
        *("--storage", f"sqlite:///{tmp_path / 'x.db'}", "--artifacts", str(tmp_path / "a")),
    )
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "PostgreSQL" in out.stderr, out.stderr


def test_missing_sbatch_is_refused_in_one_line(tmp_path):
    study = write_study(tmp_path, "slurm-c", trials=1)
    bin_dir = tmp_path / "bin"  # an empty PATH: no sbatch (python is called by its path)
    bin_dir.mkdir()
    out = mlrc(
        *("slurm", "submit", str(study), "--workers", "2", "--time", "1:00:00"),
        *("--storage", "postgresql+psycopg://u@localhost/db", "--artifacts", str(tmp_path / "a")),
        env={"PATH": str(bin_dir), "HOME": str(tmp_path)},
    )
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "sbatch not found" in out.stderr, out.stderr


def test_unknown_partition_is_one_line(cluster, tmp_path, fresh_database):
    study = write_study(tmp_path, "slurm-d", trials=1)
    out = mlrc(
        *("slurm", "submit", str(study), "--workers", "2", "--time", "00:05:00"),
        *("--partition", "nosuch", "--artifacts", str(tmp_path / "a")),
        env={**cluster.env(), "MLRC_STORAGE": fresh_database},
    )
    assert out.returncode == 2
    line = out.stderr.strip()
    assert line.count("\n") == 0 and "partition" in line.lower(), line
    assert not (tmp_path / "a/slurm/slurm-d/jobs.json").exists()


def test_an_array_of_workers(cluster, tmp_path, fresh_database):
    study = write_study(tmp_path, "slurm-e", trials=1)
    art = tmp_path / "a"
    out = mlrc(
        *("slurm", "submit", str(study), "--workers", "2", "--time", "00:05:00", "--array"),
        *("--artifacts", str(art), "--cpus-per-worker", "2"),
        env={**cluster.env(), "MLRC_STORAGE": fresh_database},
    )
    assert out.returncode == 0, out.stderr
    ids = [j["id"] for j in json.loads((art / "slurm/slurm-e/jobs.json").read_text())["jobs"]]
    array = ids[0].split("_")[0]
    assert ids == [f"{array}_0", f"{array}_1"]
    script = next(art.glob("slurm/slurm-e/*/*_submission.sh")).read_text()
    assert "#SBATCH --array=0-1%2" in script and "#SBATCH --cpus-per-task=2" in script
    assert "#SBATCH --signal=USR2@90" in script and "#SBATCH --time=5" in script
    assert "postgresql" not in script  # the URL is in the job's pickle, not its script
    assert (art / "slurm/slurm-e").stat().st_mode & 0o077 == 0
    cluster.run("scancel", array)


def test_the_workers_of_one_job():
    from mlrc.search.backends.slurm import WorkerJob

    job = WorkerJob("s.yaml", "postgresql://u:pw@h/db", "/art", "/art/slurm/s", gpus=2, per_gpu=2)
    job.threads, job.grace = 3, 20
    commands = job.commands()
    devices = [c[c.index("--device") + 1] for c in commands]
    assert devices == ["cuda:0", "cuda:0", "cuda:1", "cuda:1"]
    assert all(c[2:5] == ["mlrc.cli", "worker", "s.yaml"] for c in commands)
    assert all("--threads" in c and "--grace" in c for c in commands)
    assert not any("pw" in " ".join(c) for c in commands)  # by environment, never argv
    (cpu,) = WorkerJob("s.yaml", "u", "/a", "/f").commands()  # no GPU: one worker on cpu
    assert cpu[cpu.index("--device") + 1] == "cpu" and "--threads" not in cpu
    job._procs = [object()]
    assert pickle.loads(pickle.dumps(job))._procs == []  # submitit pickles no live processes


@pytest.mark.parametrize(
    ("text", "minutes"),
    [("00:10:00", 10), ("1:00:01", 61), ("90", 90), ("5:30", 6), ("1-02:00:00", 1560)],
)
def test_time_limits(text, minutes):
    from mlrc.search.backends.slurm import parse_time

    assert parse_time(text) == minutes


@pytest.mark.parametrize("text", ["", "ab", "0", "1:2:3:4"])
def test_bad_time_limits(text):
    from mlrc.search.backends.slurm import SlurmError, parse_time

    with pytest.raises(SlurmError, match="--time"):
        parse_time(text)


def test_an_array_of_campaign_workers_serves_a_small_campaign(cluster, tmp_path, fresh_database):
    """``mlrc slurm submit CAMPAIGN.yaml --array``: every task serves the whole campaign (each
    study's trials and test folds, whichever study they belong to) until it is done."""
    doc = {
        "name": "slurm-c",
        "datasets": [{"name": "glyphs", "params": {"size": 24}}],
        "losses": ["contrastive", "triplet"],
        "preset": "cpu",
        "search": {"trials": 1, "seed": 0},
        "test": {"reproductions": 2},
        "overrides": {**SMALL, "max_epochs": 1, "folds": 2},
    }
    path = tmp_path / "slurm-c.yaml"
    path.write_text(yaml.safe_dump(doc))
    art = tmp_path / "a"
    env = {**cluster.env(), "MLRC_STORAGE": fresh_database, "OMP_NUM_THREADS": "1"}
    out = mlrc(
        *("slurm", "submit", str(path), "--workers", "2", "--time", "00:10:00", "--array"),
        *("--artifacts", str(art), "--partition", cluster.partition, "--threads", "1"),
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert "submitted 2 worker jobs for campaign slurm-c" in out.stdout
    ids = [j["id"] for j in json.loads((art / "slurm/slurm-c/jobs.json").read_text())["jobs"]]
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and set(job_states(cluster, ids).values()) - ENDED - {"GONE"}:
        time.sleep(1)
    logs = "".join(p.read_text() for p in art.glob("slurm/slurm-c/*/*_log.*"))
    assert set(job_states(cluster, ids).values()) <= ENDED | {"GONE"}, logs
    shown = mlrc("campaign", "status", str(path), "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    studies = json.loads(shown.stdout)["studies"]
    assert [s["state"] for s in studies] == ["done", "done"], (shown.stdout, logs)
