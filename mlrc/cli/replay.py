"""``mlrc replay``: what a finished, unpruned study would have spent and chosen under a pruner
and an in-fold stopping rule, from its recorded curves (no training)."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from mlrc.cli.options import DEFAULT_STORAGE, StorageOpt
from mlrc.cli.terminal import console, fail, print_table, user_errors
from mlrc.errors import counted

__all__ = ["replay"]


StopOpt = Annotated[
    str,
    typer.Option(
        "--stop",
        help="none or gain[:quantile=Q,slack=S,fold_slack=E,startup=N,future=F] (inside a fold)",
    ),
]
# the options of --certify (mlrc.search.certify)
CertifyOpt = Annotated[
    bool,
    typer.Option(
        "--certify",
        help="certify rules over the studies: within-δ and exact-choice rates with "
        "Clopper–Pearson bounds at each budget, tuned leaving one study and one dataset out",
    ),
]
RuleOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--rule",
        help="with --certify: a candidate PRUNER[+STOP], e.g. none+gain:slack=0.01 "
        "(repeat it; the unpruned search is always one)",
    ),
]
BudgetsOpt = Annotated[
    str, typer.Option("--budgets", help="with --certify: study lengths, comma-separated")
]
DeltaOpt = Annotated[
    float | None,
    typer.Option(
        "--delta",
        min=0.0,
        help="with --certify: δ (MAP@R as a fraction) for every dataset, instead of the "
        "seed-to-seed spread measured from the studies' reproductions",
    ),
]
PermutationsOpt = Annotated[
    int,
    typer.Option(
        "--permutations",
        min=0,
        help="with --certify: replay the recommended rule on N permuted trial and fold "
        "orders (a robustness figure)",
    ),
]


def replay(
    studies: Annotated[
        list[str] | None, typer.Argument(help="finished, unpruned studies in the store")
    ] = None,
    pruner: Annotated[
        str,
        typer.Option(
            "--pruner",
            help="none, median[:startup=N], wilcoxon[:p=P], sequential[:delta=D,alpha=A,startup=N] or forgiving[:startup=N] (between folds)",
        ),
    ] = "none",
    stop: StopOpt = "none",
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
    certify: CertifyOpt = False,
    rule: RuleOpt = None,
    budgets: BudgetsOpt = "20,30,40,50",
    delta: DeltaOpt = None,
    permutations: PermutationsOpt = 0,
    seed: Annotated[int, typer.Option("--seed", help="of the permutations")] = 0,
    jobs: Annotated[int, typer.Option("--jobs", min=1, help="processes for --certify")] = 1,
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
        if certify:
            candidates = [rules, *(_rule(r) for r in rule or [])]
            how = (_budgets(budgets), delta, permutations, seed, jobs)
            return _certify(recorded, candidates, *how, as_json=as_json)
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


def _rule(spec: str):  # noqa: ANN202
    """``PRUNER[+STOP]`` → :class:`~mlrc.search.pruning.Rules`."""
    from mlrc.search import replay as rp

    pruner, _, stop = spec.partition("+")
    return rp.parse_rules(pruner.strip() or "none", stop.strip() or None)


def _budgets(text: str) -> tuple[int, ...]:
    try:
        out = tuple(sorted({int(b) for b in text.split(",") if b.strip()}))
    except ValueError:
        fail(f"--budgets {text}: expected whole numbers separated by commas, e.g. 20,30,40,50")
    if not out or out[0] < 1:
        fail(f"--budgets {text}: expected study lengths of 1 or more trials")
    return out


def _certify(
    recorded: list,
    candidates: list,
    budgets: tuple[int, ...],
    delta: float | None,
    permutations: int,
    seed: int,
    jobs: int,
    as_json: bool,
) -> None:
    """``--certify``: :func:`mlrc.search.certify.certify` (with ``permutations``: the
    robustness of the rule it recommends)."""
    from mlrc.search import certify as cf

    with console.status("replaying every rule on every study at every budget…"):
        out = cf.certify(recorded, candidates, budgets, delta, jobs, permutations, seed)
    if as_json:
        sys.stdout.write(json.dumps(out) + "\n")
        return
    _certificate(out)


def _certificate(out: dict) -> None:
    """The figures of ``--certify`` as tables: per budget, each rule in sample, then the
    tuning left out."""
    deltas = ", ".join(f"{d} {100 * v:.2f} pts" for d, v in out["delta"].items())
    console.print(f"{counted(len(out['studies']), 'study')}; δ: {deltas}", highlight=False)
    for n, at in out["budgets"].items():
        table = Table(title=f"{n} trials (oracle {at['oracle']:.2f}×, floor {at['floor']:.2f}×)")
        for c in ("rules", "× unpruned", "within δ", "lower 95 %", "exact", "mean / worst regret"):
            table.add_column(c, justify="left" if c == "rules" else "right")
        rows = [(lb, f) for lb, f in at["rules"].items()]
        for key, name in (("leave_one_study_out", "tuned, one study out"),
                          ("leave_one_dataset_out", "tuned, one dataset out")):  # fmt: skip
            if at[key] is not None:
                rows.append((name, at[key]))
        for label, f in rows:
            table.add_row(
                label,
                f"{f['fold_epochs_fraction']:.2f}",
                f"{f['within']} of {f['studies']}",
                f"{f['within_bounds'][0]:.2f}",
                f"{f['exact']} of {f['studies']}",
                f"{100 * f['mean_regret']:.2f} / {100 * f['worst_regret']:.2f} pts",
            )
        print_table(table)
    console.print(f"recommended (in sample, longest budget): {out['recommended']}", highlight=False)
    needed = sorted(out["trials_needed"].values())
    console.print(
        f"the longest budget's choice (within δ) was first found at trial {needed[0]}–"
        f"{needed[-1]} (median {statistics.median(needed):g})",
        highlight=False,
    )
    if rob := out.get("robustness"):
        for n in out["budgets"]:
            r = rob[n]
            console.print(
                f"{n} trials, {rob['permutations']} permuted orders: within δ "
                f"{r['within_rate_mean']:.2f} (worst {r['within_rate_worst']:.2f}), "
                f"{r['fold_epochs_fraction_mean']:.2f}× (worst {r['fold_epochs_fraction_worst']:.2f}×)",
                highlight=False,
            )
