"""What a campaign will cost before anything runs (``mlrc campaign plan``), and what it spent
(``mlrc campaign status``).

Per study: fold trainings (search: trials × folds; test: reproductions × folds), epochs (fold
trainings × mean epochs per fold), device-hours (epochs × seconds per epoch), checkpoint disk
under the study's ``artifacts.keep`` once it is done, and the expected 95 % CI half-width of the
test MAP@R over its reproductions (:mod:`mlrc.search.plan_ci`). Work already in the store is not
planned again: trials finished and reproductions tested are done, the rest is left.

Every figure says where it comes from (:class:`Estimate`): measured from the store's own fold
runs — the study's own, else other studies of the same dataset with the same resolved preset,
else of other datasets with it (an epoch is ``iterations_per_epoch`` batches whatever the
dataset; its validation differs) — on the same kind of device (``cpu``, ``cuda``, ``mps``);
else estimated from a benchmark (:func:`mlrc.train.gpu_demand.gpu_demand` on a GPU: training
steps only; :data:`CPU_ESTIMATES` on a CPU), else unknown; epochs per fold with no fold of the
preset in the store are the upper bound ``max_epochs``. Reads the store only
(:mod:`mlrc.store.costs`); prints nothing (:mod:`mlrc.cli.campaign` does).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mlrc.config import ConfigError, ResolvedStudy, canonical_json
from mlrc.search.campaign_runner import FINISHED
from mlrc.search.plan_ci import half_width, reproductions_for, spread_of
from mlrc.search.plan_disk import checkpoint_bytes, disk_bytes
from mlrc.search.pruning import measured_risk
from mlrc.store.campaigns import study_progress
from mlrc.store.costs import FoldCost, ReproductionValue, fold_costs, reproduction_values

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

__all__ = [
    "CPU_ESTIMATES",
    "CampaignPlan",
    "Estimate",
    "Spent",
    "StudyPlan",
    "WallClock",
    "check_workers",
    "device_kind",
    "plan_campaign",
    "preset_key",
    "spent",
    "wall_clock",
]

DEVICE_FORM = r"(cpu|mps|cuda)(?::\d+)?"

#: (trunk, batch) → (training iterations per second on one CPU thread, where it was measured).
CPU_ESTIMATES: dict[tuple[str, int], tuple[float, str]] = {
    ("tiny_cnn", 32): (
        26.6,
        "bench/trainer.py (train_fold, 26.6 it/s on one thread of a 2-core AMD EPYC, "
        "docs/guide/performance.md; training steps and a tiny validation)",
    ),
}


@dataclass(frozen=True)
class Estimate:
    """A figure and where it comes from; ``kind``: measured | estimated | upper bound | unknown
    (``value`` None)."""

    value: float | None
    source: str
    kind: str


@dataclass(frozen=True)
class StudyPlan:
    """One study of the plan. Fold trainings, epochs and hours are what is ``left``; ``planned``
    (the full budget) beside them. ``hours`` None: no timing figure at all. ``disk_bytes``: the
    study's checkpoints once it is done under ``keep`` (None: the model could not be built).
    ``ci``: expected half-width in MAP@R points over ``reproductions``; ``target_n``: the
    reproductions that reach ``--target-ci`` (None: not asked, or unreachable)."""

    study: str
    dataset: str
    row: str
    device: str
    search_folds: int
    test_folds: int
    search_left: int
    test_left: int
    epochs_per_fold: dict[str, Estimate]
    seconds_per_epoch: Estimate
    keep: str
    checkpoint_bytes: int | None  # one best.pt
    disk_bytes: int | None
    reproductions: int
    spread: Estimate
    ci: float
    target_n: int | None = None
    trial_folds: int = 1  # fold trainings of one trial (the preset's folds)

    @property
    def folds(self) -> int:
        return self.search_folds + self.test_folds

    @property
    def folds_left(self) -> int:
        return self.search_left + self.test_left

    def epochs(self, left: bool = True) -> float:
        """Epochs of the fold trainings left (``left``) or of the full budget."""
        s, t = (self.search_left, self.test_left) if left else (self.search_folds, self.test_folds)
        return s * self.epochs_per_fold["search"].value + t * self.epochs_per_fold["test"].value

    def hours(self, left: bool = True) -> float | None:
        """Device-hours of the epochs left (``left``) or of the full budget."""
        per = self.seconds_per_epoch.value
        return None if per is None else self.epochs(left) * per / 3600

    def chain_hours(self) -> float | None:
        """The longest serial chain of what is left, in device-hours: one trial (its folds
        one after another, if the search is not done) then one test fold (if any is left); the
        test stage starts only once the search is done. None: no timing figure."""
        per = self.seconds_per_epoch.value
        if per is None:
            return None
        trial = self.trial_folds * self.epochs_per_fold["search"].value if self.search_left else 0
        test = self.epochs_per_fold["test"].value if self.test_left else 0
        return (trial + test) * per / 3600


@dataclass(frozen=True)
class WallClock:
    """The wall-clock of what is left on ``workers`` workers, in hours: ``total_hours`` ÷
    ``workers``, bounded below by ``chain_hours`` (the longest serial chain, of study
    ``chain_study``); ``bound`` says which one holds. Hours None: no timing figure for some
    study."""

    workers: int
    hours: float | None
    total_hours: float | None
    chain_hours: float | None
    chain_study: str | None
    bound: str  # "total / workers" | "longest chain"


def wall_clock(studies: Sequence[StudyPlan], workers: int) -> WallClock:
    """N ``workers`` in parallel over the campaign's units of work — every trial (its folds in
    series on one worker) and every test fold of every study — each taking the next unit as it
    frees up: the wall-clock is the total device-hours ÷ N, but never less than the longest
    serial chain (a trial then a test fold of one study, :meth:`StudyPlan.chain_hours`). A
    coarse model: it leaves out the time the store takes per claim, and that the units left at
    a study's end may keep fewer than N workers busy."""
    hours = [p.hours() for p in studies]
    chains = [p.chain_hours() for p in studies]
    if None in hours or None in chains:
        return WallClock(workers, None, None, None, None, "unknown")
    total = sum(hours)  # type: ignore[arg-type]
    chain, study = max(((c, p.study) for c, p in zip(chains, studies, strict=True)),
                       default=(0.0, None))  # fmt: skip
    spread = total / workers
    if chain > spread:
        return WallClock(workers, chain, total, chain, study, "longest chain")
    return WallClock(workers, spread, total, chain, study, "total / workers")


def check_workers(workers: int | None) -> None:
    """``--workers``: a positive number of workers, else a one-line ``ConfigError``."""
    if workers is not None and workers < 1:
        raise ConfigError(f"--workers {workers}: the number of workers must be at least 1")


@dataclass(frozen=True)
class CampaignPlan:
    """A campaign's plan: its studies in order, and the one-line notes on how it estimated."""

    name: str
    device: str
    studies: list[StudyPlan]
    notes: list[str] = field(default_factory=list)
    target_ci: float | None = None
    wall: WallClock | None = None  # with --workers N


def device_kind(device: str) -> str:
    """``cuda:3`` → ``cuda``; a name that is not a device is a one-line ``ConfigError``."""
    if re.fullmatch(DEVICE_FORM, device) is None:
        raise ConfigError(f"--device {device}: not a device (cpu, cuda, cuda:N or mps)")
    return device.split(":", 1)[0]


def preset_key(preset: dict[str, Any]) -> str:
    """What makes two studies' resolved presets the same for their cost: the stored preset
    without its own default budgets (``search``, ``test``)."""
    return canonical_json({k: v for k, v in preset.items() if k not in ("search", "test")})


# --- the scopes measured figures come from -----------------------------------------------------


Scope = tuple[str, Callable[[FoldCost], bool]]


def _scopes(name: str, dataset: str, key: str) -> list[Scope]:
    """Where measured figures are looked for, nearest first."""
    return [
        ("this study", lambda f: f.study == name),
        (
            f"other studies of {dataset} with this preset",
            lambda f: f.dataset == dataset and preset_key(f.preset) == key,
        ),
        ("other datasets with this preset", lambda f: preset_key(f.preset) == key),
    ]


def _finished(folds: Sequence[FoldCost]) -> list[FoldCost]:
    return [f for f in folds if f.status == "complete" and f.epochs]


def epochs_per_fold(
    kind: str, folds: Sequence[FoldCost], scopes: list[Scope], max_epochs: int
) -> Estimate:
    """Mean epochs of the complete fold runs of the nearest scope that has some — of ``kind``
    (search | test) first, else of either kind; else ``max_epochs`` as an upper bound."""
    done = _finished(folds)
    for where, inside in scopes:
        for wanted in (kind, None):
            rows = [f for f in done if inside(f) and wanted in (None, f.kind)]
            if rows:
                what = f"{kind} folds" if wanted else "folds"
                mean = sum(f.epochs for f in rows) / len(rows)
                return Estimate(mean, f"measured: {len(rows)} {what} of {where}", "measured")
    return Estimate(
        float(max_epochs),
        "upper bound: max_epochs (no finished fold of this preset)",
        "upper bound",
    )


def seconds_per_epoch(
    device: str, folds: Sequence[FoldCost], scopes: list[Scope], resolved: ResolvedStudy
) -> Estimate:
    """Wall seconds per epoch (validation and set-up included: Σ wall time ÷ Σ epochs) of the
    complete fold runs on ``device``'s kind in the nearest scope; else :func:`benchmark`."""
    kind = device_kind(device)
    done = [f for f in _finished(folds) if f.wall_time_s and device_kind_of(f.device) == kind]
    for where, inside in scopes:
        rows = [f for f in done if inside(f)]
        if rows:
            names = sorted({f.device_name or f.device or "?" for f in rows})
            per = sum(f.wall_time_s for f in rows) / sum(f.epochs for f in rows)
            return Estimate(
                per, f"measured: {len(rows)} folds of {where} on {', '.join(names)}", "measured"
            )
    return benchmark(kind, resolved)


def device_kind_of(device: str | None) -> str | None:
    """The kind of a stored fold run's device (None: unknown or not a device)."""
    if device is None or re.fullmatch(DEVICE_FORM, device) is None:
        return None
    return device.split(":", 1)[0]


def benchmark(kind: str, resolved: ResolvedStudy) -> Estimate:
    """Seconds per epoch from a benchmark: on ``cuda``, the GPU's images/s for the preset's
    trunk and batch (:func:`~mlrc.train.gpu_demand.gpu_demand`: ``bench/gpu_fold.py``'s
    measured upper bound, else issue #22's estimate; training steps only); on ``cpu``,
    :data:`CPU_ESTIMATES`; else unknown."""
    from mlrc.train.gpu_demand import gpu_demand

    p = resolved.preset
    images = p.iterations_per_epoch * p.batch.size
    if kind == "cuda" and (g := gpu_demand(p)) is not None:
        how = "measured" if not g.estimate else "estimated"
        source = f"{g.source} ({how}: {g.img_per_s:,.0f} img/s on {g.gpu})"
        return Estimate(images / g.img_per_s, f"estimated from {source}", "estimated")
    if kind == "cpu" and (c := CPU_ESTIMATES.get((p.trunk, p.batch.size))) is not None:
        rate, source = c
        return Estimate(p.iterations_per_epoch / rate, f"estimated from {source}", "estimated")
    return Estimate(None, f"unknown: no benchmark of {p.trunk} at batch {p.batch.size} on {kind}",
                    "unknown")  # fmt: skip


# --- the plan ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Store:
    """What the plan reads of the store, once."""

    folds: list[FoldCost]
    values: list[ReproductionValue]


def _done(engine: Engine | None) -> Callable[[str], tuple[int, int]]:
    """``name → (trials finished, reproductions tested)`` of a study in the store."""

    def done(name: str) -> tuple[int, int]:
        st = study_progress(engine, name) if engine is not None else None
        if st is None:
            return 0, 0
        return sum(state in FINISHED for state, _ in st.trials), st.reproductions

    return done


def _read(engine: Engine | None) -> _Store:
    if engine is None:
        return _Store([], [])
    return _Store(fold_costs(engine), reproduction_values(engine))


def plan_campaign(
    engine: Engine | None,
    name: str,
    studies: Sequence[tuple[str, ResolvedStudy]],
    device: str = "cpu",
    target_ci: float | None = None,
    workers: int | None = None,
) -> CampaignPlan:
    """The plan of campaign ``name``: each ``(row, resolved study)`` on ``device`` (its kind is
    what is matched), from the store behind ``engine`` (None: an empty store); ``target_ci``: a
    half-width in MAP@R points whose reproductions are proposed; ``workers``: the wall-clock
    on that many workers (:func:`wall_clock`). A bad ``device``, ``target_ci`` or ``workers``
    is a one-line :class:`~mlrc.config.ConfigError`."""
    device_kind(device)
    check_workers(workers)
    if target_ci is not None and not target_ci > 0:
        raise ConfigError(
            f"--target-ci {target_ci}: a half-width must be positive (MAP@R points, e.g. 0.5)"
        )
    data = _read(engine)
    plans = [_study_plan(row, r, device, data, _done(engine), target_ci) for row, r in studies]
    wall = None if workers is None else wall_clock(plans, workers)
    return CampaignPlan(name, device, plans, _notes(plans, studies, device), target_ci, wall)


def _study_plan(
    row: str,
    r: ResolvedStudy,
    device: str,
    data: _Store,
    progress: Callable[[str], tuple[int, int]],
    target_ci: float | None,
) -> StudyPlan:
    """One study's :class:`StudyPlan`."""
    name, dataset, folds = r.study.name, r.study.dataset.name, r.preset.folds
    key = preset_key(r.fingerprint()["preset"])
    scopes = _scopes(name, dataset, key)
    trials_done, reps_done = progress(name)
    best = checkpoint_bytes(r.preset)
    test_left = max(0, r.reproductions - reps_done) * folds - _test_folds_done(
        data.folds, name, reps_done
    )
    spread = spread_of(name, dataset, key, data.values, preset_key)
    return StudyPlan(
        study=name,
        dataset=dataset,
        row=row,
        device=device,
        search_folds=r.trials * folds,
        test_folds=r.reproductions * folds,
        search_left=max(0, r.trials - trials_done) * folds,
        test_left=max(0, test_left),
        epochs_per_fold={
            k: epochs_per_fold(k, data.folds, scopes, r.preset.max_epochs)
            for k in ("search", "test")
        },
        seconds_per_epoch=seconds_per_epoch(device, data.folds, scopes, r),
        keep=r.keep,
        checkpoint_bytes=best,
        disk_bytes=disk_bytes(r, best),
        reproductions=r.reproductions,
        spread=Estimate(spread.s, spread.source, spread.kind),
        ci=half_width(spread.s, r.reproductions),
        target_n=reproductions_for(spread.s, target_ci) if target_ci else None,
        trial_folds=folds,
    )


def _test_folds_done(folds: Sequence[FoldCost], name: str, reps_done: int) -> int:
    """Complete test folds of the reproductions not yet tested (they are reused)."""
    return sum(
        f.study == name
        and f.kind == "test"
        and f.status == "complete"
        and f.reproduction > reps_done
        for f in folds
    )


def _notes(
    plans: list[StudyPlan], studies: Sequence[tuple[str, ResolvedStudy]], device: str
) -> list[str]:
    """One line per preset with no timing data for ``device`` in the store (what the plan
    estimates from instead), and one for work already done."""
    notes: list[str] = []
    for p, (_, r) in zip(plans, studies, strict=True):
        est = p.seconds_per_epoch
        if est.kind != "measured":
            head = f"no timing data for {device} with preset {r.study.preset} in the store"
            if est.value is None:
                line = f"{head}, and {est.source.removeprefix('unknown: ')}: hours unknown"
            else:
                line = f"{head}: {est.source.replace('estimated from', 'estimating from', 1)}"
            if line not in notes:
                notes.append(line)
    for _, r in studies:  # pruning spends less than the budget: by how much, as measured
        if (risk := measured_risk(r)) is not None:
            frac = (
                f"; replayed on the corpus these rules spent {risk['fold_epochs_fraction']:.2f}× "
                "the unpruned fold-epochs"
                if risk["measured"]
                else ""
            )
            notes.append(
                f"{r.study.name}: searched with pruning ({risk['rules']}): its search figures "
                f"are upper bounds{frac}"
            )
    done = [p for p in plans if p.folds_left < p.folds]
    if done:
        left, total = sum(p.folds_left for p in plans), sum(p.folds for p in plans)
        notes.append(
            f"{len(done)} of {len(plans)} studies already in the store: planning only what is "
            f"left ({total - left} of {total} fold trainings done)"
        )
    return notes


# --- what was spent ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Spent:
    """What a study spent, from its fold runs: fold trainings that ended (complete or failed),
    epochs trained (every fold run's last recorded epoch, interrupted ones too) and hours of
    recorded wall time; ``device``: the kind of device most of them ran on (None: none)."""

    fold_trainings: int
    epochs: int
    hours: float
    device: str | None


def spent(engine: Engine, names: Sequence[str]) -> dict[str, Spent]:
    """What each study of ``names`` spent (a study with no fold run: zeros)."""
    by: dict[str, list[FoldCost]] = {n: [] for n in names}
    for f in fold_costs(engine):
        if f.study in by:
            by[f.study].append(f)
    return {
        n: Spent(
            sum(f.status in ("complete", "failed") for f in rows),
            sum(f.epochs or 0 for f in rows),
            sum(f.wall_time_s or 0.0 for f in rows) / 3600,
            _most_common([device_kind_of(f.device) for f in rows]),
        )
        for n, rows in by.items()
    }


def _most_common(kinds: list[str | None]) -> str | None:
    known = [k for k in kinds if k is not None]
    return max(sorted(set(known)), key=known.count) if known else None
