"""Experiment tracking: a study's trials and test reproductions also logged to MLflow (or W&B).

``tracking: {mlflow: URI}`` in a study or campaign file, or ``--track mlflow:URI``, gives one
run per study, and nested under it one run per trial (its parameters, the per-epoch validation
metrics of each fold with ``step`` = epoch, each fold's best, the objective) and one run per test
reproduction (its parameters and test metrics). The store stays the record: tracking never
decides a number, is not part of a study's fingerprint, and a tracking failure (server down, bad
URI) is logged once and turns tracking off for the process — the trial goes on.

Every process of a study (``mlrc study run``, each ``mlrc worker`` of a pool, each Ray process)
finds the same study run and trial runs by their tags (``mlrc.key``, ``mlrc.trial``, …): the
oldest run with the tags wins, and a process that raced another to create one deletes its own.

The package: :mod:`~mlrc.search.tracking.base` (the interface, :class:`StudyRun`, several
trackers at once, what the trackers share), :mod:`~mlrc.search.tracking.options` (``--track`` and
``tracking:``, parsed and opened), :mod:`~mlrc.search.tracking.mlflow` and
:mod:`~mlrc.search.tracking.wandb` (the client libraries are imported when a tracker first logs).
"""

from mlrc.search.tracking.base import NullTracker, StudyRun, Tracker, study_run
from mlrc.search.tracking.mlflow import EXPERIMENT, MlflowTracker
from mlrc.search.tracking.options import (
    TRACK_FORMS,
    TrackingError,
    check_available,
    open_tracker,
    parse_track,
    with_track,
)
from mlrc.search.tracking.wandb import WandbTracker

__all__ = [
    "TRACK_FORMS",
    "EXPERIMENT",
    "MlflowTracker",
    "NullTracker",
    "StudyRun",
    "Tracker",
    "TrackingError",
    "WandbTracker",
    "check_available",
    "open_tracker",
    "parse_track",
    "study_run",
    "with_track",
]
