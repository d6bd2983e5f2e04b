"""The options several ``mlrc`` commands share (same flag, same help, same default)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

__all__ = [
    "DEFAULT_ARTIFACTS",
    "DEFAULT_STORAGE",
    "AddressOpt",
    "ArtifactsOpt",
    "CpusPerTrialOpt",
    "DeviceOpt",
    "FoundArtifactsOpt",
    "GpusPerTrialOpt",
    "MaxConcurrentOpt",
    "KeepOpt",
    "QuietOpt",
    "ReproductionsOpt",
    "SkipChecksOpt",
    "StorageOpt",
    "ThreadsOpt",
    "TrackOpt",
    "check_track",
    "TrialsOpt",
    "fair_share",
]

DEFAULT_STORAGE = "sqlite:///mlrc.db"
DEFAULT_ARTIFACTS = Path("mlrc-artifacts")  # as mlrc.search.artifacts.DEFAULT_ARTIFACTS

StorageOpt = Annotated[
    str, typer.Option("--storage", envvar="MLRC_STORAGE", help="SQLAlchemy URL of the store")
]
ArtifactsOpt = Annotated[Path, typer.Option("--artifacts", help="checkpoint directory")]
# a command that reads a study's artifacts: the folder the store recorded unless given
FoundArtifactsOpt = Annotated[
    Path | None,
    typer.Option(
        "--artifacts",
        help="the folder that holds the study's artifacts (default: where the store recorded "
        "them when the study ran; else mlrc-artifacts)",
    ),
]
DeviceOpt = Annotated[str, typer.Option("--device", help="cpu, cuda, cuda:N")]
QuietOpt = Annotated[bool, typer.Option("--quiet", help="no progress bars")]
SkipChecksOpt = Annotated[
    bool,
    typer.Option(
        "--skip-checks",
        help="no pre-flight: every image decoded (remembered for reruns), class sizes of the "
        "test half and folds, the trunk's weights, checked before the study is registered",
    ),
]
TrialsOpt = Annotated[
    int | None,
    typer.Option(
        "--trials",
        help="the search's budget of finished trials (raise it to grow a study; recorded in "
        "its history)",
    ),
]
ReproductionsOpt = Annotated[
    int | None,
    typer.Option(
        "--reproductions",
        help="reproductions of the test stage (raise it to add some; recorded in the history)",
    ),
]
KeepOpt = Annotated[
    str | None,
    typer.Option(
        "--keep",
        envvar="MLRC_KEEP",
        help="checkpoints kept once a fold's result is stored: resume (none; default), best "
        "(the test reproductions' and the best trial's best.pt) or all",
    ),
]
TrackOpt = Annotated[
    str | None,
    typer.Option(
        "--track",
        envvar="MLRC_TRACK",
        help="also log trials and test reproductions to mlflow:URI or wandb:PROJECT (instead "
        "of the study file's tracking; none: no tracking)",
    ),
]


def check_track(track: str | None) -> None:
    """``--track`` as given, or one line ``error: --track: …`` (unknown form, package missing)."""
    from mlrc.cli.terminal import fail
    from mlrc.search.tracking import TrackingError, check_available, parse_track

    if track is not None:
        try:
            check_available(parse_track(track), "--track")
        except TrackingError as e:
            fail(str(e))


ThreadsOpt = Annotated[
    int | None,
    typer.Option(
        "--threads",
        envvar="MLRC_THREADS",
        min=1,
        help="torch threads of every fold of the study, fixed when it is created (default: "
        "the visible cores ÷ mlrc workers on this host then); on a stored study, changes it "
        "(recorded in its history)",
    ),
]


ProcsOpt = Annotated[
    int | None,
    typer.Option(
        "--procs-per-trial",
        min=1,
        help="train each fold as K processes of torch.distributed, one per device (gloo on "
        "the CPU); the preset's batch is split between them (default: the preset's "
        "processes_per_trial, 1)",
    ),
]
DevicesOpt = Annotated[
    str | None,
    typer.Option(
        "--devices",
        help="the ranks' devices, comma-separated (cuda:0,cuda:1,…); default: the first K "
        "from --device (cuda → cuda:0…; cpu → every rank on the CPU)",
    ),
]


def device_list(devices: str | None) -> list[str] | None:
    """``--devices`` as a list (None when not given); a malformed entry fails in one line."""
    from mlrc.cli.terminal import check_device

    if devices is None:
        return None
    out = [d.strip() for d in devices.split(",") if d.strip()]
    for d in out:
        check_device(d)
    return out


def fair_share(threads: int | None, quiet: bool) -> None:
    """Register this process as an mlrc worker of the host, its folds taking turns for the
    host's cores; ``threads``: ``--threads`` (a new study's folds use it, else the cores this
    process may use; see :mod:`mlrc.train.threads`). The share is logged at debug level, not printed: a
    command's output (and its one-line errors) stay as they were."""
    import logging

    from mlrc.train import threads as cpu

    cpu.configure(threads)
    logging.getLogger("mlrc").debug(cpu.share_line())


# --- the Ray backend (mlrc study run, mlrc campaign run) ---------------------------------------

AddressOpt = Annotated[
    str | None, typer.Option(help="ray: auto, HOST:PORT, or none for a local Ray")
]
MaxConcurrentOpt = Annotated[int, typer.Option(help="ray: trials running at once")]
CpusPerTrialOpt = Annotated[float, typer.Option(help="ray: CPUs reserved per trial")]
GpusPerTrialOpt = Annotated[float, typer.Option(help="ray: GPUs per trial (0.25 packs 4)")]
