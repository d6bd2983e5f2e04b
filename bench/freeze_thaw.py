"""Freeze-thaw in replay (issue #25): stop folds aggressively during the search, resume later.

    .venv/bin/python bench/freeze_thaw.py [--corpus bench/corpus/cpu-omniglot-glyphs.json.gz]

The in-fold rules of ``search.stop`` decide once, against the incumbent of the moment: a trial
they stop is lost. Freeze-thaw (after Swersky, Snoek & Adams 2014, "Freeze-Thaw Bayesian
Optimization") only pauses it. Here, replayed on the committed corpus without training:

1. **search** — the recorded trials in their order, each fold under an aggressive rule (the gain
   rule with a lower quantile and no slack, or ``explore``'s rank rule on fold 0); a fold the
   rule ends is *paused* (its checkpoint kept, the epochs trained so far spent);
2. **thaw** — after the last trial, the paused trial whose bound (the recommended rule's margin,
   :meth:`mlrc.protocol.stopping.FoldStop.margin`) is highest is resumed from where it paused,
   under the recommended rule against the incumbent of now, its later folds likewise; again
   until no paused trial can still beat the incumbent.

Two bounds are replayed for the thaw: ``end`` builds it from what is known at the end (every
complete fold's later gain, the best of every fold: the bound the rule is tuned with) and
``paused`` from what was known when the trial paused (only the incumbent is new). The choice is
the best complete trial; a fold's epochs are counted once (a resumed fold continues). What a
sampler would suggest after paused trials is outside the replay, as for ``mlrc replay``.

Prints, per first-stage rule, bound and length (each study's first 20, 30, 40, 50 trials), the
fold-epochs spent as a fraction of the unpruned studies' (pooled), the search stage's share, and
the studies whose full-protocol choice is lost; writes ``bench/results/freeze_thaw.csv``.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_csv  # noqa: E402
from pruning import CORPUS, LENGTHS, rank_rule, recommended  # noqa: E402

from mlrc.config.schema import StopSpec  # noqa: E402
from mlrc.protocol.stopping import Curve, FoldStop  # noqa: E402
from mlrc.search import replay as rp  # noqa: E402
from mlrc.search.pruning import (  # noqa: E402
    Rules,
    best_fold_values,
    fold_stop,
    incumbent_of,
    trained_curve,
)

Snapshot = tuple[int, dict[int, float]]  # (complete curves known, best value of each fold)


@dataclass
class Search:
    """What the replay knows: complete trials, fold values, complete curves, paused folds."""

    study: rp.RecordedStudy
    complete: list[tuple[int, str, float]] = field(default_factory=list)
    folds: dict[str, dict[int, float]] = field(default_factory=dict)
    curves: list[Curve] = field(default_factory=list)
    curve_folds: list[int] = field(default_factory=list)
    trained: dict[tuple[str, int], int] = field(default_factory=dict)  # (hash, fold) → epochs
    # trial → (position of its paused fold, epoch reached, its done folds, best so far, snapshot)
    paused: dict[int, tuple[int, int, dict[int, float], float, Snapshot]] = field(
        default_factory=dict
    )

    @property
    def spent(self) -> int:
        return sum(self.trained.values())

    def snapshot(self) -> Snapshot:
        return len(self.curves), best_fold_values(self.folds.values())

    def rule(
        self, spec: StopSpec, fold: int, done: dict[int, float], snap: Snapshot | None = None
    ) -> FoldStop | None:
        """:func:`mlrc.search.pruning.fold_stop` now, or with the curves of ``snap``."""
        n = self.study.n_folds
        full = {k: v for k, v in self.folds.items() if len(v) == n}
        curves, best = (
            (self.curves, best_fold_values(self.folds.values()))
            if snap is None
            else (
                self.curves[: snap[0]],
                snap[1],
            )
        )
        return fold_stop(
            spec, fold, n, done, incumbent_of(self.complete, full), len(self.complete),
            curves, self.study.epochs, best,
        )  # fmt: skip


def walk(f: rp.RecordedFold, stop: Any, after: int) -> tuple[int, float | None, bool]:
    """(epoch reached, best so far, stopped) of fold ``f`` resumed after epoch ``after`` (0: from
    the start) under ``stop``, asked at each validation that does not end the fold by itself."""
    trained = trained_curve(f.points)
    best: float | None = None
    for i, (e, v) in enumerate(trained):
        best = v if best is None else max(best, v)
        if e <= after:
            continue
        if stop is None or (f.status == "complete" and i == len(trained) - 1):
            break
        if stop.reason(e, best) is not None:
            return e, best, True
    return f.epochs, best, False


def run_trial(
    s: Search, t: rp.RecordedTrial, make: Any, start: tuple, snap: Snapshot | None
) -> None:
    """Trial ``t`` from (fold position, epoch, done folds) under the rule ``make(fold, done)``:
    it pauses (``s.paused``), fails, or completes."""
    pos, after, done = start
    for i in range(pos, len(t.folds)):
        f = t.folds[i]
        e, best, stopped = walk(f, make(f.fold, done), after if i == pos else 0)
        key = (t.params_hash, f.fold)
        if key not in s.trained or (i == pos and after):  # a repeated set reuses its folds
            s.trained[key] = max(s.trained.get(key, 0), e)  # a resumed fold goes on
        if stopped:
            s.paused[t.number] = (i, e, dict(done), best, snap or s.snapshot())
            return
        if f.status != "complete" or f.objective is None:
            return
        done[f.fold] = f.objective
        s.folds.setdefault(t.params_hash, {})[f.fold] = f.objective
        s.curves.append(trained_curve(f.points))
        s.curve_folds.append(f.fold)
    if t.state == "complete" and t.value is not None:
        s.complete.append((t.number, t.params_hash, t.value))


def search_stage(study: rp.RecordedStudy, first: StopSpec, rank: tuple | None) -> Search:
    """Stage 1: the recorded trials under the aggressive rule, stopped folds paused."""
    s = Search(study)
    for t in study.trials:

        def make(fold: int, done: dict[int, float]) -> Any:
            base = s.rule(first, fold, done)
            if rank is None:
                return base
            same = [c for c, j in zip(s.curves, s.curve_folds, strict=True) if j == fold]
            return rank_rule(*rank, (0,))(base, fold, same)  # explore's rank rule, on fold 0

        run_trial(s, t, make, (0, 0, {}), None)
    return s


def thaw(s: Search, safe: StopSpec, bound: str) -> None:
    """Stage 2: resume the paused trial with the highest margin under ``safe`` until none can
    beat the incumbent (``bound``: ``end`` or ``paused``, see the module docstring)."""
    by = {t.number: t for t in s.study.trials}
    while s.paused:
        best = None
        for n, (i, e, done, b, snap) in s.paused.items():
            rule = s.rule(safe, by[n].folds[i].fold, done, snap if bound == "paused" else None)
            m = None if rule is None else rule.margin(e, b)
            m = float("inf") if m is None else m  # no bound yet: it may still win
            if best is None or (m, -n) > best[:2]:
                best = (m, -n, n)
        if best is None or best[0] < 0:
            return
        n = best[2]
        i, e, done, _, snap = s.paused.pop(n)
        snap_ = snap if bound == "paused" else None
        run_trial(
            s, by[n], lambda fold, d, snap_=snap_: s.rule(safe, fold, d, snap_), (i, e, done), snap_
        )
        if s.paused.get(n, (None, None))[:2] == (i, e):
            return  # no progress (cannot happen with a margin ≥ 0; a guard)


def replay_one(study: rp.RecordedStudy, first: StopSpec, rank: tuple | None, bound: str) -> dict:
    s = search_stage(study, first, rank)
    searched = s.spent
    thaw(s, recommended().stop, bound)
    full = study.full_choice()
    choice = max(s.complete, key=lambda c: (c[2], -c[0]))
    return {
        "study": study.name,
        "fold_epochs": s.spent,
        "search_stage": searched,
        "full": rp.replay(study, Rules()).full_fold_epochs,
        "same_choice": choice[0] == full.number,
        "regret": float(full.value - choice[2]),
    }


FIRST = [  # (label, the stage-1 gain rule, rank rungs and k or None)
    *[
        (f"gain(q={q:g}, slack=0)", StopSpec(quantile=q, slack=0.0, startup=1), None)
        for q in (0.5, 0.75, 0.9, 1.0)
    ],
    *[
        (
            f"gain(q=1, slack=0) + rank(rungs={','.join(map(str, r))}, k=1, fold 0)",
            StopSpec(quantile=1.0, slack=0.0, startup=1),
            (r, 1),
        )
        for r in ((2,), (3, 6))
    ],  # fmt: skip
    ("recommended", None, None),
]


def _job(job: tuple) -> list[dict]:
    label, first, rank, bound, n, studies = job
    first = first or recommended().stop
    return [
        {
            "rule": label,
            "bound": bound,
            "trials": n,
            **replay_one(rp.first_trials(st, n), first, rank, bound),
        }
        for st in studies
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args()
    about, studies = rp.read_corpus(a.corpus)
    jobs = [
        (label, first, rank, bound, n, studies)
        for (label, first, rank), bound, n in itertools.product(FIRST, ("end", "paused"), LENGTHS)
    ]
    with ProcessPoolExecutor(a.jobs) as ex:
        rows = [r for out in ex.map(_job, jobs) for r in out]
    df = pd.DataFrame(rows)
    path = write_csv(df, "freeze_thaw")
    g = df.groupby(["rule", "bound", "trials"], sort=False).agg(
        spent=("fold_epochs", "sum"), search=("search_stage", "sum"), full=("full", "sum"),
        lost=("same_choice", lambda x: int((~x).sum())), regret=("regret", "mean"),
    )  # fmt: skip
    print(f"\ncorpus: {len(studies)} studies, {about.get('date')}; written {path}\n")
    print("| search-stage rule | thaw bound | " + " | ".join(f"{n} trials" for n in LENGTHS) + " |")
    print("|---|---|" + "--:|" * len(LENGTHS))
    for (label, bound), sub in g.groupby(level=[0, 1], sort=False):
        cells = [
            f"{r.spent / r.full:.2f}× ({r.search / r.full:.2f}×), {r.lost} lost"
            for r in sub.itertuples()
        ]
        print(f"| {label} | {bound} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
