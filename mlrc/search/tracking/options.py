"""The ``tracking:`` option of a study or campaign file and ``--track``: parsed
(:func:`parse_track`, :func:`with_track`), checked (:func:`check_available`) and opened into a
tracker (:func:`open_tracker`)."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from mlrc.config.schema import TrackingSpec
from mlrc.search.errors import StudyError
from mlrc.search.tracking.base import Composite, NullTracker, StudyRun, Tracker
from mlrc.search.tracking.mlflow import MlflowTracker
from mlrc.search.tracking.wandb import WandbTracker

if TYPE_CHECKING:
    from mlrc.config import ResolvedStudy

__all__ = [
    "TRACK_FORMS",
    "TrackingError",
    "check_available",
    "open_tracker",
    "parse_track",
    "with_track",
]

TRACK_FORMS = "mlflow:URI or wandb:PROJECT"


class TrackingError(StudyError):
    """A tracking target that cannot be used (unknown form, package not installed): one line."""


def parse_track(value: str, where: str = "--track") -> TrackingSpec | None:
    """``mlflow:URI`` / ``wandb:PROJECT`` → a :class:`TrackingSpec`; ``none`` → None (no
    tracking, overriding the file's); anything else is a :class:`TrackingError` naming
    ``where``."""
    if value.strip().lower() in ("none", "off"):
        return None
    kind, sep, target = value.strip().partition(":")
    if not sep or not target.strip() or kind not in ("mlflow", "wandb"):
        raise TrackingError(f"{where}: expected {TRACK_FORMS} (or none), got {value!r}")
    return TrackingSpec(**{kind: target.strip()})


def with_track(resolved: ResolvedStudy, track: str | None) -> ResolvedStudy:
    """``resolved`` with the tracking ``--track`` gives (``none``: none) instead of the file's;
    as it was when ``track`` is None. Not part of the study's identity."""
    if track is None:
        return resolved
    study = resolved.study.model_copy(update={"tracking": parse_track(track)})
    return resolved.model_copy(update={"study": study})


def open_tracker(spec: TrackingSpec | None, study: StudyRun) -> Tracker:
    """The tracker of a study file's ``tracking:`` (or what ``--track`` put there), started on
    ``study``; :class:`NullTracker` when ``spec`` is None."""
    check_available(spec, "tracking")
    made: list[Tracker] = []
    if spec is not None and spec.mlflow:
        made.append(MlflowTracker(spec.mlflow))
    if spec is not None and spec.wandb:
        made.append(WandbTracker(spec.wandb))
    tracker = made[0] if len(made) == 1 else Composite(made) if made else NullTracker()
    tracker.start_study(study)
    return tracker


def check_available(spec: TrackingSpec | None, where: str = "--track") -> None:
    """A :class:`TrackingError` when ``spec`` needs a package that is not installed."""
    for kind, package, extra in (
        ("mlflow", "mlflow", "mlrc[tracking]"),
        ("wandb", "wandb", "wandb"),
    ):
        if spec is not None and getattr(spec, kind) and importlib.util.find_spec(package) is None:
            raise TrackingError(
                f"{where}: {kind} tracking needs the {package} package (pip install {extra})"
            )
