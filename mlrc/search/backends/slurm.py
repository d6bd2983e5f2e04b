"""``mlrc worker`` jobs on a Slurm cluster, through submitit.

:func:`submit` sends N Slurm jobs (or one job array of N tasks), each running
:class:`WorkerJob`: ``python -m mlrc.cli worker STUDY`` once per GPU of the job (``--per-gpu K``:
K of them on each GPU), all on the study's PostgreSQL URL, exactly the pool of
:mod:`mlrc.search` (global budget, heartbeats, retry of a trial whose worker died). The job ids
go to ``<artifacts>/slurm/<study>/jobs.json``; submitit's pickles and the jobs' logs beside them.

A job that Slurm stops is a stopped worker:

- ``scancel``, preemption (SIGTERM), the node lost: the workers receive SIGTERM from Slurm (and
  from the job's Python process, which forwards it), record their running trial as
  interrupted and exit; the pool retries it with the same parameters, reusing its finished
  folds. A worker killed outright (SIGKILL, a dead node) is retried after the heartbeat grace.
- the time limit (Slurm's ``--signal=USR2@90`` that submitit asks for): submitit calls
  :meth:`WorkerJob.checkpoint`, which stops the workers as above, and requeues the same job,
  whose new workers go on with the study (a study is resumable by construction).

The workers ignore SIGUSR2 (it is the job's Python process that decides on a requeue). Which
trial a job runs: each job writes the host and pids of its workers to
``<artifacts>/slurm/<study>/workers/<job id>.json``, and a running trial's ``worker`` user
attribute is ``host:pid`` (:mod:`mlrc.search.backends.local`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "JobRow",
    "SlurmError",
    "SlurmStatus",
    "WorkerJob",
    "job_parameters",
    "jobs_folder",
    "parse_time",
    "slurm_status",
    "submit",
]

STOP_WAIT_S = 60  # how long a stopped job waits for its workers to record their trials


class SlurmError(RuntimeError):
    """An expected failure of ``mlrc slurm``: one line for the user."""


def jobs_folder(artifacts: Path, study: str) -> Path:
    """Where the jobs of ``study`` are recorded: ``<artifacts>/slurm/<study>``."""
    return Path(artifacts).absolute() / "slurm" / study


def parse_time(text: str) -> int:
    """Slurm's time limit forms (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH[:MM[:SS]]``) → whole
    minutes, rounded up (submitit counts minutes)."""
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text.strip())
    if not m or (m.group(1) is None and m.group(3) is None and m.group(4) is not None):
        raise SlurmError(f"--time {text!r}: use HH:MM:SS (or MM, MM:SS, D-HH:MM:SS)")
    days, a, b, c = (int(g) if g else 0 for g in m.groups())
    if m.group(1) is not None:  # D-HH[:MM[:SS]]
        seconds = days * 86400 + a * 3600 + b * 60 + c
    elif m.group(4) is not None:  # HH:MM:SS
        seconds = a * 3600 + b * 60 + c
    elif m.group(3) is not None:  # MM:SS
        seconds = a * 60 + b
    else:  # MM
        seconds = a * 60
    if seconds <= 0:
        raise SlurmError(f"--time {text!r}: the time limit must be positive")
    return -(-seconds // 60)


def _exited(p: subprocess.Popen) -> bool:
    """Whether the child has exited, without reaping it (another frame may be waiting on it)."""
    if p.returncode is not None:
        return True
    try:
        return os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _ignore_usr2() -> None:
    """In a worker, before exec: the time-limit signal is the job's, not the worker's."""
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


@dataclass
class WorkerJob:
    """What one Slurm job runs: ``python -m mlrc.cli worker STUDY`` once per GPU (``cuda:i``;
    ``cpu`` without GPUs), ``per_gpu`` times each, and waits for them. The storage URL reaches
    the workers through the environment (``MLRC_STORAGE``), never a command line."""

    study_file: str
    storage: str
    artifacts: str
    folder: str
    gpus: int = 0
    per_gpu: int = 1
    heartbeat: int = 30
    grace: int | None = None
    threads: int | None = None
    mps: bool = False  # under the job script's CUDA MPS daemon (mlrc.search.backends.mps.job_setup)
    procs: int = 1  # ranks per fold: each worker takes ``procs`` of the job's GPUs
    _procs: list[subprocess.Popen] = field(default_factory=list, repr=False)

    def __getstate__(self) -> dict[str, Any]:  # pickled by submitit: no live processes
        return {k: v for k, v in vars(self).items() if k != "_procs"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        vars(self).update(state, _procs=[])

    def commands(self) -> list[list[str]]:
        """One ``mlrc worker`` command per worker process of the job: ``per_gpu`` per GPU, or
        (``procs`` K > 1) one K-rank worker per K GPUs, or on the CPU without GPUs."""
        if self.procs > 1:
            k = self.procs
            groups = [[f"cuda:{i + j}" for j in range(k)] for i in range(0, self.gpus, k)]
            return [self.command(g[0], g) for g in groups] or [self.command("cpu", ["cpu"] * k)]
        devices = [f"cuda:{i}" for i in range(self.gpus)] or ["cpu"]
        return [self.command(d) for d in devices for _ in range(self.per_gpu)]

    def command(self, device: str, ranks: list[str] | None = None) -> list[str]:
        cmd = [sys.executable, "-m", "mlrc.cli", "worker", self.study_file, "--quiet"]
        cmd += ["--artifacts", self.artifacts, "--device", device]
        if ranks:  # K ranks per fold on these devices
            cmd += ["--procs-per-trial", str(len(ranks)), "--devices", ",".join(ranks)]
        cmd += ["--heartbeat", str(self.heartbeat)]
        cmd += ["--grace", str(self.grace)] if self.grace else []
        cmd += ["--threads", str(self.threads)] if self.threads else []
        return cmd

    def __call__(self) -> dict[str, int]:
        import submitit

        job_id = submitit.JobEnvironment().job_id
        env = {**os.environ, "MLRC_STORAGE": self.storage}
        if self.mps:  # the MPS server numbers the job's GPUs 0, 1, …: see mlrc.search.backends.mps
            env.pop("CUDA_VISIBLE_DEVICES", None)
        signal.signal(signal.SIGTERM, self._forward)  # submitit's own handler only logs it
        self._procs = [
            subprocess.Popen(cmd, env=env, preexec_fn=_ignore_usr2)  # noqa: PLW1509
            for cmd in self.commands()
        ]
        record = {"job": job_id, "host": socket.gethostname(), "pids": [p.pid for p in self._procs]}
        workers = Path(self.folder) / "workers"
        workers.mkdir(parents=True, exist_ok=True)
        (workers / f"{job_id}.json").write_text(json.dumps(record))
        codes = [p.wait() for p in self._procs]
        bad = [c for c in codes if c not in (0, 143, -signal.SIGTERM)]
        if bad:
            raise RuntimeError(f"mlrc worker exited with code {bad[0]} (see the log above)")
        return {"workers": len(codes), "stopped": sum(c != 0 for c in codes)}

    def _forward(self, signum: int, _frame: object) -> None:
        for p in self._procs:
            if p.poll() is None:
                p.send_signal(signum)

    def stop_workers(self) -> None:
        """SIGTERM to the workers, then wait: each records its running trial as interrupted.
        (Called from a signal handler while ``__call__`` waits on them: hence no Popen.wait.)"""
        self._forward(signal.SIGTERM, None)
        deadline = time.monotonic() + STOP_WAIT_S
        while time.monotonic() < deadline and not all(map(_exited, self._procs)):
            time.sleep(0.2)
        for p in self._procs:
            if not _exited(p):
                p.kill()

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """Called by submitit at the time limit (or on preemption signalled by SIGUSR2): stop
        the workers (their trials are retried), then requeue this same job."""
        from submitit.core.utils import DelayedSubmission

        self.stop_workers()
        return DelayedSubmission(self, *args, **kwargs)


def _check_submittable(storage: str) -> None:
    if storage.split(":", 1)[0].split("+", 1)[0] != "postgresql":
        raise SlurmError(
            "Slurm jobs need a PostgreSQL URL shared by all nodes (--storage postgresql://…), "
            f"not {storage.split(':', 1)[0]}"
        )
    if shutil.which("sbatch") is None:
        raise SlurmError("sbatch not found: run mlrc slurm on a Slurm login node (Slurm's client)")


def submit(
    study_file: Path,
    study: str,
    storage: str,
    artifacts: Path,
    *,
    workers: int,
    partition: str | None,
    time_limit: str,
    gpus_per_worker: int = 0,
    per_gpu: int = 1,
    cpus_per_worker: int = 1,
    mem: str | None = None,
    array: bool = False,
    heartbeat: int = 30,
    grace: int | None = None,
    threads: int | None = None,
    extra: dict[str, Any] | None = None,
    mps: bool = False,
    procs: int = 1,
) -> list[str]:
    """Submit ``workers`` Slurm jobs (one array of ``workers`` tasks with ``array``) running
    :class:`WorkerJob`; record their ids in ``jobs.json``; return them. ``mps``: each job
    starts a CUDA MPS daemon before its workers and stops it after them
    (:mod:`mlrc.search.backends.mps`). ``procs`` K > 1: each worker trains a fold as K ranks,
    on K of the job's GPUs (``gpus_per_worker`` a multiple of K) or on its CPUs."""
    # size: 19 keyword parameters, one per sbatch option; the body is 40 lines
    import submitit

    from mlrc import store

    if mps and not gpus_per_worker:
        raise SlurmError(
            "--mps shares the jobs' GPUs between packed workers: it needs "
            "--gpus-per-worker N (N ≥ 1)"
        )
    if procs > 1 and (gpus_per_worker % procs or per_gpu > 1 or mps):
        why = f"--gpus-per-worker must be 0 (CPU) or a multiple of {procs}, without --per-gpu/--mps"
        raise SlurmError(f"--procs-per-trial {procs}: {why} (got {gpus_per_worker} GPUs)")
    _check_submittable(storage)
    minutes = parse_time(time_limit)
    store.connect(storage).dispose()  # reachable (StoreError: one line) before N jobs find out
    folder = jobs_folder(artifacts, study)
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)  # submitit's pickles hold the storage URL
    job = WorkerJob(
        study_file=str(Path(study_file).absolute()),
        storage=storage,
        artifacts=str(Path(artifacts).absolute()),
        folder=str(folder),
        gpus=gpus_per_worker,
        per_gpu=per_gpu,
        heartbeat=heartbeat,
        grace=grace,
        threads=threads,
        mps=mps,
        procs=procs,
    )
    executor = submitit.SlurmExecutor(folder=folder / "%j", max_num_timeout=10)
    executor.update_parameters(
        **job_parameters(
            study,
            minutes,
            workers,
            partition=partition,
            gpus_per_worker=gpus_per_worker,
            per_gpu=per_gpu,
            cpus_per_worker=cpus_per_worker,
            mem=mem,
            extra=extra,
            mps=mps,
            procs=procs,
        )
    )
    with _sbatch_stderr() as said:
        try:
            if array:
                with executor.batch():
                    jobs = [executor.submit(job) for _ in range(workers)]
            else:
                jobs = [executor.submit(job) for _ in range(workers)]
        except Exception as e:  # submitit's FailedJobError carries sbatch's whole output
            raise SlurmError(f"sbatch refused the jobs: {_sbatch_line(said(), e)}") from None
    ids = [str(j.job_id) for j in jobs]
    _record(folder, ids, partition, minutes, gpus_per_worker, per_gpu, array)
    return ids


def job_parameters(
    study: str,
    minutes: int,
    workers: int,
    *,
    partition: str | None = None,
    gpus_per_worker: int = 0,
    per_gpu: int = 1,
    cpus_per_worker: int = 1,
    mem: str | None = None,
    extra: dict[str, Any] | None = None,
    mps: bool = False,
    procs: int = 1,
) -> dict[str, Any]:
    """submitit's ``SlurmExecutor`` parameters of the study's worker jobs: one node, one task,
    ``cpus_per_worker`` × the job's worker processes (× ``procs`` ranks each: every rank counts),
    ``gres gpu:N``; with ``mps`` the job
    script's setup lines start a CUDA MPS daemon and its teardown lines stop it
    (:func:`mlrc.search.backends.mps.job_setup`, :func:`mlrc.search.backends.mps.job_teardown`)."""
    from mlrc.search.backends.mps import job_setup, job_teardown

    params: dict[str, Any] = {
        "job_name": f"mlrc-{study}",
        "time": minutes,
        "nodes": 1,
        "ntasks_per_node": 1,
        "cpus_per_task": cpus_per_worker * per_gpu * max(1, gpus_per_worker, procs),
        "stderr_to_stdout": True,
        "array_parallelism": workers,
        "additional_parameters": dict(extra or {}),
    }
    if partition:
        params["partition"] = partition
    if gpus_per_worker:
        params["gres"] = f"gpu:{gpus_per_worker}"
    if mem:
        params["mem"] = mem
    if mps:
        params["setup"], params["teardown"] = job_setup(), job_teardown()
    return params


@contextlib.contextmanager
def _sbatch_stderr() -> Iterator[Callable[[], str]]:
    """sbatch's stderr (submitit lets it through) captured at the file descriptor, so that a
    refusal is one line; what it said on success (warnings) is passed on afterwards."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        text: list[str] = []

        def said() -> str:
            if not text:
                os.dup2(saved, 2)
                tmp.seek(0)
                text.append(tmp.read().decode(errors="replace"))
            return text[0]

        ok = False
        try:
            yield said
            ok = True
        finally:
            out = said()
            os.close(saved)
            if ok and out.strip():
                sys.stderr.write(out)


def _sbatch_line(stderr: str, e: BaseException) -> str:
    """sbatch's first error line (``sbatch: error: …``), else the last line of submitit's."""
    lines = [ln.strip() for ln in (stderr + "\n" + str(e)).splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.lower().startswith("sbatch: error:")]
    line = errors[0] if errors else (lines or [type(e).__name__])[-1]
    return line.removeprefix("sbatch: error: ")


def _record(folder: Path, ids: list[str], *settings: Any) -> None:
    path = folder / "jobs.json"
    doc = json.loads(path.read_text()) if path.is_file() else {"jobs": []}
    partition, minutes, gpus, per_gpu, array = settings
    when = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    for job_id in ids:
        doc["jobs"].append(
            {
                "id": job_id,
                "submitted": when,
                "partition": partition,
                "time_min": minutes,
                "gpus": gpus,
                "per_gpu": per_gpu,
                "array": array,
            }
        )
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(path)


# --- status ------------------------------------------------------------------------------------


@dataclass
class JobRow:
    id: str
    state: str
    node: str
    elapsed: str
    trials: list[int]  # the trials its workers are running now


@dataclass
class SlurmStatus:
    study: str
    jobs: list[JobRow]
    counts: dict[str, int]  # complete, running, failed, waiting (Optuna), retried
    budget: int | None


def _squeue(ids: list[str]) -> dict[str, tuple[str, str, str]]:
    """id → (state, node, elapsed) for the jobs Slurm still knows (squeue, then sacct)."""
    base = sorted({i.split("_", 1)[0] for i in ids})
    found: dict[str, tuple[str, str, str]] = {}
    if not base:
        return found
    out = subprocess.run(
        ["squeue", "-h", "-r", "--states=all", "-j", ",".join(base), "-o", "%i|%T|%N|%M"],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    for line in out.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 4:
            found[parts[0]] = (parts[1], parts[2], parts[3])
    missing = [i for i in ids if i not in found]
    if missing and shutil.which("sacct"):
        out = subprocess.run(
            [
                "sacct",
                "-X",
                "-n",
                "-P",
                "-j",
                ",".join(missing),
                "-o",
                "JobID,State,NodeList,Elapsed",
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
        for line in out.stdout.splitlines() if out.returncode == 0 else []:
            parts = line.strip().split("|")
            if len(parts) == 4:
                found.setdefault(parts[0], (parts[1].split()[0], parts[2], parts[3]))
    return found


def slurm_status(study: str, storage: str, artifacts: Path) -> SlurmStatus:
    """The recorded jobs of ``study`` (state, node, elapsed, the trials they run) beside its
    trials' counts."""
    import optuna
    from optuna.trial import TrialState

    from mlrc import store

    folder = jobs_folder(artifacts, study)
    path = folder / "jobs.json"
    ids = [j["id"] for j in json.loads(path.read_text())["jobs"]] if path.is_file() else []
    slurm = _squeue(ids) if shutil.which("squeue") else {}

    engine = store.connect(storage)  # an unreachable store: StoreError, one line
    try:
        st = store.studies.study_named(engine, study)
        budget = st.config.get("trials") if st is not None else None
    finally:
        engine.dispose()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trials = []
    if st is not None:
        storage_ = store.optuna_storage(storage)
        with contextlib.suppress(KeyError):  # mlrc's row is written before Optuna's study
            trials = optuna.load_study(study_name=study, storage=storage_).get_trials(False)
    by_worker: dict[str, list[int]] = {}
    for t in trials:
        if t.state == TrialState.RUNNING and "worker" in t.user_attrs:
            by_worker.setdefault(str(t.user_attrs["worker"]), []).append(t.number)
    rows = []
    for job_id in ids:
        state, node, elapsed = slurm.get(job_id, ("GONE", "", ""))
        running: list[int] = []
        record = folder / "workers" / f"{job_id}.json"
        if record.is_file() and state in ("RUNNING", "COMPLETING"):
            w = json.loads(record.read_text())
            for pid in w["pids"]:
                running += by_worker.get(f"{w['host']}:{pid}", [])
        rows.append(JobRow(job_id, state, node, elapsed, sorted(running)))
    counts = {
        "complete": sum(t.state == TrialState.COMPLETE for t in trials),
        "running": sum(t.state == TrialState.RUNNING for t in trials),
        "failed": sum(t.state == TrialState.FAIL for t in trials),
        "waiting": sum(t.state == TrialState.WAITING for t in trials),
        "retried": sum("retry_of" in t.user_attrs for t in trials),
    }
    return SlurmStatus(study, rows, counts, budget)
