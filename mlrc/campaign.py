"""Campaigns: a grid of studies — dataset × loss [× strategy] — with one preset and one budget.

A campaign file names its datasets, losses and (optionally) training strategies; every cell of
the grid is an ordinary study, named ``{campaign}-{dataset}-{loss}[-{strategy}]`` and stored like
any other (``mlrc study status NAME`` works on it). ``mlrc campaign run`` validates and resolves
every study before anything trains, checks that none already exists in the store with another
configuration, records the membership (``mlrc_campaign_study``), then runs each study's search
and test stage in turn; a failed study is reported and the others go on. Running it again
resumes: finished trials, folds and reproductions are reused. ``mlrc campaign status`` shows the
grid with each cell's progress, read from the store only.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import Field, ValidationError, field_validator, model_validator

from mlrc.config import (
    ConfigError,
    DatasetRef,
    LossRef,
    MinerRef,
    ResolvedStudy,
    SamplerRef,
    SearchSpec,
    StrategyRef,
    Strict,
    StudyConfig,
    TestSpec,
    format_error,
    load_yaml,
    not_a_mapping,
    resolve,
)

log = logging.getLogger("mlrc")
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"

campaign_app = typer.Typer(
    no_args_is_help=True,
    help="Campaigns: a grid of studies (dataset × loss [× strategy]), run and watched as one.",
)


# --- the campaign file -------------------------------------------------------------------------


class CampaignDataset(DatasetRef):
    """A study's ``dataset`` plus an optional ``label`` (column title and name part)."""

    label: str | None = None


class CampaignLoss(LossRef):
    """A study's ``loss`` (``name``, ``params``, ``search``) plus an optional ``label`` (row title
    and name part: needed when one loss appears twice), the loss's own ``enqueue`` list and its
    own ``miner`` (instead of the campaign's: the reality check's "MS + miner" row)."""

    label: str | None = None
    enqueue: list[dict[str, Any]] = []
    miner: MinerRef | None = None


class CampaignStrategy(StrategyRef):
    """A study's ``strategy`` plus an optional ``label``."""

    label: str | None = None


def _named(items: Any) -> Any:
    """``[contrastive, {name: triplet}]`` → every plain name becomes ``{name: ...}``."""
    if isinstance(items, list):
        return [{"name": x} if isinstance(x, str) else x for x in items]
    return items


class CampaignConfig(Strict):
    """A campaign file, validated (study-level checks happen in :func:`resolve_campaign`)."""

    name: str = Field(min_length=1, max_length=128, pattern=NAME_PATTERN)
    datasets: list[CampaignDataset] = Field(min_length=1)
    losses: list[CampaignLoss] = Field(min_length=1)
    strategies: list[CampaignStrategy | None] = Field([None], min_length=1)
    preset: str = "cpu"
    miner: MinerRef | None = None
    sampler: SamplerRef = SamplerRef()
    search: SearchSpec = SearchSpec()
    test: TestSpec = TestSpec()
    overrides: dict[str, Any] = {}

    @field_validator("datasets", "losses", "strategies", mode="before")
    @classmethod
    def _plain_names(cls, v: Any) -> Any:
        return _named(v)

    @model_validator(mode="after")
    def _no_shared_enqueue(self) -> CampaignConfig:
        if self.search.enqueue:
            raise ValueError(
                "search.enqueue: parameters differ per loss; give `enqueue` in a loss item "
                "({name: contrastive, enqueue: [{pos_margin: 0, neg_margin: 0.5}]})"
            )
        return self


def _format(source: str, err: ValidationError) -> str:
    """One line naming the file and key; unknown keys get a "did you mean" (also in lists)."""
    return format_error(source, err, CampaignConfig)


def parse_campaign(
    data: Any, source: str = "campaign", base: Path | None = None, check_roots: bool = True
) -> CampaignConfig:
    """Validate a campaign mapping. Relative dataset roots resolve as in a study file: the
    working directory, then ``base`` (the campaign file's folder); ``check_roots=False`` leaves
    them as written (for ``status``, which trains nothing)."""
    if not isinstance(data, dict):
        raise ConfigError(not_a_mapping(data, source))
    try:
        cfg = CampaignConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format(source, e)) from None
    if check_roots:
        for i, ds in enumerate(cfg.datasets):
            if ds.root is None:
                continue
            candidates = [Path(ds.root).expanduser()]
            if base is not None:
                candidates.append(base / ds.root)
            found = next((c for c in candidates if c.exists()), None)
            if found is None:
                looked = " and ".join(str(c.resolve()) for c in candidates)
                raise ConfigError(
                    f"{source}: datasets.{i}.root: {ds.root} does not exist (looked in {looked})"
                )
            ds.root = str(found.resolve())
    cells(cfg, source)  # derived names: valid and distinct
    return cfg


def load_campaign(path: str | Path, check_roots: bool = True) -> CampaignConfig:
    """Read and validate a campaign file (its studies are resolved by :func:`resolve_campaign`)."""
    path = Path(path)
    return parse_campaign(load_yaml(path), str(path), path.parent, check_roots)


# --- the grid ----------------------------------------------------------------------------------


def sanitize(part: str) -> str:
    """A name part with every run of characters outside ``[A-Za-z0-9._-]`` replaced by ``-``."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", part).strip("-") or "x"


def study_name(campaign: str, dataset: str, loss: str, strategy: str | None = None) -> str:
    """``{campaign}-{dataset}-{loss}`` plus ``-{strategy}`` when a strategy is set, sanitised."""
    parts = [campaign, dataset, loss] + ([strategy] if strategy else [])
    return "-".join(sanitize(p) for p in parts)


@dataclass(frozen=True)
class Cell:
    """One study of the grid: its position (order of the campaign), column and row titles."""

    position: int
    column: str  # dataset label
    row: str  # loss label [+ strategy label]
    where: tuple[int, int, int]  # indices into datasets, losses, strategies
    study: StudyConfig

    @property
    def name(self) -> str:
        return self.study.name


def _label(item: Any) -> str:
    return item.label or item.name


def cells(cfg: CampaignConfig, source: str = "campaign") -> list[Cell]:
    """The studies of the campaign in order: datasets, then losses, then strategies."""
    out: list[Cell] = []
    seen: dict[str, tuple[int, int, int]] = {}
    for i, ds in enumerate(cfg.datasets):
        for j, loss in enumerate(cfg.losses):
            for k, strategy in enumerate(cfg.strategies):
                s_label = _label(strategy) if strategy is not None else None
                name = study_name(cfg.name, _label(ds), _label(loss), s_label)
                if name in seen:
                    a, b = seen[name], (i, j, k)
                    what = next(
                        f"{key}.{b[n]} and {key}.{a[n]}"
                        for n, key in enumerate(("datasets", "losses", "strategies"))
                        if a[n] != b[n]
                    )
                    raise ConfigError(
                        f"{source}: {what} give the same study name {name!r}; "
                        "set a distinct `label` on one of them"
                    )
                seen[name] = (i, j, k)
                miner = loss.miner if loss.miner is not None else cfg.miner
                study = StudyConfig.model_validate(
                    {
                        "name": name,
                        "dataset": ds.model_dump(by_alias=True, exclude={"label"}),
                        "preset": cfg.preset,
                        "loss": loss.model_dump(
                            by_alias=True, exclude={"label", "enqueue", "miner"}
                        ),
                        "miner": miner.model_dump(by_alias=True) if miner else None,
                        "strategy": (
                            strategy.model_dump(by_alias=True, exclude={"label"})
                            if strategy is not None
                            else None
                        ),
                        "sampler": cfg.sampler.model_dump(by_alias=True),
                        "search": {
                            **cfg.search.model_dump(by_alias=True),
                            "enqueue": loss.enqueue,
                        },
                        "test": cfg.test.model_dump(by_alias=True),
                        "overrides": cfg.overrides,
                    }
                )
                row = _label(loss) + (f" + {s_label}" if s_label else "")
                out.append(Cell(len(out), _label(ds), row, (i, j, k), study))
    return out


_SHARED = ("overrides", "preset", "unknown preset", "sampler", "test")
_STUDY_FIELDS = (("loss", "losses", 1), ("dataset", "datasets", 0), ("strategy", "strategies", 2))


def _in_campaign(message: str, source: str, cell: Cell, own_miner: bool = False) -> str:
    """A study-level error of :func:`resolve` with its key written as the campaign's key
    (``loss.name`` → ``losses.3.name``), or with the study named when the key is shared."""
    rest = message.removeprefix(f"{source}: ")
    if rest.startswith("search.enqueue."):  # a loss item's own enqueue list
        return f"{source}: losses.{cell.where[1]}.enqueue.{rest.removeprefix('search.enqueue.')}"
    if own_miner and rest.startswith(("miner.", "miner:", "miner ")):  # a loss item's own miner
        return f"{source}: losses.{cell.where[1]}.{rest}"
    for key, campaign_key, n in _STUDY_FIELDS:
        item = f"{campaign_key}.{cell.where[n]}"
        if rest.startswith((f"{key}.", f"{key}:")):
            return f"{source}: {item}{rest[len(key) :].replace(f'{key}.', f'{item}.')}"
        if rest.startswith(f"{key} "):
            return f"{source}: {item}: {rest}"
    if rest.startswith(_SHARED):  # a key every study shares: the campaign's own key
        return message
    return f"{message} (study {cell.name})"


def resolve_campaign(
    cfg: CampaignConfig, source: str = "campaign"
) -> list[tuple[Cell, ResolvedStudy]]:
    """Every study of the campaign resolved (preset, search space, names checked), so that a
    mistake in the last loss stops the campaign before the first study trains."""
    plan = []
    for cell in cells(cfg, source):
        try:
            resolved = resolve(cell.study, source)
        except ConfigError as e:
            own_miner = cfg.losses[cell.where[1]].miner is not None
            raise ConfigError(_in_campaign(str(e), source, cell, own_miner)) from None
        plan.append((cell, resolved))
    return plan


# --- the store ---------------------------------------------------------------------------------


def register(engine: Any, cfg: CampaignConfig, plan: list[tuple[Cell, ResolvedStudy]]) -> None:
    """Check every study against the store first (one changed study refuses the campaign before
    anything is written), register them, and record the membership: one row per study, in
    order, with the campaign's configuration; studies no longer in the file leave it."""
    from sqlalchemy import delete

    from mlrc import store
    from mlrc.search.study import StudyError, first_difference, register_study

    with store.session(engine) as s:
        for _, resolved in plan:
            row = store.get_study(s, resolved.study.name)
            config = resolved.fingerprint()
            if row is not None and store.canonical_json(row.config) != store.canonical_json(config):
                raise StudyError(
                    f"study {resolved.study.name!r} already exists in the store with a "
                    f"different configuration ({first_difference(row.config, config)}); "
                    "give the campaign a new name"
                )
    ids = [register_study(engine, resolved) for _, resolved in plan]
    campaign_config = cfg.model_dump(mode="json", by_alias=True)

    def write(s: Any) -> None:
        s.execute(
            delete(store.CampaignStudy).where(
                store.CampaignStudy.campaign == cfg.name, store.CampaignStudy.study_id.not_in(ids)
            )
        )
        for (cell, _), study_id in zip(plan, ids, strict=True):
            store.upsert(
                s,
                store.CampaignStudy,
                {"campaign": cfg.name, "study_id": study_id},
                position=cell.position,
                campaign_config=campaign_config,
            )

    store.transact(engine, write, f"recording campaign {cfg.name}")


def stored_campaign(engine: Any, name: str) -> CampaignConfig | None:
    """The configuration recorded by the last ``campaign run`` of ``name`` (None: unknown)."""
    from sqlalchemy import select

    from mlrc import store

    with store.session(engine) as s:
        row = s.execute(
            select(store.CampaignStudy)
            .filter_by(campaign=name)
            .order_by(store.CampaignStudy.id.desc())
            .limit(1)
        ).scalar_one_or_none()
    if row is None:
        return None
    return parse_campaign(row.campaign_config, f"campaign {name} (stored)", check_roots=False)


@dataclass(frozen=True)
class Progress:
    """A cell's state (not started, pending, partial, running, done, failed) and its text."""

    state: str
    text: str


FINISHED = ("complete", "failed", "pruned")  # trial states that count towards the budget


def _scored_zero(reason: str | None) -> bool:
    from mlrc import store

    return bool(reason) and reason.startswith(store.NONFINITE)


def progress(engine: Any, name: str) -> Progress:
    """How far study ``name`` is, from the store: trials finished of the budget, reproductions
    tested; "done" when every reproduction is tested; "failed: reason" when every trial failed
    or a test fold failed."""
    from sqlalchemy import func, select

    from mlrc import store

    with store.session(engine) as s:
        st = store.get_study(s, name)
        if st is None:
            return Progress("not started", "not started")
        trials = s.execute(
            select(store.Trial.state, store.Trial.reason)
            .filter_by(study_id=st.id)
            .order_by(store.Trial.number)
        ).all()
        reps = s.execute(
            select(func.count(func.distinct(store.TestResult.reproduction))).filter_by(
                study_id=st.id, fold=-1
            )
        ).scalar()
        test_folds = s.execute(
            select(store.FoldRun)
            .filter_by(study_id=st.id, kind="test")
            .order_by(store.FoldRun.reproduction, store.FoldRun.fold)
        ).scalars()
        test_folds = [(f.status, f.reproduction, f.fold, f.reason) for f in test_folds]
    budget = int(st.config.get("trials") or 0)
    wanted = int(st.config.get("reproductions") or 0)
    finished = sum(state in FINISHED for state, _ in trials)
    # a complete trial with a non-finite reason was scored 0 (as the reference): not usable
    zero = [r for state, r in trials if state == "complete" and _scored_zero(r)]
    complete = sum(state == "complete" for state, _ in trials) - len(zero)
    running = sum(state == "running" for state, _ in trials) + sum(
        status == "running" for status, *_ in test_folds
    )
    if wanted and reps >= wanted:
        return Progress("done", "done")
    if finished >= budget and complete == 0 and not running:
        reasons = [r for state, r in trials if r and (state == "failed" or _scored_zero(r))]
        last = f" (last: {reasons[-1]})" if reasons else ""
        if len(reasons) == finished:
            how = "failed or scored 0 for a non-finite loss" if zero else "failed"
            return Progress("failed", f"failed: all {finished} trials {how}{last}")
        pruned = finished - len(reasons)
        return Progress("failed", f"failed: no trial completed ({pruned} pruned{last})")
    bad = [f for f in test_folds if f[0] == "failed"]
    if bad and not running:
        _, rep, fold, reason = bad[0]
        return Progress("failed", f"failed: reproduction {rep}, fold {fold}: {reason}")
    text = f"{finished}/{budget} trials" + (f" ({running} running)" if running else "")
    text += f", {reps}/{wanted} reps"
    state = "running" if running else ("pending" if not finished and not reps else "partial")
    return Progress(state, text)


STYLES = {"done": "green", "failed": "red", "running": "yellow", "not started": "dim"}


def print_grid(engine: Any, name: str, grid: list[Cell]) -> dict[str, Progress]:
    """The campaign as a table (rows: loss [+ strategy], columns: datasets), each failure's
    reason in full below it, and a summary line. Returns each study's progress."""
    from rich.table import Table

    from mlrc.terminal import console

    states = {c.name: progress(engine, c.name) for c in grid}
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
    console.print(table)
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


# --- commands ----------------------------------------------------------------------------------

StorageOpt = Annotated[
    str, typer.Option("--storage", envvar="MLRC_STORAGE", help="SQLAlchemy URL of the store")
]


@campaign_app.command("run")
def campaign_run(
    campaign_file: Annotated[Path, typer.Argument(help="campaign YAML")],
    storage: StorageOpt = "sqlite:///mlrc.db",
    artifacts: Annotated[Path, typer.Option("--artifacts", help="checkpoint directory")] = Path(
        "mlrc-artifacts"
    ),
    device: Annotated[str, typer.Option("--device", help="cpu, cuda, cuda:N")] = "cpu",
    quiet: Annotated[bool, typer.Option("--quiet", help="no progress bars")] = False,
    backend: Annotated[str, typer.Option(help="search backend: local or ray")] = "local",
    address: Annotated[
        str | None, typer.Option(help="ray: auto, HOST:PORT, or none for a local Ray")
    ] = None,
    max_concurrent: Annotated[int, typer.Option(help="ray: trials running at once")] = 1,
    cpus_per_trial: Annotated[float, typer.Option(help="ray: CPUs reserved per trial")] = 1.0,
    gpus_per_trial: Annotated[float, typer.Option(help="ray: GPUs per trial (0.25 packs 4)")] = 0.0,
) -> None:
    """Run (or resume) every study of the campaign: search, then test stage, one after another.
    Exit 1 if a study failed (the others still run)."""
    from mlrc import store
    from mlrc.terminal import (
        check_artifacts,
        check_device,
        console,
        fail,
        print_report,
        user_errors,
    )

    if backend not in ("local", "ray"):
        fail(f"unknown backend {backend!r} (local or ray)")
    if backend == "local" or address is None:  # a remote Ray cluster's GPUs are not ours to see
        check_device(device)
    check_artifacts(artifacts)
    with user_errors():
        cfg = load_campaign(campaign_file)
        plan = resolve_campaign(cfg, str(campaign_file))
        engine = store.connect(storage)
        register(engine, cfg, plan)
        ray_options = {
            "address": address,
            "max_concurrent": max_concurrent,
            "cpus_per_trial": cpus_per_trial,
            "gpus_per_trial": gpus_per_trial,
        }
        with _RaySession(backend, address, quiet):
            failures = {}
            for i, (cell, resolved) in enumerate(plan, 1):
                console.rule()
                console.print(
                    f"[bold]campaign {cfg.name}: study {i}/{len(plan)} · {cell.name}[/bold] "
                    f"({cell.column} × {cell.row})",
                    soft_wrap=True,
                    highlight=False,
                )
                problem = _run_study(
                    resolved, storage, artifacts, device, quiet, backend, ray_options
                )
                if problem is not None:
                    failures[cell.name] = problem
                    console.print(
                        f"[red]study {i}/{len(plan)} failed:[/red] {cell.name}: {problem}",
                        soft_wrap=True,
                    )
        console.rule(f"[bold]campaign {cfg.name}[/bold]: {len(plan)} studies")
        states = print_grid(engine, cfg.name, [c for c, _ in plan])
        tested = [c.name for c, _ in plan if states[c.name].state == "done"]
        if tested:
            print_report(engine, tested, "md")
    if failures:
        raise typer.Exit(1)


class _RaySession:
    """With ``--backend ray``: one Ray session for the whole campaign (not one per study)."""

    def __init__(self, backend: str, address: str | None, quiet: bool) -> None:
        self.on, self.address, self.quiet, self.started = backend == "ray", address, quiet, False

    def __enter__(self) -> _RaySession:
        if self.on:
            import logging
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


def _run_study(
    resolved: ResolvedStudy,
    storage: str,
    artifacts: Path,
    device: str,
    quiet: bool,
    backend: str,
    ray_options: dict[str, Any],
) -> str | None:
    """Search then test stage of one study; the reason it failed, or None. Errors of the
    study itself (its dataset, its lock, its trials) are returned; store errors propagate."""
    from mlrc.data.base import DatasetError
    from mlrc.errors import worker_message
    from mlrc.protocol import SplitError
    from mlrc.registry import RegistryError
    from mlrc.search.study import StudyError, open_study, run_search, run_test
    from mlrc.store import StoreError
    from mlrc.terminal import console, print_status_by_name

    try:
        with open_study(resolved, storage, artifacts, device, progress=not quiet) as ctx:
            if backend == "ray":
                from mlrc.search.ray_backend import run_search_ray

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
    except (StudyError, DatasetError, SplitError, RegistryError) as e:
        return worker_message(str(e))
    except StoreError:
        raise  # the store itself is unusable: no other study can run either
    except Exception as e:  # noqa: BLE001 — one study's crash must not stop the campaign
        log.exception("study %s crashed", resolved.study.name)
        return f"{type(e).__name__}: {worker_message(str(e))}"


@campaign_app.command("status")
def campaign_status(
    campaign: Annotated[str, typer.Argument(help="campaign YAML or campaign name")],
    storage: StorageOpt = "sqlite:///mlrc.db",
) -> None:
    """The grid (rows: loss [+ strategy], columns: datasets) with each study's progress."""
    from mlrc import store
    from mlrc.terminal import fail, user_errors

    with user_errors():
        engine = store.connect(storage, read_only=True)
        if campaign.endswith((".yaml", ".yml")):
            cfg = load_campaign(campaign, check_roots=False)
        else:
            cfg = stored_campaign(engine, campaign)
            if cfg is None:
                fail(f"no campaign {campaign!r} in {store.redact(storage)}")
        print_grid(engine, cfg.name, cells(cfg, campaign))
