"""What ``mlrc campaign plan`` prints (the plan of :mod:`mlrc.search.plan` as a table, each
figure's source numbered below it, or JSON) and the planned-vs-spent table of
``mlrc campaign status``."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.table import Table

from mlrc.cli.terminal import console, print_table

if TYPE_CHECKING:
    from mlrc.search.plan import CampaignPlan, Estimate, Spent, StudyPlan

__all__ = ["plan_json", "print_plan", "print_spent", "wall_text"]


def hours_text(hours: float | None) -> str:
    """``12.3 h``, ``0.02 h``; ``?`` when unknown."""
    if hours is None:
        return "?"
    return f"{hours:,.1f} h" if hours >= 0.1 else f"{hours:.2g} h"


def bytes_text(size: int | None) -> str:
    """``1.8 GB``, ``7.5 MB``, ``0 B``; ``?`` when unknown."""
    if size is None:
        return "?"
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:,.1f} {unit}"
    return f"{size} B"


class _Sources:
    """Numbers each distinct source of an estimate: ``[1]``, ``[2]``, … in order of use."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}

    def mark(self, est: Estimate) -> str:
        k = self.seen.setdefault(est.source, len(self.seen) + 1)
        return f" [dim]\\[{k}][/dim]"

    def lines(self) -> list[str]:
        return [f"[{k}] {source}" for source, k in self.seen.items()]


def _row(p: StudyPlan, src: _Sources, target: bool) -> list[str]:
    """The table's row of one study (its epochs marked with the sources of the epochs per
    search and test fold)."""
    per, e = p.seconds_per_epoch, p.epochs_per_fold
    marks = dict.fromkeys(src.mark(e[k]).strip() for k in ("search", "test"))
    epochs_src = " " + "".join(marks)
    at_most = _at_most([p])
    cells = [
        f"{p.row} ({p.dataset})",
        f"{p.folds_left:,} / {p.folds:,}",
        f"{at_most}{p.epochs():,.0f}{epochs_src}",
        ("?" if per.value is None else f"{per.value:.3g}") + src.mark(per),
        at_most + hours_text(p.hours()),
        bytes_text(p.disk_bytes),
        f"±{p.ci:.2f} ({p.reproductions}){src.mark(p.spread)}",
    ]
    if target:
        cells.append("unreachable" if p.target_n is None else str(p.target_n))
    return cells


def _at_most(plans: list[StudyPlan]) -> str:
    """``≤ `` when the epochs left of any of ``plans`` are an upper bound (max_epochs)."""
    bound = any(
        p.folds_left and e.kind == "upper bound" for p in plans for e in p.epochs_per_fold.values()
    )
    return "≤ " if bound else ""


def _total(plan: CampaignPlan, target: bool) -> list[str]:
    s = plan.studies
    hours = [p.hours() for p in s]
    disk = [p.disk_bytes for p in s]
    at_most = _at_most(s)
    cells = [
        "total",
        f"{sum(p.folds_left for p in s):,} / {sum(p.folds for p in s):,}",
        f"{at_most}{sum(p.epochs() for p in s):,.0f}",
        "",
        at_most + hours_text(None if None in hours else sum(hours)),
        bytes_text(None if None in disk else sum(disk)),
        "",
    ]
    return cells + ([""] if target else [])


_COLUMNS = ("study", "folds left/all", "epochs left", "s/epoch", "hours left", "disk done",
            "±MAP@R (n)")  # fmt: skip


def print_plan(plan: CampaignPlan) -> None:
    """The plan: its notes, a row per study and the total, each figure's source."""
    for note in plan.notes:
        console.print(escape(note), soft_wrap=True, highlight=False)
    target = plan.target_ci is not None
    keep = ", ".join(sorted({p.keep for p in plan.studies}))
    table = Table(title=f"campaign {plan.name} on {plan.device} (keep: {keep})")
    for name in _COLUMNS:
        table.add_column(name, justify="left" if name == "study" else "right")
    if target:
        table.add_column(f"n for ±{plan.target_ci:g}", justify="right")
    src = _Sources()
    for p in plan.studies:
        table.add_row(*_row(p, src, target))
    table.add_row(*_total(plan, target), style="bold")
    print_table(table)
    console.print(
        "folds: fold trainings (search trials × folds + test reproductions × folds); "
        "±MAP@R: expected 95% CI half-width of the test MAP@R (concatenated) in MAP@R points "
        "over n reproductions; disk done: checkpoints kept once every study is done",
        soft_wrap=True,
        highlight=False,
    )
    for line in src.lines():
        console.print(escape(line), soft_wrap=True, highlight=False)
    _print_running_disk(plan)
    if target:
        _print_target(plan)
    if plan.wall is not None:
        console.print(wall_text(plan), soft_wrap=True, highlight=False)


def wall_text(plan: CampaignPlan) -> str:
    """``on 4 workers: ≈ 1.2 h wall-clock (total 4.6 h ÷ 4; …)``: what ``--workers`` adds."""
    w = plan.wall
    assert w is not None
    if w.hours is None:
        return f"on {w.workers} workers: wall-clock unknown (hours unknown)"
    at_most = _at_most(plan.studies)
    chain = (
        f"the longest serial chain, {hours_text(w.chain_hours)}, is one trial then one test fold"
        f" of {w.chain_study}"
        if w.chain_study
        else "nothing is left"
    )
    held = "the chain holds" if w.bound == "longest chain" else "total ÷ workers holds"
    return (
        f"on {w.workers} workers: {at_most}{hours_text(w.hours)} wall-clock (total "
        f"{hours_text(w.total_hours)} ÷ {w.workers} = {hours_text(w.total_hours / w.workers)}; "
        f"{chain}; {held})"
    )


def _print_running_disk(plan: CampaignPlan) -> None:
    sizes = {p.checkpoint_bytes for p in plan.studies if p.checkpoint_bytes is not None}
    if sizes:
        running = max(sizes) * 4
        console.print(
            f"while a fold runs it holds one best.pt and one last.pt: ≈ {bytes_text(running)} "
            "per running fold, whatever the retention",
            soft_wrap=True,
            highlight=False,
        )


def _print_target(plan: CampaignPlan) -> None:
    """What the proposed reproductions would add to the test stage."""
    extra_folds, extra_hours = 0, 0.0
    for p in plan.studies:
        if p.target_n is None:
            continue
        folds = (p.target_n - p.reproductions) * (p.test_folds // max(p.reproductions, 1))
        extra_folds += folds
        per = p.seconds_per_epoch.value
        if per is not None:
            extra_hours += folds * p.epochs_per_fold["test"].value * per / 3600
    console.print(
        f"--target-ci {plan.target_ci:g} (MAP@R points, 95% half-width): the reproductions of "
        f"column n for ±{plan.target_ci:g} change the test stage by {extra_folds:+d} fold "
        f"trainings ({extra_hours:+,.1f} h)",
        soft_wrap=True,
        highlight=False,
    )


def plan_json(plan: CampaignPlan) -> str:
    """The plan as JSON: every field, and per study and in total what is left."""
    out: dict[str, Any] = asdict(plan)
    for p, d in zip(plan.studies, out["studies"], strict=True):
        d["left"] = {"fold_trainings": p.folds_left, "epochs": p.epochs(), "hours": p.hours()}
        d["planned"] = {
            "fold_trainings": p.folds,
            "epochs": p.epochs(left=False),
            "hours": p.hours(left=False),
        }
    hours = [d["left"]["hours"] for d in out["studies"]]
    disk = [p.disk_bytes for p in plan.studies]
    out["total"] = {
        "fold_trainings_left": sum(p.folds_left for p in plan.studies),
        "fold_trainings": sum(p.folds for p in plan.studies),
        "epochs_left": sum(p.epochs() for p in plan.studies),
        "hours_left": None if None in hours else sum(hours),
        "disk_bytes": None if None in disk else sum(disk),
        "wall_clock_hours": None if plan.wall is None else plan.wall.hours,
    }
    return json.dumps(out, indent=2)


def print_spent(plan: CampaignPlan, spent: dict[str, Spent]) -> None:
    """Planned (the full budget, estimated as ``campaign plan`` does) against spent (measured
    from the store), per study."""
    table = Table(title=f"planned vs spent (hours on {plan.device})")
    for name in ("study", "fold trainings", "epochs", "hours"):
        table.add_column(name, justify="left" if name == "study" else "right")
    for p in plan.studies:
        s = spent[p.study]
        table.add_row(
            p.study,
            f"{s.fold_trainings} / {p.folds}",
            f"{s.epochs:,} / {p.epochs(left=False):,.0f}",
            f"{hours_text(s.hours)} / {hours_text(p.hours(left=False))}",
        )
    print_table(table)
    console.print(
        "spent / planned: spent is measured from the store (fold runs that ended, epochs "
        "trained, recorded wall time); planned is the full budget as `mlrc campaign plan` "
        "estimates it now",
        soft_wrap=True,
        highlight=False,
    )
