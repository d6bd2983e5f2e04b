"""Campaigns: a grid of studies — dataset × loss [× strategy] — with one preset and one budget.

A campaign file names its datasets, losses and (optionally) training strategies; every cell of
the grid is an ordinary study, named ``{campaign}-{dataset}-{loss}[-{strategy}]`` and stored like
any other (``mlrc study status NAME`` works on it). The file, its grid and the resolution of its
studies are :mod:`mlrc.config.campaign`'s (re-exported here).

:func:`run_campaign` (``mlrc campaign run``) validates and resolves every study before anything
trains, checks that none already exists in the store with another configuration, records the
membership (``mlrc_campaign_study``), then runs each study's search and test stage in turn; a
failed study is reported and the others go on. Running it again resumes: finished trials, folds
and reproductions are reused. :func:`print_grid` (``mlrc campaign status``) shows the grid with
each cell's progress, read from the store only (:mod:`mlrc.store.campaigns`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from mlrc.config import ResolvedStudy
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

__all__ = [
    "FINISHED",
    "NAME_PATTERN",
    "STYLES",
    "CampaignConfig",
    "CampaignDataset",
    "CampaignLoss",
    "CampaignStrategy",
    "Cell",
    "Progress",
    "RaySession",
    "cells",
    "find_campaign",
    "load_campaign",
    "parse_campaign",
    "preflight",
    "print_grid",
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

Plan = list[tuple[Cell, ResolvedStudy]]


# --- the store ---------------------------------------------------------------------------------


def register(engine: Any, cfg: CampaignConfig, plan: Plan) -> None:
    """Check every study against the store first (one changed study refuses the campaign before
    anything is written), register them, and record the membership: one row per study, in
    order, with the campaign's configuration; studies no longer in the file leave it."""
    from mlrc.search import register_study
    from mlrc.store.campaigns import record_campaign

    _refuse_changed(engine, plan)
    ids = [register_study(engine, resolved) for _, resolved in plan]
    members = [(study_id, cell.position) for (cell, _), study_id in zip(plan, ids, strict=True)]
    record_campaign(engine, cfg.name, members, cfg.model_dump(mode="json", by_alias=True))


def _refuse_changed(engine: Any, plan: Plan) -> None:
    """A :class:`~mlrc.search.StudyError` for the first study of ``plan`` stored with another
    configuration."""
    from mlrc.config import identity_change
    from mlrc.search import StudyError
    from mlrc.store.campaigns import stored_configs

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
    from mlrc.store.campaigns import last_campaign_config

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
    from mlrc.store import NONFINITE

    return bool(reason) and reason.startswith(NONFINITE)


def progress(engine: Any, name: str) -> Progress:
    """How far study ``name`` is, from the store: trials finished of the budget, reproductions
    tested; "done" when every reproduction is tested; "failed: reason" when every trial failed,
    when the search stopped at a failed trial (its last, with the budget not spent: its error
    stopped the command) or when a test fold failed. Interrupted trials and test folds are
    neither running nor failed: the study is partial (or pending) and resumes."""
    from mlrc.store.campaigns import study_progress

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


STYLES = {"done": "green", "failed": "red", "running": "yellow", "not started": "dim"}


def print_grid(engine: Any, name: str, grid: list[Cell]) -> dict[str, Progress]:
    """The campaign as a table (rows: loss [+ strategy], columns: datasets), each failure's
    reason in full below it, and a summary line. Returns each study's progress."""
    from mlrc.terminal import console

    states = {c.name: progress(engine, c.name) for c in grid}
    console.print(_grid_table(name, grid, states))
    for c in grid:
        if states[c.name].state == "failed":
            console.print(f"{c.name}: {states[c.name].text}", soft_wrap=True, highlight=False)
    counts = {
        k: sum(p.state == k for p in states.values())
        for k in ("done", "failed", "running", "partial", "pending", "not started")
    }
    summary = ", ".join(f"{v} {k}" for k, v in counts.items() if v)
    console.print(f"{len(grid)} studies: {summary}", soft_wrap=True, highlight=False)
    return states


def _grid_table(name: str, grid: list[Cell], states: dict[str, Progress]) -> Any:
    """The rich table of :func:`print_grid`: a row per loss [+ strategy], a column per dataset,
    each cell's progress text in its state's colour."""
    from rich.table import Table

    columns = list(dict.fromkeys(c.column for c in grid))
    rows = list(dict.fromkeys(c.row for c in grid))
    at = {(c.row, c.column): c for c in grid}
    table = Table(title=f"campaign {name}")
    table.add_column("loss")
    for col in columns:
        table.add_column(col)
    for row in rows:
        cells_text = []
        for col in columns:
            cell = at.get((row, col))
            if cell is None:
                cells_text.append("")
                continue
            p = states[cell.name]
            style = STYLES.get(p.state)
            cells_text.append(f"[{style}]{p.text}[/{style}]" if style else p.text)
        table.add_row(row, *cells_text)
    return table


# --- running -----------------------------------------------------------------------------------


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
) -> dict[str, str]:
    """Run (or resume) every study of the campaign file: load and resolve them all, run their
    pre-flight (``checks``; :func:`preflight`), register them, then search and test each in
    turn (``backend`` local or ray, one Ray session for the whole campaign), and print the grid
    and the table of the tested studies. Returns the reason each failed study failed, by name
    (the others still ran). ``track``: ``--track`` (instead of the file's ``tracking``)."""
    from mlrc import store
    from mlrc.search.tracking import with_track

    cfg = load_campaign(campaign_file)
    plan = [(c, with_track(r, track)) for c, r in resolve_campaign(cfg, str(campaign_file))]
    engine = store.connect(storage)
    lines = []
    if checks:  # every study's, before any is registered: one problem refuses the campaign
        _refuse_changed(engine, plan)  # first: a changed study needs no pre-flight to be refused
        lines = preflight(plan, quiet)
    register(engine, cfg, plan)
    if lines:  # once the store took the studies (its refusal stays one line)
        from mlrc.terminal import console

        for line in lines:
            console.print(line, soft_wrap=True, highlight=False)
    ray_options = ray_options or {}
    run = partial(
        run_study,
        storage=storage,
        artifacts=artifacts,
        device=device,
        quiet=quiet,
        backend=backend,
        ray_options=ray_options,
    )
    with RaySession(backend, ray_options.get("address"), quiet):
        failures = _run_studies(cfg.name, plan, run)
    _print_outcome(engine, cfg.name, plan)
    return failures


def preflight(plan: Plan, quiet: bool) -> list[str]:
    """The pre-flight of every study (:mod:`mlrc.train.preflight`); a line each to print (none
    when ``quiet``). The first problem is raised as its one line, naming the study at its end."""
    from mlrc.train.preflight import preflight as check

    lines = []
    for cell, resolved in plan:
        try:
            done = check(resolved, progress=not quiet)
        except ValueError as e:  # DatasetError, ConfigError, SplitError: the same type, named
            raise type(e)(f"{e} (study {cell.name})") from None
        lines += [] if quiet else [f"{cell.name}: {done.line()}"]
    return lines


def _run_studies(
    name: str, plan: Plan, run: Callable[[ResolvedStudy], str | None]
) -> dict[str, str]:
    """``run`` each study of ``plan`` in turn under a heading; the reason of each failure, by
    name."""
    from mlrc.terminal import console

    failures = {}
    for i, (cell, resolved) in enumerate(plan, 1):
        console.rule()
        console.print(
            f"[bold]campaign {name}: study {i}/{len(plan)} · {cell.name}[/bold] "
            f"({cell.column} × {cell.row})",
            soft_wrap=True,
            highlight=False,
        )
        problem = run(resolved)
        if problem is not None:
            failures[cell.name] = problem
            console.print(
                f"[red]study {i}/{len(plan)} failed:[/red] {cell.name}: {problem}",
                soft_wrap=True,
            )
    return failures


def _print_outcome(engine: Any, name: str, plan: Plan) -> None:
    """The grid of the campaign, then the results table of its studies that are done."""
    from mlrc.terminal import console, print_report

    console.rule(f"[bold]campaign {name}[/bold]: {len(plan)} studies")
    states = print_grid(engine, name, [c for c, _ in plan])
    tested = [c.name for c, _ in plan if states[c.name].state == "done"]
    if tested:
        print_report(engine, tested, "md")


class RaySession:
    """With ``--backend ray``: one Ray session for the whole campaign (not one per study)."""

    def __init__(self, backend: str, address: str | None, quiet: bool) -> None:
        self.on, self.address, self.quiet, self.started = backend == "ray", address, quiet, False

    def __enter__(self) -> RaySession:
        if self.on:
            import os

            if self.address is None:  # a local Ray listens on 127.0.0.1 only
                os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
            import ray

            if not ray.is_initialized():
                ray.init(
                    address=self.address,
                    include_dashboard=False,
                    log_to_driver=not self.quiet,
                    logging_level=logging.WARNING,
                )
                self.started = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self.started:
            import ray

            ray.shutdown()


def run_study(
    resolved: ResolvedStudy,
    storage: str,
    artifacts: Path,
    device: str,
    quiet: bool,
    backend: str,
    ray_options: dict[str, Any],
) -> str | None:
    """Search then test stage of one study; the reason it failed, or None. Errors of the
    study itself (its dataset, its lock, its trials) are returned as the one line ``study run``
    would print (the trial or test fold they failed is recorded failed with it, by the one rule
    of :func:`mlrc.search.errors.ending`); store errors and Ctrl-C/SIGTERM propagate (the
    interrupted trial or test fold is recorded as such)."""
    from mlrc.errors import interrupt_behind
    from mlrc.search import open_study
    from mlrc.search.errors import failure_reason
    from mlrc.store import StoreError

    try:
        with open_study(resolved, storage, artifacts, device, progress=not quiet) as ctx:
            return _search_and_test(ctx, backend, ray_options)
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
    from mlrc.search.errors import USER_ERRORS

    return isinstance(e, USER_ERRORS)


def _search_and_test(ctx: Any, backend: str, ray_options: dict[str, Any]) -> str | None:
    """The search of an open study, its status, then (unless the search failed) its test
    stage; the reason it failed, or None."""
    from mlrc.search import run_search, run_test
    from mlrc.terminal import console, print_status_by_name

    if backend == "ray":
        from mlrc.search.backends.ray import run_search_ray

        run_search_ray(ctx, **ray_options)
    else:
        run_search(ctx)
    print_status_by_name(ctx.engine, ctx.name)
    p = progress(ctx.engine, ctx.name)
    if p.state == "failed":
        return p.text.removeprefix("failed: ")
    problems = run_test(ctx)
    for problem in problems:
        console.print(f"[yellow]failed:[/yellow] {problem}", soft_wrap=True)
    return "; ".join(problems) or None
