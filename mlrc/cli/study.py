"""``mlrc study run|test|status``: one study's search, test stage and progress."""

from __future__ import annotations

from contextlib import contextmanager
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
    DevicesOpt,
    FoundArtifactsOpt,
    GpusPerTrialOpt,
    KeepOpt,
    MaxConcurrentOpt,
    ProcsOpt,
    QuietOpt,
    ReproductionsOpt,
    SkipChecksOpt,
    StorageOpt,
    ThreadsOpt,
    TrackOpt,
    TrialsOpt,
    check_track,
    device_list,
    fair_share,
)
from mlrc.cli.terminal import (
    check_artifacts,
    check_device,
    check_out,
    console,
    err_console,
    fail,
    print_report,
    print_status_by_name,
    user_errors,
    write_out,
)

if TYPE_CHECKING:
    pass

__all__ = [
    "open_study_file",
    "study_app",
    "study_export",
    "study_export_model",
    "study_rescore",
    "study_run",
    "study_status",
    "study_test",
]

ForceOpt = Annotated[
    bool, typer.Option("--force", help="overwrite --out if it exists (never the study file given)")
]

study_app = typer.Typer(no_args_is_help=True, help="Studies: run the search, test, status.")


def open_study_file(
    study_file: Path,
    storage: str,
    artifacts: Path,
    device: str,
    quiet: bool,
    force_new: bool = False,
    trials: int | None = None,
    reproductions: int | None = None,
    keep: str | None = None,
    stage: str = "search",
    track: str | None = None,
    threads: int | None = None,
    checks: bool = True,
    procs: int | None = None,
    devices: list[str] | None = None,
):
    """Load the study file, with the budgets and retention given on the command line, and open
    its study (a context manager yielding the study's :class:`~mlrc.search.StudySession`) for the
    ``stage`` ("search" or "test") whose budget it records when changed. What the command line
    gives (``--trials``, ``--reproductions``, ``--keep``, ``--threads``) is the study's from then
    on: a plain rerun keeps it (see :func:`mlrc.search.session.settle`). ``checks``: the
    pre-flight first (:func:`preflight`). ``procs``/``devices``: ``--procs-per-trial`` and
    ``--devices`` (checked before the pre-flight)."""
    from mlrc.config import load_study, with_changes
    from mlrc.search import open_study
    from mlrc.search.session import rank_plan
    from mlrc.search.tracking import with_track

    resolved = with_changes(
        load_study(study_file), trials=trials, reproductions=reproductions, keep=keep
    )
    resolved = with_track(resolved, track)  # --track: instead of the file's tracking
    rank_plan(resolved, device, procs, devices)  # a refusal before the pre-flight's work
    # before the study is registered: a refused study leaves nothing in the store
    line = preflight(resolved, quiet) if checks else None
    used = ("search.trials",) if stage == "search" else ("test.reproductions",)
    opened = open_study(
        resolved,
        storage,
        artifacts,
        device,
        progress=not quiet,
        force_new=force_new,
        budgets_used=used,
        threads=threads,
        procs=procs,
        devices=devices,
    )
    return announced(opened, line)


def preflight(resolved, quiet: bool) -> str | None:
    """The study's pre-flight (:mod:`mlrc.train.preflight`); its line (None when ``quiet``),
    which the caller prints once the study is open (a refusal by the store stays one line). A
    problem raises its one-line error."""
    from mlrc.train.preflight import preflight as check

    done = check(resolved, progress=not quiet)
    return None if quiet else done.line()


@contextmanager
def announced(opened, line: str | None):
    """``opened`` (an open study's context manager), printing ``line`` once it is open."""
    with opened as ctx:
        if line:
            console.print(line, soft_wrap=True, highlight=False)
        yield ctx


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
    trials: TrialsOpt = None,
    keep: KeepOpt = None,
    track: TrackOpt = None,
    skip_checks: SkipChecksOpt = False,
    procs_per_trial: ProcsOpt = None,
    devices: DevicesOpt = None,
) -> None:
    """Run (or resume) the Bayesian search: trials × folds, objective = mean val MAP@R."""
    # size: a typer command: 20 options, one per line; the body is 42 lines
    from mlrc.search.backends import backend_named
    from mlrc.train.numerics import bind_device

    options = {
        "address": address,
        "max_concurrent": max_concurrent,
        "cpus_per_trial": cpus_per_trial,
        "gpus_per_trial": gpus_per_trial,
        "fold_parallel": fold_parallel,
        "scheduler": scheduler,
    }
    with user_errors():
        chosen = backend_named(backend)
    if scheduler not in ("none", "asha", "median"):
        fail(f"unknown scheduler {scheduler!r} (none, asha or median)")
    if chosen.name == "ray" and procs_per_trial:
        from mlrc.search.backends.ray import ranks_refusal

        if why := ranks_refusal(procs_per_trial, gpus_per_trial, fold_parallel):
            fail(why)
    if chosen.uses_this_process(options):
        check_device(device)
    check_artifacts(artifacts)
    check_track(track)
    if chosen.name == "local":  # Ray sets its tasks' threads itself
        bind_device(device)  # cuda:N: no stray context on GPU 0
        fair_share(threads, quiet)
    with (
        interrupts(),
        user_errors(),
        open_study_file(
            study_file,
            storage,
            artifacts,
            device,
            quiet,
            force_new,
            trials=trials,
            keep=keep,
            track=track,
            threads=threads,
            checks=not skip_checks,
            procs=procs_per_trial,
            devices=device_list(devices),
        ) as ctx,
    ):
        chosen.search(ctx, options)
        print_status_by_name(ctx.engine, ctx.name)


@study_app.command("test")
def study_test(
    study_file: Annotated[Path, typer.Argument(help="study YAML")],
    storage: StorageOpt = DEFAULT_STORAGE,
    artifacts: ArtifactsOpt = DEFAULT_ARTIFACTS,
    device: DeviceOpt = "cpu",
    quiet: QuietOpt = False,
    threads: ThreadsOpt = None,
    reproductions: ReproductionsOpt = None,
    keep: KeepOpt = None,
    track: TrackOpt = None,
    skip_checks: SkipChecksOpt = False,
) -> None:
    """Retrain the best parameters N times × folds and test on the unseen classes."""
    from mlrc.search import run_test

    check_device(device)
    check_artifacts(artifacts)
    check_track(track)
    from mlrc.train.numerics import bind_device

    bind_device(device)  # cuda:N: no stray context on GPU 0
    fair_share(threads, quiet)
    with (
        interrupts(),
        user_errors(),
        open_study_file(
            study_file,
            storage,
            artifacts,
            device,
            quiet,
            reproductions=reproductions,
            keep=keep,
            stage="test",
            track=track,
            threads=threads,
            checks=not skip_checks,
        ) as ctx,
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


@study_app.command("export-model")
def study_export_model(
    study: Annotated[str, typer.Argument(help="study YAML or study name")],
    out: Annotated[
        Path,
        typer.Option("--out", help="file to write (.pt, .pt2 or .onnx; its folder is created)"),
    ],
    storage: StorageOpt = DEFAULT_STORAGE,
    artifacts: FoundArtifactsOpt = None,
    dim: Annotated[
        str,
        typer.Option(
            "--dim",
            help="concatenated: the K fold models concatenated (K × D dimensions, MLRC's "
            "headline); fold: the best trained fold model (D); or the number itself",
        ),
    ] = "concatenated",
    reproduction: Annotated[
        int | None, typer.Option("--reproduction", help="this reproduction (default: the best)")
    ] = None,
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            help="state-dict (.pt, load with mlrc.train.load_exported) or export "
            "(.pt2, torch.export: torch alone loads it) or onnx (.onnx, any ONNX runtime; "
            "needs the onnx extra)",
        ),
    ] = "state-dict",
    force: ForceOpt = False,
) -> None:
    """Write the best test reproduction's model (L2-normalised embeddings: the concatenation of
    its K fold models, K × D dimensions, or one trained fold model, D) for use outside mlrc.
    Every retention keeps that reproduction's fold models (artifacts.keep: best keeps every
    reproduction's)."""
    from mlrc import store
    from mlrc.config import load_study
    from mlrc.search.export import export_study_model

    if fmt not in ("state-dict", "export", "onnx"):
        fail(f"--format: expected state-dict, export or onnx (got {fmt!r})")
    check_out(out, overwrite=force, inputs=(study,))
    with user_errors():
        name = load_study(study).study.name if study.endswith((".yaml", ".yml")) else study
        engine = store.connect(storage, read_only=True)
        meta = {}
        write_out(
            out,
            lambda tmp: meta.update(
                export_study_model(engine, name, artifacts, tmp, dim, reproduction, fmt)
            ),
        )
    _say_exported(out, name, meta)


def _say_exported(out: Path, name: str, meta: dict) -> None:
    """What ``study export-model`` wrote, and a warning when it holds an untrained fold."""
    fold = f", fold {meta['fold']}" if meta["fold"] is not None else ""
    console.print(
        f"wrote {out}: study {name}, reproduction {meta['reproduction']}{fold}, "
        f"{meta['dim']}-D, test MAP@R {meta['test_map_at_r']:.4f} ({meta['mode']})",
        soft_wrap=True,
        highlight=False,
    )
    if meta["untrained_folds"]:
        untrained = ", ".join(map(str, meta["untrained_folds"]))
        err_console.print(
            f"warning: folds {untrained} of this concatenation kept epoch 0, the untrained "
            "model (validation never improved on it); its test MAP@R includes them",
            soft_wrap=True,
            highlight=False,
        )


@study_app.command("export")
def study_export(
    study: Annotated[str, typer.Argument(help="study YAML or study name")],
    out: Annotated[Path, typer.Option("--out", help="study YAML to write (its folder is created)")],
    storage: StorageOpt = DEFAULT_STORAGE,
    name: Annotated[
        str | None, typer.Option("--name", help="the exported study's name (NAME-exported)")
    ] = None,
    force: ForceOpt = False,
) -> None:
    """Write a study file with the best parameters fixed and the full resolved preset: `mlrc
    study test OUT` re-runs its test stage (same seeds, same numbers) anywhere. OUT is never
    the study file given, and an existing OUT is only overwritten with --force."""
    import datetime as dt

    import yaml

    from mlrc import store
    from mlrc.config import load_study
    from mlrc.config.identity import code_version
    from mlrc.search.export import export_study_file

    check_out(out, overwrite=force, inputs=(study,))
    with user_errors():
        source = load_study(study).study.name if study.endswith((".yaml", ".yml")) else study
        engine = store.connect(storage, read_only=True)
        doc = export_study_file(engine, source, name)
    head = (
        f"# exported from study {source} ({store.redact(storage)}) by mlrc {code_version()} on "
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC: its best parameters, fixed, and its\n"
        "# whole resolved preset; `mlrc study test` on this file re-runs the test stage.\n"
    )
    text = head + yaml.safe_dump(doc, sort_keys=False)
    write_out(out, lambda tmp: tmp.write_text(text, encoding="utf-8"))
    console.print(f"wrote {out} (study {doc['name']})", soft_wrap=True, highlight=False)


MetricsOpt = Annotated[
    str,
    typer.Option(
        "--metrics",
        help="metrics to compute, comma-separated (map_at_r,mrr,ndcg_at_k@10,recall_at_k@10,…; "
        "`mlrc plugins` lists them)",
    ),
]


@study_app.command("rescore")
def study_rescore(
    study: Annotated[str, typer.Argument(help="study YAML or study name")],
    metrics: MetricsOpt,
    storage: StorageOpt = DEFAULT_STORAGE,
    artifacts: FoundArtifactsOpt = None,
    device: DeviceOpt = "cpu",
) -> None:
    """Compute metrics from the stored test embeddings of every tested reproduction, without
    training, and store them (marked as computed after the fact; `mlrc report --metrics`
    shows them). A file whose hash differs from the store's is refused."""
    from mlrc import store
    from mlrc.config import load_study
    from mlrc.protocol.scoring import parse_metrics
    from mlrc.search.rescore import rescore_study, summary_lines

    check_device(device)
    try:
        chosen = parse_metrics(metrics)
    except ValueError as e:  # "metrics: unknown metric …"
        fail(f"--{e}")
    with user_errors():
        name = load_study(study).study.name if study.endswith((".yaml", ".yml")) else study
        engine = store.connect(storage, read_only=True)  # an existing store (never created)
        done = rescore_study(engine, name, artifacts, chosen, device)
    head = f"study {name} ({done.protocol}), computed after the fact from stored embeddings:"
    console.print(head, soft_wrap=True, highlight=False)
    for line in summary_lines(done):
        console.print(line, soft_wrap=True, highlight=False)
    if done.without_file:
        reps = ", ".join(map(str, done.without_file))
        console.print(
            f"reproductions {reps}: tested before embeddings were stored, not re-scored",
            soft_wrap=True,
            highlight=False,
        )
