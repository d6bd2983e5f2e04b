"""``mlrc campaign run --backend ray`` on a PostgreSQL store: ``--max-concurrent`` Ray tasks, each
a campaign worker (:mod:`mlrc.search.campaign_pool`) with ``--cpus-per-trial`` CPUs and
``--gpus-per-trial`` GPUs, so that the trials and test folds of every study run on the Ray
cluster at once, claimed through the store exactly as a pool of ``mlrc worker CAMPAIGN.yaml``
claims them (the same order, heartbeats, retries and test rows).

On SQLite, which allows one process per study, ``--backend ray`` keeps running a study after
another, each study's trials placed by Ray Tune (:mod:`mlrc.search.backends.ray`).

A stop (Ctrl-C, SIGTERM) cancels the tasks: each receives a KeyboardInterrupt, records its trial
or test fold as interrupted and ends; the command resumes it when run again.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mlrc import store
from mlrc.errors import stops_raise_at_once
from mlrc.search.backends import backend_named
from mlrc.search.campaign_pool import serve_campaign
from mlrc.search.campaign_runner import SILENT, CampaignEvents, prepare_campaign
from mlrc.search.session import open_study

__all__ = ["run_campaign_on_ray", "serve_on_ray"]

CANCEL_WAIT_S = 30.0  # how long a stop waits for the cancelled tasks to record their work


def run_campaign_on_ray(
    campaign_file: Path,
    storage: str,
    artifacts: Path,
    options: dict[str, Any],
    quiet: bool = False,
    track: str | None = None,
    checks: bool = True,
    events: CampaignEvents = SILENT,
    procs: int | None = None,
    devices: Sequence[str] | None = None,
) -> dict[str, str]:
    """``campaign run --backend ray`` on PostgreSQL: the campaign registered and checked here
    (:func:`prepare_campaign`), then served by Ray tasks (:func:`serve_on_ray`) in one Ray
    session; each failed study told to ``events``. The reason each failed study failed."""
    device = "cuda" if float(options.get("gpus_per_trial") or 0.0) > 0 else "cpu"
    cfg, plan, engine = prepare_campaign(
        campaign_file, storage, device, quiet, track, checks, events, procs, devices
    )
    with backend_named("ray").session(options, quiet):
        failures = serve_on_ray(campaign_file, storage, artifacts, options, track, procs, devices)
    for i, (cell, _) in enumerate(plan, 1):
        if cell.name in failures:
            events.study_failed(i, len(plan), cell, failures[cell.name])
    events.finished(engine, cfg.name, plan)
    return failures


def serve_on_ray(
    campaign_file: Path,
    storage: str,
    artifacts: Path,
    options: dict[str, Any],
    track: str | None = None,
    procs: int | None = None,
    devices: Sequence[str] | None = None,
) -> dict[str, str]:
    """Serve the campaign (registered already) with ``options["max_concurrent"]`` Ray tasks
    (``cpus_per_trial`` CPUs, ``gpus_per_trial`` GPUs each: a task with a GPU trains on
    ``cuda``, the one Ray gives it); the reason each failed study failed, from every task."""
    import ray

    gpus = float(options.get("gpus_per_trial") or 0.0)
    task = ray.remote(_campaign_worker).options(
        num_cpus=float(options.get("cpus_per_trial") or 1.0), num_gpus=gpus, max_retries=0
    )
    device = "cuda" if gpus > 0 else "cpu"
    args = (str(Path(campaign_file).absolute()), storage, str(Path(artifacts).absolute()), device)
    refs = [task.remote(*args, track, procs, devices) for _ in range(options["max_concurrent"])]
    try:
        with stops_raise_at_once():  # ray.get has none of mlrc's safe points
            done = ray.get(refs)
    except KeyboardInterrupt:
        for ref in refs:
            ray.cancel(ref)  # a KeyboardInterrupt in the task: its unit recorded interrupted
        ray.wait(refs, num_returns=len(refs), timeout=CANCEL_WAIT_S)
        raise
    failures: dict[str, str] = {}
    for found in done:
        failures.update(found)
    return failures


def _campaign_worker(
    campaign_file: str,
    storage: str,
    artifacts: str,
    device: str,
    track: str | None,
    procs: int | None,
    devices: Sequence[str] | None,
) -> dict[str, str]:
    """One Ray task: a campaign worker on the shared store (the campaign registered and checked
    by the driver); the reason each study failed for it."""
    store.many_studies()  # many studies open at once: connections shared, none idle per study
    _, plan, _ = prepare_campaign(
        Path(campaign_file), storage, device, True, track, checks=False, procs=procs,
        devices=devices,
    )  # fmt: skip

    def opened(resolved):  # noqa: ANN001, ANN202 — one study, as `campaign run` opens it
        return open_study(resolved, storage, artifacts, device, False, procs=procs,
                          devices=devices)  # fmt: skip

    return serve_campaign(plan, opened)
