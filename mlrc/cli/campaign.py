"""``mlrc campaign run|status``: a grid of studies (:mod:`mlrc.campaign`), run and watched as
one."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

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
    SkipChecksOpt,
    StorageOpt,
    ThreadsOpt,
    TrackOpt,
    check_track,
    fair_share,
)
from mlrc.terminal import check_artifacts, check_device, fail, user_errors

__all__ = ["campaign_app", "campaign_run", "campaign_status"]

campaign_app = typer.Typer(
    no_args_is_help=True,
    help="Campaigns: a grid of studies (dataset × loss [× strategy]), run and watched as one.",
)


@campaign_app.command("run")
def campaign_run(
    campaign_file: Annotated[Path, typer.Argument(help="campaign YAML")],
    storage: StorageOpt = DEFAULT_STORAGE,
    artifacts: ArtifactsOpt = DEFAULT_ARTIFACTS,
    device: DeviceOpt = "cpu",
    quiet: QuietOpt = False,
    threads: ThreadsOpt = None,
    backend: Annotated[str, typer.Option(help="search backend: local or ray")] = "local",
    address: AddressOpt = None,
    max_concurrent: MaxConcurrentOpt = 1,
    cpus_per_trial: CpusPerTrialOpt = 1.0,
    gpus_per_trial: GpusPerTrialOpt = 0.0,
    track: TrackOpt = None,
    skip_checks: SkipChecksOpt = False,
) -> None:
    """Run (or resume) every study of the campaign: search, then test stage, one after another.
    Exit 1 if a study failed (the others still run). Ctrl-C / SIGTERM: the running trial or
    test fold is recorded as interrupted, one line, exit 130 / 143; run it again to resume."""
    from mlrc.campaign import run_campaign

    if backend not in ("local", "ray"):
        fail(f"unknown backend {backend!r} (local or ray)")
    if backend == "local" or address is None:  # a remote Ray cluster's GPUs are not ours to see
        check_device(device)
    check_artifacts(artifacts)
    check_track(track)
    if backend == "local":  # Ray sets its tasks' threads itself
        fair_share(threads, quiet)
    ray_options = {
        "address": address,
        "max_concurrent": max_concurrent,
        "cpus_per_trial": cpus_per_trial,
        "gpus_per_trial": gpus_per_trial,
    }
    with interrupts(), user_errors():
        failures = run_campaign(
            campaign_file,
            storage,
            artifacts,
            device,
            quiet,
            backend,
            ray_options,
            track,
            checks=not skip_checks,
        )
    if failures:
        raise typer.Exit(1)


@campaign_app.command("status")
def campaign_status(
    campaign: Annotated[str, typer.Argument(help="campaign YAML or campaign name")],
    storage: StorageOpt = DEFAULT_STORAGE,
) -> None:
    """The grid (rows: loss [+ strategy], columns: datasets) with each study's progress."""
    from mlrc import store
    from mlrc.campaign import cells, find_campaign, print_grid

    with user_errors():
        engine = store.connect(storage, read_only=True)
        cfg = find_campaign(engine, campaign)
        if cfg is None:
            fail(f"no campaign {campaign!r} in {store.redact(storage)}")
        print_grid(engine, cfg.name, cells(cfg, campaign))
