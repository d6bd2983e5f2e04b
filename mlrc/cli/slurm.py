"""``mlrc slurm submit|status``: ``mlrc worker`` jobs on a Slurm cluster (:mod:`mlrc.search.backends.slurm`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mlrc.cli.options import DEFAULT_ARTIFACTS, ThreadsOpt
from mlrc.cli.terminal import console, fail, user_errors

__all__ = ["slurm_app", "slurm_status", "slurm_submit"]

slurm_app = typer.Typer(
    no_args_is_help=True,
    help="Slurm: submit `mlrc worker` jobs on the study's PostgreSQL URL, and watch them.",
)

StudyArg = Annotated[Path, typer.Argument(help="study or campaign YAML")]
SlurmStorageOpt = Annotated[
    str,
    typer.Option(
        "--storage", envvar="MLRC_STORAGE", help="PostgreSQL URL shared by the jobs (required)"
    ),
]
SharedArtifactsOpt = Annotated[
    Path,
    typer.Option(
        "--artifacts",
        envvar="MLRC_ARTIFACTS",
        help="checkpoint directory on a file system every node mounts (the jobs' logs too)",
    ),
]


def _study_name(study_file: Path) -> str:
    return _study(study_file)[0]


def _study(study_file: Path) -> tuple[str, int, str]:
    """The study's (or campaign's) name and the processes per trial of its preset (a
    campaign's: the most any of its studies asks), and ``study NAME`` or ``campaign NAME``; a
    problem: one line, exit 2."""
    from mlrc.config import load_study
    from mlrc.config.campaign import is_campaign_file, load_campaign, resolve_campaign

    with user_errors():
        if is_campaign_file(study_file):
            cfg = load_campaign(study_file)
            plan = resolve_campaign(cfg, str(study_file))
            procs = max(r.preset.processes_per_trial for _, r in plan)
            return cfg.name, procs, f"campaign {cfg.name}"
        resolved = load_study(study_file)
        name = resolved.study.name
        return name, resolved.preset.processes_per_trial, f"study {name}"


@slurm_app.command("submit")
def slurm_submit(
    study_file: StudyArg,
    workers: Annotated[int, typer.Option("--workers", min=1, help="Slurm jobs (workers)")],
    time: Annotated[
        str, typer.Option("--time", help="time limit of each job, HH:MM:SS (requeued at the end)")
    ],
    storage: SlurmStorageOpt = "",
    artifacts: SharedArtifactsOpt = DEFAULT_ARTIFACTS,
    partition: Annotated[
        str | None, typer.Option("--partition", help="Slurm partition (default: the cluster's)")
    ] = None,
    gpus_per_worker: Annotated[
        int, typer.Option("--gpus-per-worker", min=0, help="GPUs per job (gres gpu:N); 0: CPU")
    ] = 0,
    per_gpu: Annotated[
        int,
        typer.Option("--per-gpu", min=1, help="worker processes per GPU (packs small trials)"),
    ] = 1,
    cpus_per_worker: Annotated[
        int, typer.Option("--cpus-per-worker", min=1, help="CPUs per worker process")
    ] = 1,
    mem: Annotated[str | None, typer.Option("--mem", help="memory per job, e.g. 16G")] = None,
    array: Annotated[bool, typer.Option("--array", help="one job array of N tasks")] = False,
    heartbeat: Annotated[int, typer.Option(help="heartbeat interval of a running trial, s")] = 30,
    grace: Annotated[
        int | None, typer.Option(help="a trial without heartbeat this long is retried, s (4×)")
    ] = None,
    threads: ThreadsOpt = None,
    mps: Annotated[
        bool,
        typer.Option(
            "--mps",
            help="each job runs its --per-gpu workers under CUDA MPS (the job script starts "
            "and stops the daemon)",
        ),
    ] = False,
    procs_per_trial: Annotated[
        int | None,
        typer.Option(
            "--procs-per-trial",
            min=1,
            help="each worker trains a fold as K ranks on K of the job's GPUs (--gpus-per-worker "
            "a multiple of K; one K-rank worker per job when equal) or on its CPUs (default: "
            "the preset's processes_per_trial)",
        ),
    ] = None,
) -> None:
    """Submit N Slurm jobs, each running `mlrc worker` (K per GPU with --per-gpu K) on the
    study's PostgreSQL URL; given a campaign file, each worker serves the whole campaign. A cancelled or preempted job's trial is retried by the others; a job
    at its time limit is requeued. Job ids are recorded under ARTIFACTS/slurm/STUDY/. With --mps
    each job starts a CUDA MPS daemon for its GPUs before its workers and stops it after them."""
    # size: a typer command: its options, one per line; the body is 30 lines
    from mlrc.search.backends.slurm import SlurmError, submit

    if not storage:
        fail("--storage (or MLRC_STORAGE) is required: the PostgreSQL URL the jobs share")
    if heartbeat < 1 or (grace is not None and grace <= heartbeat):
        fail("--heartbeat must be ≥ 1 s and --grace longer than --heartbeat")
    name, procs, what = _study(study_file)
    with user_errors():  # an unreachable store: one line
        try:
            ids = submit(
                study_file,
                name,
                storage,
                artifacts,
                workers=workers,
                partition=partition,
                time_limit=time,
                gpus_per_worker=gpus_per_worker,
                per_gpu=per_gpu,
                cpus_per_worker=cpus_per_worker,
                mem=mem,
                array=array,
                heartbeat=heartbeat,
                grace=grace,
                threads=threads,
                mps=mps,
                procs=procs_per_trial or procs,
            )
        except SlurmError as e:
            fail(str(e))
    console.print(
        f"submitted {len(ids)} worker jobs for {what}: {' '.join(ids)}",
        soft_wrap=True,
        highlight=False,
    )


@slurm_app.command("status")
def slurm_status(
    study_file: StudyArg,
    storage: SlurmStorageOpt = "",
    artifacts: SharedArtifactsOpt = DEFAULT_ARTIFACTS,
) -> None:
    """The study's Slurm jobs (state, node, elapsed, the trials they run) beside its trials."""
    from rich.table import Table

    from mlrc.search.backends import slurm

    if not storage:
        fail("--storage (or MLRC_STORAGE) is required: the PostgreSQL URL the jobs share")
    name = _study_name(study_file)
    with user_errors():
        st = slurm.slurm_status(name, storage, artifacts)
    table = Table(title=f"Slurm jobs of study {name}")
    for col in ("job", "state", "node", "elapsed", "running trials"):
        table.add_column(col)
    for j in st.jobs:
        table.add_row(j.id, j.state, j.node, j.elapsed, ", ".join(map(str, j.trials)))
    if not st.jobs:
        console.print(f"no Slurm jobs recorded in {slurm.jobs_folder(artifacts, name)}")
    else:
        console.print(table)
    c = st.counts
    budget = f" of {st.budget}" if st.budget is not None else ""
    console.print(
        f"trials: {c['complete']} complete{budget}, {c['running']} running, {c['failed']} failed "
        f"or interrupted, {c['waiting']} waiting; {c['retried']} retries",
        soft_wrap=True,
        highlight=False,
    )
