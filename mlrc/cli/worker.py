"""``mlrc worker``: one worker of a pool sharing a study (``--per-gpu N``: N of them on one
device, as child processes)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from mlrc.cli.debug import debugging
from mlrc.cli.interrupts import interrupts
from mlrc.cli.options import (
    DEFAULT_ARTIFACTS,
    DEFAULT_STORAGE,
    DevicesOpt,
    KeepOpt,
    ProcsOpt,
    QuietOpt,
    SkipChecksOpt,
    ThreadsOpt,
    TrackOpt,
    TrialsOpt,
    check_track,
    device_list,
    fair_share,
)
from mlrc.cli.study import open_study_file, preflight
from mlrc.cli.terminal import (
    check_artifacts,
    check_device,
    console,
    fail,
    print_status_by_name,
    user_errors,
)

__all__ = ["check_mps", "packed_workers", "serve", "worker"]


def worker(
    study_file: Annotated[Path, typer.Argument(help="study or campaign YAML")],
    storage: Annotated[
        str,
        typer.Option("--storage", envvar="MLRC_STORAGE", help="PostgreSQL URL shared by the pool"),
    ] = DEFAULT_STORAGE,
    artifacts: Annotated[
        Path,
        typer.Option("--artifacts", envvar="MLRC_ARTIFACTS", help="shared checkpoint directory"),
    ] = DEFAULT_ARTIFACTS,
    device: Annotated[
        str, typer.Option("--device", envvar="MLRC_DEVICE", help="cpu, cuda, cuda:N (one GPU)")
    ] = "cpu",
    heartbeat: Annotated[int, typer.Option(help="heartbeat interval of a running trial, s")] = 30,
    grace: Annotated[
        int | None, typer.Option(help="a trial without heartbeat this long is retried, s (4×)")
    ] = None,
    per_gpu: Annotated[
        int,
        typer.Option(
            "--per-gpu", min=1, help="N worker processes sharing --device (packs small trials)"
        ),
    ] = 1,
    mps: Annotated[
        bool,
        typer.Option(
            "--mps",
            help="run the --per-gpu workers under CUDA MPS (starts and stops its daemon; "
            "not Apple's --device mps)",
        ),
    ] = False,
    quiet: QuietOpt = False,
    threads: ThreadsOpt = None,
    trials: TrialsOpt = None,
    keep: KeepOpt = None,
    track: TrackOpt = None,
    skip_checks: SkipChecksOpt = False,
    procs_per_trial: ProcsOpt = None,
    devices: DevicesOpt = None,
) -> None:
    """One worker of a pool: run trials of the study until its budget of finished trials is
    reached by the whole pool, then exit 0. Given a campaign file, take the campaign's next
    trial or test fold of any study until every study is searched and tested (exit 1 if one
    failed). Start any number, on any machines, against one PostgreSQL database (SQLite allows
    a single worker). ``--per-gpu N`` starts N such workers
    on the same device as separate processes (the exit code is the first non-zero one);
    ``--mps`` runs them under a CUDA MPS daemon started for them and stopped after them.
    ``--procs-per-trial K`` trains each fold as K ranks on ``--devices`` (or the first K GPUs
    from ``--device``): one K-rank trial at a time; workers beside it take other devices."""
    # size: a typer command: 16 options, one per line; the body is 42 lines
    from mlrc.search import run_search

    if heartbeat < 1 or (grace is not None and grace <= heartbeat):
        fail("--heartbeat must be ≥ 1 s and --grace longer than --heartbeat")
    if mps:
        check_mps(device, per_gpu)
    check_device(device)
    check_artifacts(artifacts)
    check_track(track)
    from mlrc.config.campaign import is_campaign_file

    campaign = is_campaign_file(study_file)
    if campaign and (trials is not None or keep is not None):
        fail("--trials and --keep are a study's: a campaign takes them from its file")
    if per_gpu > 1 and (procs_per_trial or 1) > 1:
        fail("--per-gpu packs one-process trials on one GPU; it cannot pack --procs-per-trial")
    if per_gpu > 1:
        args = [str(study_file), "--artifacts", str(artifacts), "--device", device, "--skip-checks"]
        args += ["--heartbeat", str(heartbeat)] + (["--grace", str(grace)] if grace else [])
        args += ["--threads", str(threads)] if threads else []  # else each takes its share
        args += (["--trials", str(trials)] if trials else []) + (["--keep", keep] if keep else [])
        args += ["--quiet"] if quiet else []
        if not skip_checks:  # the pre-flight once here, not in every worker
            _preflight_once(study_file, quiet)
        raise typer.Exit(_start_packed(per_gpu, args, storage, mps, track))
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s worker {os.getpid()} %(levelname)s %(message)s"
    )
    from mlrc.train.numerics import bind_device

    bind_device(device)  # cuda:N: no context on GPU 0 (the packing parent above binds none)
    fair_share(threads, quiet)
    if campaign:
        options = {"track": track, "checks": not skip_checks, "procs": procs_per_trial}
        serve(study_file, storage, artifacts, device, quiet, heartbeat, grace, options, devices)
        return
    with (
        interrupts(),
        user_errors(),
        open_study_file(
            study_file,
            storage,
            artifacts,
            device,
            quiet,
            trials=trials,
            keep=keep,
            track=track,
            threads=threads,
            checks=not skip_checks,
            procs=procs_per_trial,
            devices=device_list(devices),
        ) as ctx,
    ):
        from mlrc.store import redact

        logging.getLogger("mlrc").info(
            "study %s on %s, device %s, artifacts %s",
            ctx.name,
            redact(storage),
            device,
            ctx.artifacts,
        )
        run_search(ctx, heartbeat_s=heartbeat, grace_s=grace)
        print_status_by_name(ctx.engine, ctx.name)


def serve(
    campaign_file: Path,
    storage: str,
    artifacts: Path,
    device: str,
    quiet: bool,
    heartbeat: int,
    grace: int | None,
    options: dict,
    devices: str | None,
) -> None:
    """``mlrc worker CAMPAIGN.yaml``: register the campaign's studies (pre-flight unless
    ``options["checks"]`` is False), then serve them (:mod:`mlrc.search.campaign_pool`);
    exit 1 if a study failed."""
    from mlrc import store
    from mlrc.cli.campaign import Printed
    from mlrc.search.campaign_pool import serve_campaign
    from mlrc.search.campaign_runner import prepare_campaign
    from mlrc.search.session import open_study

    store.many_studies()  # many studies open at once: connections shared, none idle per study
    procs, chosen = options["procs"], device_list(devices)
    with interrupts(), user_errors():
        _, plan, _ = prepare_campaign(campaign_file, storage, device, quiet, options["track"],
                                      options["checks"], Printed(), procs, chosen)  # fmt: skip

        def opened(resolved):  # noqa: ANN001, ANN202 — one study, as `campaign run` opens it
            return open_study(resolved, storage, artifacts, device, not quiet, procs=procs,
                              devices=chosen)  # fmt: skip

        failures = serve_campaign(plan, opened, Printed(), heartbeat, grace)
    if failures:
        raise typer.Exit(1)


def _preflight_once(study_file: Path, quiet: bool) -> None:
    """The study's (or every campaign study's) pre-flight, run by the parent of packed workers
    (they skip theirs)."""
    from mlrc.config import load_study
    from mlrc.config.campaign import is_campaign_file
    from mlrc.search.campaign_runner import load_campaign, resolve_campaign
    from mlrc.search.campaign_runner import preflight as campaign_preflight

    with user_errors():
        if is_campaign_file(study_file):
            plan = resolve_campaign(load_campaign(study_file), str(study_file))
            lines = campaign_preflight(plan, quiet)
        else:
            lines = [preflight(load_study(study_file), quiet)]
    for line in filter(None, lines):
        console.print(line, soft_wrap=True, highlight=False)


def _start_packed(n: int, args: list[str], storage: str, mps: bool, track: str | None) -> int:
    """``--per-gpu N``: N worker processes on one device (under a CUDA MPS daemon started for
    them with ``--mps``); the first non-zero exit code."""
    if track is not None:  # by environment, like the storage URL: it may hold a secret
        os.environ["MLRC_TRACK"] = track
    if not mps:
        return packed_workers(n, args, storage)
    from mlrc.search.backends.mps import MPSError, mps_daemon

    try:
        with mps_daemon() as mps_env:
            return packed_workers(n, args, storage, mps_env)
    except MPSError as e:
        fail(str(e))


def check_mps(device: str, per_gpu: int) -> None:
    """Refuse ``--mps`` (one line, exit 2) before anything starts: without ``--per-gpu N ≥ 2``
    or a CUDA ``--device``, or where ``nvidia-cuda-mps-control`` is not on PATH."""
    from mlrc.search.backends.mps import MPSError, control_path

    if per_gpu < 2:
        fail("--mps shares one GPU between packed workers: it needs --per-gpu N (N ≥ 2)")
    if device.split(":", 1)[0] != "cuda":
        fail(f"--mps is CUDA's Multi-Process Service: it needs --device cuda[:N], not {device}")
    try:
        control_path()
    except MPSError as e:
        fail(str(e))


def packed_workers(
    n: int, args: list[str], storage: str, extra_env: dict[str, str | None] | None = None
) -> int:
    """Run ``mlrc worker ARGS`` n times as child processes (the storage URL goes by environment,
    never on a command line; ``extra_env``: the MPS daemon's variables, None to unset one);
    SIGINT/SIGTERM are passed on; returns the first non-zero exit."""
    env = {**os.environ, "MLRC_STORAGE": storage, **({"MLRC_DEBUG": "1"} if debugging() else {})}
    for key, value in (extra_env or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    cmd = [sys.executable, "-m", "mlrc.cli", "worker", *args]
    children = [subprocess.Popen(cmd, env=env) for _ in range(n)]
    console.print(f"started {n} workers on one device: pids {[c.pid for c in children]}")

    def forward(signum: int, _frame: object) -> None:
        for c in children:
            if c.poll() is None:
                c.send_signal(signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, forward)
    codes = [c.wait() for c in children]
    return next((c for c in codes if c != 0), 0)
