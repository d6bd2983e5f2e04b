"""``mlrc replay``: what a finished, unpruned study would have spent and chosen under a pruner
and an in-fold stopping rule, from its recorded curves (no training)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from mlrc.cli.options import DEFAULT_STORAGE, StorageOpt
from mlrc.cli.terminal import console, fail, print_table, user_errors
from mlrc.errors import counted

__all__ = ["replay"]


def replay(
    studies: Annotated[
        list[str] | None, typer.Argument(help="finished, unpruned studies in the store")
    ] = None,
    pruner: Annotated[
        str,
        typer.Option("--pruner", help="none, median[:startup=N] or wilcoxon[:p=P] (between folds)"),
    ] = "none",
    stop: Annotated[
        str,
        typer.Option(
            "--stop",
            help="none or gain[:quantile=Q,slack=S,fold_slack=E,startup=N,future=F] (inside a fold)",
        ),
    ] = "none",
    storage: StorageOpt = DEFAULT_STORAGE,
    corpus: Annotated[
        Path | None,
        typer.Option("--corpus", help="replay the studies of a corpus file (bench/corpus/)"),
    ] = None,
    trials: Annotated[
        int | None,
        typer.Option(
            "--trials",
            min=1,
            help="replay each study's first N trials (a search of budget N, same sampler and seed)",
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="one JSON object per study and line")
    ] = False,
) -> None:
    """Replay finished, unpruned studies under a pruner and an in-fold stopping rule, without
    training: per study, the fold-epochs spent (a fraction of the unpruned study's), whether
    the configuration the full protocol chose is still chosen, and the regret in validation
    MAP@R points when it is not. Exact for pruners and stop rules (the recorded trials in their
    order, the recorded curves); what a sampler would have suggested instead of a pruned
    trial's successors is outside it."""
    from mlrc.search import replay as rp

    if not studies and corpus is None:
        fail("name at least one study, or give --corpus FILE")
    with user_errors():
        rules = rp.parse_rules(pruner, stop)
        recorded = _recorded(studies or [], corpus, storage)
        if trials is not None:
            recorded = [rp.first_trials(s, trials) for s in recorded]
        results = [rp.replay(s, rules) for s in recorded]
    if as_json:  # JSON Lines: one object per study
        sys.stdout.write("".join(json.dumps(r.as_json()) + "\n" for r in results))
        return
    _table(results, rules.label())


def _recorded(studies: list[str], corpus: Path | None, storage: str) -> list:
    """The studies to replay: ``studies`` of the corpus file (all where none is named), or of
    the store; an absent one is one line."""
    from mlrc import store
    from mlrc.search import replay as rp

    if corpus is None:
        engine = store.connect(storage, read_only=True)
        return [rp.recorded_study(engine, name) for name in studies]
    if not corpus.is_file():
        fail(f"--corpus {corpus}: no such file")
    have = rp.read_corpus(corpus)[1]
    if missing := set(studies) - {s.name for s in have}:
        names = ", ".join(s.name for s in have)
        fail(f"--corpus {corpus}: no study {sorted(missing)[0]!r} (it has {names})")
    return [s for s in have if not studies or s.name in studies]


def _table(results: list, label: str) -> None:
    table = Table(title=f"replay: {label}")
    cols = ("study", "fold-epochs", "× unpruned", "pruned (stopped)", "choice", "same", "regret")
    for c in cols:
        table.add_column(c, justify="left" if c == "study" else "right")
    for r in results:
        table.add_row(
            r.study,
            f"{r.fold_epochs} of {r.full_fold_epochs}",
            f"{r.fold_epochs_fraction:.2f}",
            f"{r.pruned} ({r.stopped})",
            f"trial {r.choice} (full: {r.full_choice})",
            "yes" if r.same_choice else "NO",
            f"{100 * r.regret:.2f} pts",
        )
    print_table(table)
    if results:
        n = len(results)
        same = sum(r.same_choice for r in results)
        frac = sum(r.fold_epochs for r in results) / sum(r.full_fold_epochs for r in results)
        mean_regret = 100 * sum(r.regret for r in results) / n
        console.print(
            f"{counted(n, 'study')}: fold-epochs {frac:.2f} × unpruned; same choice in {same} of {n}; "
            f"mean regret {mean_regret:.2f} MAP@R points",
            highlight=False,
        )
