"""Campaigns: a grid of studies — dataset × loss [× strategy] — with one preset and one budget.

A campaign file names its datasets, losses and (optionally) training strategies; every cell of
the grid is an ordinary study, named ``{campaign}-{dataset}-{loss}[-{strategy}]`` and stored like
any other (``mlrc study status NAME`` works on it). The file, its grid and the resolution of its
studies are :mod:`mlrc.config.campaign`'s (re-exported here).

:func:`run_campaign` (``mlrc campaign run``) validates and resolves every study before anything
trains, checks that none already exists in the store with another configuration, records the
membership (``mlrc_campaign_study``), then runs each study's search and test stage in turn; a
failed study is reported and the others go on. Running it again resumes: finished trials, folds
and reproductions are reused. :func:`progress` (``mlrc campaign status``) gives
each cell's progress, read from the store only (:mod:`mlrc.store.campaigns`).

The runner prints nothing: it tells a :class:`CampaignEvents` what happens and returns each
failed study's reason; :mod:`mlrc.cli.campaign` prints them and the grid.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from mlrc import store
from mlrc.config import ResolvedStudy, identity_change
from mlrc.config.campaign import (
    NAME_PATTERN,
    CampaignConfig,
    CampaignDataset,
    CampaignLoss,
    CampaignStrategy,
    Cell,
    cells,
    load_campaign,
    parse_campaign,
    resolve_campaign,
    sanitize,
    study_name,
)
from mlrc.errors import interrupt_behind
from mlrc.search.backends import Backend, backend_named
from mlrc.search.errors import USER_ERRORS, StudyError, failure_reason
from mlrc.search.reproductions import run_test
from mlrc.search.session import StudySession, open_study, rank_plan, register_study
from mlrc.search.tracking import with_track
from mlrc.store import NONFINITE, StoreError
from mlrc.store.campaigns import (
    last_campaign_config,
    record_campaign,
    stored_configs,
    study_progress,
)
from mlrc.train.preflight import preflight as check

__all__ = [
    "FINISHED",
    "Plan",
    "SILENT",
    "NAME_PATTERN",
    "CampaignConfig",
    "CampaignEvents",
    "CampaignDataset",
    "CampaignLoss",
    "CampaignStrategy",
    "Cell",
    "Progress",
    "cells",
    "find_campaign",
    "load_campaign",
    "parse_campaign",
    "preflight",
    "prepare_campaign",
    "progress",
    "register",
    "resolve_campaign",
    "run_campaign",
    "run_study",
    "sanitize",
    "stored_campaign",
    "study_name",
]

log = logging.getLogger("mlrc")

Plan = list[tuple[Cell, ResolvedStudy]]  # a campaign's studies, in order


# --- the store ---------------------------------------------------------------------------------


def register(engine: Any, cfg: CampaignConfig, plan: Plan) -> None:
    """Check every study against the store first (one changed study refuses the campaign before
    anything is written), register them, and record the membership: one row per study, in
    order, with the campaign's configuration; studies no longer in the file leave it."""

    _refuse_changed(engine, plan)
    ids = [register_study(engine, resolved) for _, resolved in plan]
    members = [(study_id, cell.position) for (cell, _), study_id in zip(plan, ids, strict=True)]
    record_campaign(engine, cfg.name, members, cfg.model_dump(mode="json", by_alias=True))


def _refuse_changed(engine: Any, plan: Plan) -> None:
    """A :class:`~mlrc.search.StudyError` for the first study of ``plan`` stored with another
    configuration."""
    stored = stored_configs(engine, [resolved.study.name for _, resolved in plan])
    for _, resolved in plan:
        old = stored.get(resolved.study.name)
        if old is not None and (changed := identity_change(old, resolved.fingerprint())):
            raise StudyError(
                f"study {resolved.study.name!r} already exists in the store with a "
                f"different configuration ({changed}); give the campaign a new name"
            )


def stored_campaign(engine: Any, name: str) -> CampaignConfig | None:
    """The configuration recorded by the last ``campaign run`` of ``name`` (None: unknown)."""

    config = last_campaign_config(engine, name)
    if config is None:
        return None
    return parse_campaign(config, f"campaign {name} (stored)", check_roots=False)


def find_campaign(engine: Any, campaign: str) -> CampaignConfig | None:
    """The campaign ``campaign`` names: a campaign file (``.yaml``/``.yml``; its dataset roots
    are not checked) or the name of a campaign in the store (None: unknown)."""
    if campaign.endswith((".yaml", ".yml")):
        return load_campaign(campaign, check_roots=False)
    return stored_campaign(engine, campaign)


# --- progress ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Progress:
    """A cell's state (not started, pending, partial, running, done, failed) and its text."""

    state: str
    text: str


FINISHED = ("complete", "failed", "pruned")  # trial states that count towards the budget


def _scored_zero(reason: str | None) -> bool:
    return bool(reason) and reason.startswith(NONFINITE)


def progress(engine: Any, name: str) -> Progress:
    """How far study ``name`` is, from the store: trials finished of the budget, reproductions
    tested; "done" when every reproduction is tested; "failed: reason" when every trial failed,
    when the search stopped at a failed trial (its last, with the budget not spent: its error
    stopped the command) or when a test fold failed. Interrupted trials and test folds are
    neither running nor failed: the study is partial (or pending) and resumes."""
    st = study_progress(engine, name)
    if st is None:
        return Progress("not started", "not started")
    trials, reps, test_folds = st.trials, st.reproductions, st.test_folds
    budget = int(st.config.get("trials") or 0)
    wanted = int(st.config.get("reproductions") or 0)
    finished = sum(state in FINISHED for state, _ in trials)
    running = sum(state == "running" for state, _ in trials) + sum(
        status == "running" for status, *_ in test_folds
    )
    if wanted and reps >= wanted:
        return Progress("done", "done")
    failed = (
        _failed_search(trials, finished, budget, running)
        or _stopped_search(st.trials, st.numbers, finished, budget, running)
        or _failed_test(test_folds, running)
    )
    if failed is not None:
        return failed
    text = f"{finished}/{budget} trials" + (f" ({running} running)" if running else "")
    text += f", {reps}/{wanted} reps"
    state = "running" if running else ("pending" if not finished and not reps else "partial")
    return Progress(state, text)


def _failed_search(
    trials: list[tuple[str, str | None]], finished: int, budget: int, running: int
) -> Progress | None:
    """ "failed" when the budget is spent and no trial completed with a usable value."""
    # a complete trial with a non-finite reason was scored 0 (as the reference): not usable
    zero = [r for state, r in trials if state == "complete" and _scored_zero(r)]
    complete = sum(state == "complete" for state, _ in trials) - len(zero)
    if not (finished >= budget and complete == 0 and not running):
        return None
    reasons = [r for state, r in trials if r and (state == "failed" or _scored_zero(r))]
    last = f" (last: {reasons[-1]})" if reasons else ""
    if len(reasons) == finished:
        how = "failed or scored 0 for a non-finite loss" if zero else "failed"
        return Progress("failed", f"failed: all {finished} trials {how}{last}")
    pruned = finished - len(reasons)
    return Progress("failed", f"failed: no trial completed ({pruned} pruned{last})")


def _stopped_search(
    trials: list[tuple[str, str | None]],
    numbers: list[int],
    finished: int,
    budget: int,
    running: int,
) -> Progress | None:
    """ "failed: trial N: reason" when the search stopped at a failed trial: its last trial
    failed (the error that stopped the command is its reason), the budget is not spent and
    nothing runs. Running the study again goes on with the next trial."""
    if not trials or running or finished >= budget or trials[-1][0] != "failed":
        return None
    number = numbers[-1] if len(numbers) == len(trials) else len(trials) - 1
    return Progress("failed", f"failed: trial {number}: {trials[-1][1] or 'no reason kept'}")


def _failed_test(
    test_folds: list[tuple[str, int, int, str | None]], running: int
) -> Progress | None:
    """ "failed" when a test fold failed and nothing runs any more."""
    bad = [f for f in test_folds if f[0] == "failed"]
    if not bad or running:
        return None
    _, rep, fold, reason = bad[0]
    return Progress("failed", f"failed: reproduction {rep}, fold {fold}: {reason}")


# --- running -----------------------------------------------------------------------------------


class CampaignEvents:
    """What a front end may show while a campaign runs (the CLI prints them,
    :mod:`mlrc.cli.campaign`); every hook does nothing here, so a caller that wants nothing
    shown passes this class's instance. The runner itself prints nothing."""

    def checked(self, lines: list[str]) -> None:
        """The pre-flight's lines, once the store took the studies."""

    def study_started(self, campaign: str, i: int, n: int, cell: Cell) -> None:
        """Study ``i`` of ``n`` of ``campaign`` starts (its search, then its test stage)."""

    def searched(self, ctx: StudySession) -> None:
        """The search of an open study ended (its status may be shown)."""

    def test_failed(self, problem: str) -> None:
        """A test reproduction failed (the others went on)."""

    def study_failed(self, i: int, n: int, cell: Cell, problem: str) -> None:
        """Study ``i`` of ``n`` failed: ``problem`` (the campaign goes on)."""

    def finished(self, engine: Any, name: str, plan: Plan) -> None:
        """Every study ran: the campaign's outcome may be shown (read it from the store)."""


SILENT = CampaignEvents()


def run_campaign(
    campaign_file: Path,
    storage: str,
    artifacts: Path,
    device: str = "cpu",
    quiet: bool = False,
    backend: str = "local",
    ray_options: dict[str, Any] | None = None,
    track: str | None = None,
    checks: bool = True,
    events: CampaignEvents = SILENT,
    procs: int | None = None,
    devices: Sequence[str] | None = None,
) -> dict[str, str]:
    """Run (or resume) every study of the campaign file: load and resolve them all, run their
    pre-flight (``checks``; :func:`preflight`), register them, then search and test each in
    turn (``backend``: a name in :data:`~mlrc.search.backends.BACKENDS`, one backend session
    for the whole campaign), telling ``events`` as it goes. Returns the reason each failed
    study failed, by name (the others still ran). ``track``: ``--track`` (instead of the file's
    ``tracking``). ``procs``/``devices``: ``--procs-per-trial``/``--devices``, every study's
    checked (:func:`~mlrc.search.session.rank_plan`) before any is registered."""
    chosen = backend_named(backend)
    cfg, plan, engine = prepare_campaign(
        campaign_file, storage, device, quiet, track, checks, events, procs, devices
    )
    ray_options = ray_options or {}
    run = partial(
        run_study,
        storage=storage,
        artifacts=artifacts,
        device=device,
        quiet=quiet,
        backend=backend,
        ray_options=ray_options,
        events=events,
        procs=procs,
        devices=devices,
    )
    with chosen.session(ray_options, quiet):
        failures = _run_studies(cfg.name, plan, run, events)
    events.finished(engine, cfg.name, plan)
    return failures


def prepare_campaign(
    campaign_file: Path,
    storage: str,
    device: str = "cpu",
    quiet: bool = False,
    track: str | None = None,
    checks: bool = True,
    events: CampaignEvents = SILENT,
    procs: int | None = None,
    devices: Sequence[str] | None = None,
) -> tuple[CampaignConfig, Plan, Any]:
    """Load and resolve every study of the campaign file, check their rank plans, run their
    pre-flight (``checks``; :func:`preflight`) and register them: what ``campaign run`` and a
    campaign worker do before anything trains. The campaign, its plan (in order) and the
    store's engine."""
    cfg = load_campaign(campaign_file)
    plan = [(c, with_track(r, track)) for c, r in resolve_campaign(cfg, str(campaign_file))]
    for _, resolved in plan:
        rank_plan(resolved, device, procs, devices)
    engine = store.connect(storage)
    lines = []
    if checks:  # every study's, before any is registered: one problem refuses the campaign
        _refuse_changed(engine, plan)  # first: a changed study needs no pre-flight to be refused
        lines = preflight(plan, quiet)
    register(engine, cfg, plan)
    if lines:  # once the store took the studies (its refusal stays one line)
        events.checked(lines)
    return cfg, plan, engine


def preflight(plan: Plan, quiet: bool) -> list[str]:
    """The pre-flight of every study (:mod:`mlrc.train.preflight`); a line each to print (none
    when ``quiet``). The first problem is raised as its one line, naming the study at its end."""
    lines = []
    for cell, resolved in plan:
        try:
            done = check(resolved, progress=not quiet)
        except ValueError as e:  # DatasetError, ConfigError, SplitError: the same type, named
            raise type(e)(f"{e} (study {cell.name})") from None
        lines += [] if quiet else [f"{cell.name}: {done.line()}"]
    return lines


def _run_studies(
    name: str, plan: Plan, run: Callable[[ResolvedStudy], str | None], events: CampaignEvents
) -> dict[str, str]:
    """``run`` each study of ``plan`` in turn; the reason of each failure, by name."""
    failures = {}
    for i, (cell, resolved) in enumerate(plan, 1):
        events.study_started(name, i, len(plan), cell)
        problem = run(resolved)
        if problem is not None:
            failures[cell.name] = problem
            events.study_failed(i, len(plan), cell, problem)
    return failures


def run_study(
    resolved: ResolvedStudy,
    storage: str,
    artifacts: Path,
    device: str,
    quiet: bool,
    backend: str,
    ray_options: dict[str, Any],
    events: CampaignEvents = SILENT,
    procs: int | None = None,
    devices: Sequence[str] | None = None,
) -> str | None:
    """Search then test stage of one study; the reason it failed, or None. Errors of the
    study itself (its dataset, its lock, its trials) are returned as the one line ``study run``
    would print (the trial or test fold they failed is recorded failed with it, by the one rule
    of :func:`mlrc.search.errors.ending`); store errors and Ctrl-C/SIGTERM propagate (the
    interrupted trial or test fold is recorded as such)."""
    try:
        with open_study(
            resolved, storage, artifacts, device, not quiet, procs=procs, devices=devices
        ) as ctx:
            return _search_and_test(ctx, backend_named(backend), ray_options, events)
    except StoreError:
        raise  # the store itself is unusable: no other study can run either
    except Exception as e:  # noqa: BLE001 — one study's failure must not stop the campaign
        if interrupt_behind(e) is not None:  # raised while a Ctrl-C unwound: the campaign stops
            raise
        if not _expected(e):
            log.exception("study %s crashed", resolved.study.name)
        return failure_reason(e)  # recorded with the trial or test fold it failed, if any


def _expected(e: Exception) -> bool:
    """An error of the study itself (its dataset, its lock, its files), not a crash."""
    return isinstance(e, USER_ERRORS)


def _search_and_test(
    ctx: StudySession, backend: Backend, options: dict[str, Any], events: CampaignEvents
) -> str | None:
    """The search of an open study, then (unless the search failed) its test stage; the
    reason it failed, or None."""
    backend.search(ctx, options)
    events.searched(ctx)
    p = progress(ctx.engine, ctx.name)
    if p.state == "failed":
        return p.text.removeprefix("failed: ")
    problems = run_test(ctx)
    for problem in problems:
        events.test_failed(problem)
    return "; ".join(problems) or None
