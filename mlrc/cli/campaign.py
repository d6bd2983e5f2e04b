"""``mlrc campaign run|status``: a grid of studies, run (:mod:`mlrc.search.campaign_runner`,
which prints nothing) and watched as one; what a campaign shows on the terminal is here."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from mlrc.cli.campaign_plan import plan_json, print_plan, print_spent
from mlrc.cli.interrupts import interrupts
from mlrc.cli.options import (
    DEFAULT_ARTIFACTS,
    DEFAULT_STORAGE,
    AddressOpt,
    ArtifactsOpt,
    CpusPerTrialOpt,
    DeviceOpt,
    DevicesOpt,
    GpusPerTrialOpt,
    MaxConcurrentOpt,
    ProcsOpt,
    QuietOpt,
    SkipChecksOpt,
    StorageOpt,
    ThreadsOpt,
    TrackOpt,
    check_track,
    device_list,
    fair_share,
)
from mlrc.cli.terminal import (
    check_artifacts,
    check_device,
    console,
    fail,
    print_report,
    print_status_by_name,
    print_table,
    user_errors,
)
from mlrc.errors import counted

if TYPE_CHECKING:  # the runner imports torch: only when a command runs (mlrc --help stays fast)
    from mlrc.search.campaign_runner import Cell, Plan, Progress
    from mlrc.search.session import StudySession

__all__ = ["campaign_app", "campaign_plan", "campaign_run", "campaign_status"]

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
    procs_per_trial: ProcsOpt = None,
    devices: DevicesOpt = None,
) -> None:
    """Run (or resume) every study of the campaign: search, then test stage, one after another
    (with --backend ray on a PostgreSQL store: --max-concurrent Ray tasks, each a campaign
    worker taking the next trial or test fold of any study). Exit 1 if a study failed (the others still run). Ctrl-C / SIGTERM: the running trial or
    test fold is recorded as interrupted, one line, exit 130 / 143; run it again to resume."""
    from mlrc.search.backends import backend_named
    from mlrc.search.campaign_runner import run_campaign

    ray_options = {
        "address": address,
        "max_concurrent": max_concurrent,
        "cpus_per_trial": cpus_per_trial,
        "gpus_per_trial": gpus_per_trial,
    }
    with user_errors():
        chosen = backend_named(backend)
    if chosen.uses_this_process(ray_options):
        check_device(device)
    check_artifacts(artifacts)
    check_track(track)
    if chosen.name == "local":  # Ray sets its tasks' threads itself
        fair_share(threads, quiet)
    common = {"track": track, "checks": not skip_checks, "events": Printed(),
              "procs": procs_per_trial, "devices": device_list(devices)}  # fmt: skip
    with interrupts(), user_errors():
        if chosen.name == "ray" and storage.startswith("postgresql"):  # campaign workers on Ray
            from mlrc.search.campaign_ray import run_campaign_on_ray

            failures = run_campaign_on_ray(
                campaign_file, storage, artifacts, ray_options, quiet, **common
            )
        else:
            failures = run_campaign(
                campaign_file, storage, artifacts, device, quiet, backend, ray_options, **common
            )
    if failures:
        raise typer.Exit(1)


@campaign_app.command("status")
def campaign_status(
    campaign: Annotated[str, typer.Argument(help="campaign YAML or campaign name")],
    storage: StorageOpt = DEFAULT_STORAGE,
    json_out: Annotated[bool, typer.Option("--json", help="print JSON only")] = False,
) -> None:
    """The grid (rows: loss [+ strategy], columns: datasets) with each study's progress; per
    study its trials and test folds done / running / left and the worker holding each running
    one; planned vs spent."""
    from mlrc import store
    from mlrc.cli.campaign_work import print_work, status_json
    from mlrc.search.campaign_runner import cells, find_campaign, progress
    from mlrc.search.campaign_watch import study_work
    from mlrc.search.plan import spent

    with user_errors():
        engine = store.connect(storage, read_only=True)
        cfg = find_campaign(engine, campaign)
        if cfg is None:
            fail(f"no campaign {campaign!r} in {store.redact(storage)}")
        grid = cells(cfg, campaign)
        works = [study_work(engine, c.name) for c in grid]
        if json_out:
            states = {c.name: progress(engine, c.name) for c in grid}
            print(status_json(cfg.name, grid, states, works, spent(engine, [c.name for c in grid])))
            return
        print_grid(engine, cfg.name, grid)
        print_work(works)
        _planned_vs_spent(engine, cfg, campaign)


def _planned_vs_spent(engine: Any, cfg: Any, campaign: str) -> None:
    """The planned-vs-spent table of ``status`` (hours on the device most fold runs used); a
    campaign whose studies cannot be resolved here (a plug-in missing) gets one line instead."""
    from mlrc.config import ConfigError
    from mlrc.search.campaign_runner import resolve_campaign
    from mlrc.search.plan import plan_campaign, spent

    try:
        grid = resolve_campaign(cfg, campaign)
    except ConfigError as e:
        console.print(f"planned vs spent: not shown ({e})", soft_wrap=True, highlight=False)
        return
    used = spent(engine, [c.name for c, _ in grid])
    kinds = [s.device for s in used.values() if s.device is not None]
    device = max(sorted(set(kinds)), key=kinds.count) if kinds else "cpu"
    plan = plan_campaign(engine, cfg.name, [(c.row, r) for c, r in grid], device)
    print_spent(plan, used)


TargetOpt = Annotated[
    float | None,
    typer.Option(
        "--target-ci",
        help="a 95% CI half-width of the test MAP@R in MAP@R points (percent, as the tables "
        "print: 0.5 = ±0.50): propose the reproductions that reach it",
    ),
]
WorkersOpt = Annotated[
    int | None,
    typer.Option(
        "--workers",
        help="the wall-clock on N workers in parallel (trials and test folds of every study)",
    ),
]
PlanDeviceOpt = Annotated[
    str,
    typer.Option(
        "--device", help="the device it will run on: cpu, cuda, cuda:N, mps (need not be here)"
    ),
]


@campaign_app.command("plan")
def campaign_plan(
    campaign: Annotated[str, typer.Argument(help="campaign YAML or campaign name")],
    storage: StorageOpt = DEFAULT_STORAGE,
    device: PlanDeviceOpt = "cpu",
    target_ci: TargetOpt = None,
    workers: WorkersOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="print JSON only")] = False,
) -> None:
    """Before anything runs: per study and in total, the fold trainings, epochs and device-hours
    left, the disk its checkpoints take when done, and the expected 95% CI half-width of the
    test MAP@R — measured from the store's own runs where it can, else estimated (and said).
    ``--workers N``: the wall-clock on N workers beside the device-hours."""
    from mlrc import store
    from mlrc.search.campaign_runner import resolve_campaign
    from mlrc.search.plan import check_workers, device_kind, plan_campaign

    with user_errors():
        device_kind(device)  # a bad --device or --workers: one line before the store is read
        check_workers(workers)
        missing = store.costs.missing_file(storage)
        engine = None if missing else store.connect(storage, read_only=True)
        cfg = _planned_campaign(engine, campaign, storage)
        grid = resolve_campaign(cfg, campaign)
        rows = [(c.row, r) for c, r in grid]
        plan = plan_campaign(engine, cfg.name, rows, device, target_ci, workers)
    if json_out:
        print(plan_json(plan))
        return
    if missing:
        console.print(
            f"no store at {missing} yet: nothing measured, every figure is estimated",
            soft_wrap=True,
            highlight=False,
        )
    print_plan(plan)


def _planned_campaign(engine: Any, campaign: str, storage: str) -> Any:
    """The campaign a ``plan`` names: a file, or a name in the store (else one line, exit 2)."""
    from mlrc import store
    from mlrc.search.campaign_runner import find_campaign, load_campaign

    if campaign.endswith((".yaml", ".yml")):
        return load_campaign(campaign, check_roots=False)
    cfg = find_campaign(engine, campaign) if engine is not None else None
    if cfg is None:
        fail(f"no campaign {campaign!r} in {store.redact(storage)}")
    return cfg


class Printed:
    """The :class:`~mlrc.search.campaign_runner.CampaignEvents` of a running campaign on the
    terminal: a heading per study, its status after the search,
    each failure, and at the end the grid and the table of the tested studies."""

    def checked(self, lines: list[str]) -> None:
        for line in lines:
            console.print(line, soft_wrap=True, highlight=False)

    def study_started(self, campaign: str, i: int, n: int, cell: Cell) -> None:
        console.rule()
        console.print(
            f"[bold]campaign {campaign}: study {i}/{n} · {cell.name}[/bold] "
            f"({cell.column} × {cell.row})",
            soft_wrap=True,
            highlight=False,
        )

    def searched(self, ctx: StudySession) -> None:
        print_status_by_name(ctx.engine, ctx.name)

    def test_failed(self, problem: str) -> None:
        console.print(f"[yellow]failed:[/yellow] {problem}", soft_wrap=True)

    def study_failed(self, i: int, n: int, cell: Cell, problem: str) -> None:
        console.print(f"[red]study {i}/{n} failed:[/red] {cell.name}: {problem}", soft_wrap=True)

    def finished(self, engine: Any, name: str, plan: Plan) -> None:
        console.rule(f"[bold]campaign {name}[/bold]: {counted(len(plan), 'study')}")
        states = print_grid(engine, name, [c for c, _ in plan])
        tested = [c.name for c, _ in plan if states[c.name].state == "done"]
        if tested:
            print_report(engine, tested, "md")


STYLES = {"done": "green", "failed": "red", "running": "yellow", "not started": "dim"}


def print_grid(engine: Any, name: str, grid: list[Cell]) -> dict[str, Progress]:
    """The campaign as a table (rows: loss [+ strategy], columns: datasets), each failure's
    reason in full below it, and a summary line. Returns each study's progress."""
    from mlrc.search.campaign_runner import progress

    states = {c.name: progress(engine, c.name) for c in grid}
    print_table(_grid_table(name, grid, states))
    for c in grid:
        if states[c.name].state == "failed":
            console.print(f"{c.name}: {states[c.name].text}", soft_wrap=True, highlight=False)
    counts = {
        k: sum(p.state == k for p in states.values())
        for k in ("done", "failed", "running", "partial", "pending", "not started")
    }
    summary = ", ".join(f"{v} {k}" for k, v in counts.items() if v)
    console.print(f"{counted(len(grid), 'study')}: {summary}", soft_wrap=True, highlight=False)
    return states


def _grid_table(name: str, grid: list[Cell], states: dict[str, Progress]) -> Any:
    """The rich table of :func:`print_grid`: a row per loss [+ strategy], a column per dataset,
    each cell's progress text in its state's colour."""
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
