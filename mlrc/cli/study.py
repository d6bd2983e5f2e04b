"""``mlrc study run|test|status``: one study's search, test stage and progress."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from mlrc.cli.interrupts import interrupts
from mlrc.cli.options import (
    DEFAULT_ARTIFACTS,
    DEFAULT_STORAGE,
    AddressOpt,
    ArtifactsOpt,
    CpusPerTrialOpt,
    DeviceOpt,
    GpusPerTrialOpt,
    MaxConcurrentOpt,
    QuietOpt,
    StorageOpt,
    ThreadsOpt,
    fair_share,
)
from mlrc.terminal import (
    check_artifacts,
    check_device,
    console,
    fail,
    print_report,
    print_status_by_name,
    user_errors,
)

if TYPE_CHECKING:
    from mlrc.search import Context

__all__ = ["open_study_file", "study_app", "study_run", "study_status", "study_test"]

study_app = typer.Typer(no_args_is_help=True, help="Studies: run the search, test, status.")


def open_study_file(
    study_file: Path,
    storage: str,
    artifacts: Path,
    device: str,
    quiet: bool,
    force_new: bool = False,
):
    """Load the study file and open its study (a context manager yielding the study's
    :class:`~mlrc.search.Context`)."""
    from mlrc.config import load_study
    from mlrc.search import open_study

    return open_study(
        load_study(study_file), storage, artifacts, device, progress=not quiet, force_new=force_new
    )


@study_app.command("run")
def study_run(
    study_file: Annotated[Path, typer.Argument(help="study YAML")],
    storage: StorageOpt = DEFAULT_STORAGE,
    artifacts: ArtifactsOpt = DEFAULT_ARTIFACTS,
    device: DeviceOpt = "cpu",
    quiet: QuietOpt = False,
    threads: ThreadsOpt = None,
    backend: Annotated[str, typer.Option(help="local (this process) or ray")] = "local",
    address: AddressOpt = None,
    max_concurrent: MaxConcurrentOpt = 1,
    cpus_per_trial: CpusPerTrialOpt = 1.0,
    gpus_per_trial: GpusPerTrialOpt = 0.0,
    fold_parallel: Annotated[
        bool, typer.Option(help="ray: the folds of a trial as parallel tasks sharing its resources")
    ] = False,
    scheduler: Annotated[
        str, typer.Option(help="ray: none (protocol), asha or median (prunes; not MLRC)")
    ] = "none",
    force_new: Annotated[
        bool,
        typer.Option(
            "--force-new", help="a stored study of this name with another config: archive, rerun"
        ),
    ] = False,
) -> None:
    """Run (or resume) the Bayesian search: trials × 4 folds, objective = mean val MAP@R."""
    from mlrc.search import run_search

    if backend not in ("local", "ray"):
        fail(f"unknown backend {backend!r} (local or ray; for a worker pool use `mlrc worker`)")
    if scheduler not in ("none", "asha", "median"):
        fail(f"unknown scheduler {scheduler!r} (none, asha or median)")
    if backend == "local" or address is None:  # a remote Ray cluster's GPUs are not ours to see
        check_device(device)
    check_artifacts(artifacts)
    if backend == "local":  # Ray sets its tasks' threads itself
        fair_share(threads, quiet)
    with (
        interrupts(),
        user_errors(),
        open_study_file(study_file, storage, artifacts, device, quiet, force_new) as ctx,
    ):
        if backend == "ray":
            _search_on_ray(
                ctx,
                address=address,
                max_concurrent=max_concurrent,
                cpus_per_trial=cpus_per_trial,
                gpus_per_trial=gpus_per_trial,
                fold_parallel=fold_parallel,
                scheduler=scheduler,
            )
        else:
            run_search(ctx)
        print_status_by_name(ctx.engine, ctx.name)


def _search_on_ray(ctx: Context, address: str | None, scheduler: str, **options: object) -> None:
    """The search of an open study as Ray tasks (a local Ray when ``address`` is None)."""
    if address is None:  # a local Ray listens on 127.0.0.1 only (set before import)
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    from mlrc.search.backends.ray import run_search_ray, scheduler_named

    run_search_ray(
        ctx,
        address=address,
        scheduler=scheduler_named(scheduler, len(ctx.split.folds)),
        **options,
    )


@study_app.command("test")
def study_test(
    study_file: Annotated[Path, typer.Argument(help="study YAML")],
    storage: StorageOpt = DEFAULT_STORAGE,
    artifacts: ArtifactsOpt = DEFAULT_ARTIFACTS,
    device: DeviceOpt = "cpu",
    quiet: QuietOpt = False,
    threads: ThreadsOpt = None,
) -> None:
    """Retrain the best parameters N times × 4 folds and test on the unseen classes."""
    from mlrc.search import run_test

    check_device(device)
    check_artifacts(artifacts)
    fair_share(threads, quiet)
    with (
        interrupts(),
        user_errors(),
        open_study_file(study_file, storage, artifacts, device, quiet) as ctx,
    ):
        for problem in run_test(ctx):
            console.print(f"[yellow]failed:[/yellow] {problem}", soft_wrap=True)
        print_report(ctx.engine, [ctx.name], "md")


@study_app.command("status")
def study_status(
    study: Annotated[str, typer.Argument(help="study YAML or study name")],
    storage: StorageOpt = DEFAULT_STORAGE,
) -> None:
    """Trials (complete/running/failed with reasons), best so far, folds done."""
    from mlrc import store
    from mlrc.config import load_study

    with user_errors():
        name = load_study(study).study.name if study.endswith((".yaml", ".yml")) else study
        engine = store.connect(storage, read_only=True)
        print_status_by_name(engine, name)
