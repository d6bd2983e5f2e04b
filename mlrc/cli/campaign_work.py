"""What ``mlrc campaign status`` prints of each study's work (:mod:`mlrc.search.campaign_watch`):
a table of trials and test folds done / running / left, with the worker holding each running
one, and the whole status as JSON (``--json``)."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.table import Table

from mlrc.cli.terminal import console

if TYPE_CHECKING:
    from mlrc.search.campaign_runner import Cell, Progress
    from mlrc.search.campaign_watch import Counts, StudyWork
    from mlrc.search.plan import Spent

__all__ = ["print_work", "status_json"]


def _counts(c: Counts) -> str:
    """``3 / 1 / 2 of 6``: done / running / left of the total."""
    return f"{c.done} / {c.running} / {c.left} of {c.total}"


def print_work(works: list[StudyWork]) -> None:
    """Per study: trials and test folds done / running / left; a line of totals; then a line
    per running unit with the worker that holds it."""
    table = Table(title="work (done / running / left of all)")
    for name in ("study", "trials", "test folds"):
        table.add_column(name, justify="left" if name == "study" else "right")
    for w in works:
        table.add_row(escape(w.study), _counts(w.trials), _counts(w.test_folds))
    console.print(table)
    trials, tests = _sum([w.trials for w in works]), _sum([w.test_folds for w in works])
    console.print(
        f"in all: trials {_counts(trials)}, test folds {_counts(tests)} "
        "(a test fold: one reproduction's training on one fold)",
        soft_wrap=True,
        highlight=False,
    )
    for w in works:
        for h in w.running:
            seen = f" (seen {h.seen} UTC)" if h.seen else ""
            console.print(
                escape(
                    f"running: {w.study} {h.what} on {h.worker or 'a worker not recorded'}{seen}"
                ),  # fmt: skip
                soft_wrap=True,
                highlight=False,
            )


def _sum(counts: list[Counts]) -> Counts:
    from mlrc.search.campaign_watch import Counts

    return Counts(
        *(sum(getattr(c, f) for c in counts) for f in ("total", "done", "running", "left"))
    )


def _by_worker(works: list[StudyWork]) -> dict[str, list[str]]:
    """Worker → ``study: trial 3`` of each unit it holds (unrecorded workers left out)."""
    out: dict[str, list[str]] = {}
    for w in works:
        for h in w.running:
            if h.worker is not None:
                out.setdefault(h.worker, []).append(f"{w.study} {h.what}")
    return dict(sorted(out.items()))


def status_json(
    name: str,
    grid: list[Cell],
    states: dict[str, Progress],
    works: list[StudyWork],
    spent: dict[str, Spent] | None,
) -> str:
    """The status as JSON: per study its cell, state and text (the grid's), its trials and
    test folds (total, done, running, left), what runs and on which worker, and what it spent
    (None: not read); totals of trials and test folds."""
    studies: list[dict[str, Any]] = []
    for c, w in zip(grid, works, strict=True):
        d = {"study": c.name, "row": c.row, "column": c.column}
        d |= {"state": states[c.name].state, "text": states[c.name].text}
        d |= {k: v for k, v in asdict(w).items() if k != "study"}
        d["spent"] = asdict(spent[c.name]) if spent else None
        studies.append(d)
    total = {
        "trials": asdict(_sum([w.trials for w in works])),
        "test_folds": asdict(_sum([w.test_folds for w in works])),
        "workers": _by_worker(works),
    }
    return json.dumps({"campaign": name, "studies": studies, "total": total}, indent=2)
