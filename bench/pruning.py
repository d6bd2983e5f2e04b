"""The pruning corpus and the rules tuned on it (issue #25).

    .venv/bin/python bench/pruning.py corpus [--trials 50] [--storage URL] [--dataset ZIP]
    .venv/bin/python bench/pruning.py tune [--corpus bench/corpus/cpu-omniglot-glyphs.json.gz]
    .venv/bin/python bench/pruning.py where [--corpus …] [--trials N]
    .venv/bin/python bench/pruning.py explore [--corpus …] [--trials N]

``corpus`` runs complete, unpruned cpu-preset studies — losses contrastive, multi_similarity
and ntxent × datasets Omniglot (the subset zip, $MLRC_OMNIGLOT_ZIP or --dataset) and glyphs
(built in), ``--trials`` each (GP sampler, seed 0, one thread per fold, two studies at a time)
— into one SQLite store (``--storage`` to reuse one: a store of shorter studies grows to
``--trials``, the trials it has kept), then writes their curves to
``bench/corpus/cpu-omniglot-glyphs.json.gz`` (:func:`mlrc.search.replay.write_corpus`) with the
machine, the date, the git commit and this command.

``tune`` replays the corpus under a grid of rules (pruner none | median | wilcoxon, × in-fold
stop off | gain with quantile, slack, fold slack and future), on each study's first 20, 30, 40
and 50 trials (the studies a smaller budget with the same sampler and seed runs), and for each
rule and length reports the fold-epochs spent (a fraction of the unpruned studies', pooled),
the studies whose full-protocol choice is pruned, and the mean regret (validation MAP@R points).
The recommended rule is the cheapest at 50 trials of those that, at every length, never prune
the full protocol's choice with a mean regret ≤ 0.2 points; the tuning is also checked leaving
one study out: the rule is picked on the other studies and replayed on the one left out, for
each study in turn. Writes ``bench/results/pruning.csv``, ``mlrc/resources/pruning_risk.json``
(the measured risk a study stores with itself, by length) and markdown tables on stdout
(docs/guide/performance.md quotes them).

``where`` says where the fold-epochs go under the recommended rules (the full choice, the other
trials that complete, trials pruned between folds, trials whose fold was stopped) and what any
rule must spend: the trials that set a new best in the recorded order (a rule whose bound holds
for them completes them), plus k fold-epochs for each other trial.

``explore`` replays a rule that is not (yet) a ``search.stop`` rule, through
:func:`mlrc.search.replay.replay`'s ``stop_with``: ``rank`` — at each rung epoch r of the folds
it applies to, a fold whose best so far is below the k-th best of the same fold's complete
curves at epoch r (earlier trials) stops; elsewhere the gain rule decides — over a grid of
rungs, k, folds and slack, with the same pick and leave-one-study-out as ``tune`` at one length
(nothing written but stdout).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import BENCH, machine, write_csv  # noqa: E402

from mlrc import store  # noqa: E402
from mlrc.config.schema import StopSpec  # noqa: E402
from mlrc.protocol.stopping import Curve, FoldStop  # noqa: E402
from mlrc.search import replay as rp  # noqa: E402
from mlrc.search.pruning import RISK_TABLE, Rules  # noqa: E402

CORPUS = BENCH / "corpus" / "cpu-omniglot-glyphs.json.gz"
LOSSES = ("contrastive", "multi_similarity", "ntxent")
GOAL_FRACTION, GOAL_REGRET = 0.3, 0.002  # issue #25: ≤ 0.3 × fold-epochs, regret ≤ 0.2 points
LENGTHS = (20, 30, 40, 50)  # the corpus replayed on its studies' first N trials (50: all)
# the rules recommended on the 20-trial corpus before (wilcoxon, gain without a fold slack)
BEFORE = Rules(
    "wilcoxon",
    prune_p=0.3,
    stop=StopSpec(quantile=1.0, slack=0.02, fold_slack=0.0, startup=1, future="best"),
)


def study_docs(trials: int, dataset: Path | None) -> list[dict]:
    omniglot = {"name": "omniglot", **({"root": str(dataset)} if dataset else {})}
    return [
        {
            "name": f"corpus-{loss}-{name}",
            "dataset": ds,
            "preset": "cpu",
            "loss": {"name": loss},
            "search": {"trials": trials, "sampler": "gp", "seed": 0},
        }
        for name, ds in (("omniglot", omniglot), ("glyphs", {"name": "glyphs"}))
        for loss in LOSSES
    ]


def run_corpus(a: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="mlrc-corpus-"))
    url = a.storage or f"sqlite:///{tmp / 'corpus.db'}"
    docs = study_docs(a.trials, a.dataset)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    queue, running = list(docs), []
    while queue or running:  # two studies at a time, one thread each
        while queue and len(running) < 2:
            doc = queue.pop(0)
            path = tmp / f"{doc['name']}.yaml"
            path.write_text(yaml.safe_dump(doc))
            cmd = [sys.executable, "-m", "mlrc.cli", "study", "run", str(path), "--storage", url]
            cmd += ["--artifacts", str(tmp / "art"), "--quiet", "--threads", "1"]
            running.append((doc["name"], subprocess.Popen(cmd, env=env)))
        for name, p in list(running):
            if p.poll() is not None:
                if p.returncode != 0:
                    raise SystemExit(f"{name} failed (exit {p.returncode})")
                running.remove((name, p))
        time.sleep(2)
    engine = store.connect(url)
    studies = [rp.recorded_study(engine, d["name"]) for d in docs]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    about = {
        "made_by": "bench/pruning.py corpus " + " ".join(sys.argv[2:]),
        "machine": machine(),
        "date": dt.date.today().isoformat(),
        "commit": commit.stdout.strip(),
        "preset": "cpu",
        "trials": a.trials,
    }
    print(f"wrote {rp.write_corpus(studies, a.out, about)} ({len(studies)} studies)")


def grid() -> list[Rules]:
    pruners = [Rules(), Rules("median", 5), Rules("wilcoxon", prune_p=0.3)]
    stops = [None] + [
        StopSpec(quantile=q, slack=s, fold_slack=e, startup=1, future=f)
        for q, s, e, f in itertools.product(
            (0.75, 0.9, 1.0),
            (0.0, 0.01, 0.02, 0.04),
            (0.0, 0.01, 0.02, 0.04, 0.06),
            ("incumbent", "best"),
        )
    ]
    return [Rules(p.pruner, p.prune_startup, p.prune_p, stop) for p in pruners for stop in stops]


def _replay_one(job: tuple) -> tuple[int, str, dict[str, rp.ReplayResult]]:
    n, rules, studies, stop_with = job
    label = rules.label() if stop_with is None else stop_with[0]
    make = None if stop_with is None else rank_rule(*stop_with[1])
    return n, label, {s.name: rp.replay(rp.first_trials(s, n), rules, make) for s in studies}


def replay_grid(
    rules: list[Rules],
    studies: list[rp.RecordedStudy],
    lengths: tuple[int, ...],
    jobs: int,
    rank: list[tuple[str, tuple]] | None = None,
) -> dict[int, dict[str, dict[str, rp.ReplayResult]]]:
    """length → rule label → study → its replay on the study's first ``length`` trials, in
    ``jobs`` processes; ``rank``: (label, rank_rule's arguments) replayed with ``rules[i]``."""
    todo = [
        (n, r, studies, None if rank is None else rank[i])
        for n in lengths
        for i, r in enumerate(rules)
    ]
    out: dict[int, dict[str, dict[str, rp.ReplayResult]]] = {n: {} for n in lengths}
    with ProcessPoolExecutor(jobs) as ex:
        for n, label, by in ex.map(_replay_one, todo, chunksize=4):
            out[n][label] = by
    return out


def figures(results: list[rp.ReplayResult]) -> dict:
    """Pooled figures of one rule over studies (regret as a fraction)."""
    spent = sum(r.fold_epochs for r in results)
    full = sum(r.full_fold_epochs for r in results)
    return {
        "studies": len(results),
        "fold_epochs_fraction": spent / full,
        "choice_pruned": sum(not r.same_choice for r in results),
        "mean_regret": sum(r.regret for r in results) / len(results),
    }


def acceptable(f: dict) -> bool:
    return f["choice_pruned"] == 0 and f["mean_regret"] <= GOAL_REGRET


def pick(tables: dict[int, dict[str, dict]]) -> str | None:
    """The cheapest rule, at the longest length, of those acceptable at every length of
    ``tables`` (length → label → figures): a rule must keep the full protocol's choice of the
    studies searched for 20, 30, … trials alike (their first trials); ties: the first."""
    longest = max(tables)
    ok = [
        (f["fold_epochs_fraction"], i, label)
        for i, (label, f) in enumerate(tables[longest].items())
        if all(acceptable(tables[n][label]) for n in tables)
    ]
    return min(ok)[2] if ok else None


def tune(a: argparse.Namespace) -> None:
    about, studies = rp.read_corpus(a.corpus)
    lengths = tuple(n for n in LENGTHS if n <= about.get("trials", max(LENGTHS)))
    rules = grid()
    if BEFORE.label() not in {r.label() for r in rules}:
        rules.append(BEFORE)
    replays = replay_grid(rules, studies, lengths, a.jobs)
    longest = lengths[-1]  # the rule is picked on whole studies (the protocol's 50 trials)
    tables = {n: {lb: figures(list(by.values())) for lb, by in replays[n].items()} for n in lengths}
    best = pick(tables)
    loo = leave_one_out(replays, [s.name for s in studies])
    rows = [
        {"trials": n, "rules": lb, **f, "recommended": lb == best}
        for n in lengths
        for lb, f in tables[n].items()
    ]
    df = pd.DataFrame(rows)
    print(f"wrote {write_csv(df, 'pruning')}")
    risk = {
        "corpus": f"bench/corpus/{a.corpus.name}",
        "about": about,
        "lengths": list(lengths),
        "recommended": best,
        "rules": {
            lb: {
                "by_length": {
                    str(n): {**tables[n][lb], **({"leave_one_out": loo[n]} if lb == best else {})}
                    for n in lengths
                }
            }
            for lb in tables[longest]
        },
    }
    out = Path(__file__).resolve().parent.parent / "mlrc" / "resources" / RISK_TABLE
    out.write_text(json.dumps(risk, indent=1, sort_keys=True) + "\n")
    print(f"wrote {out}")
    show(tables, best, loo, about, studies, replays, lengths)


def leave_one_out(
    replays: dict[int, dict[str, dict[str, rp.ReplayResult]]], names: list[str]
) -> dict[int, dict]:
    """The tuning checked on studies it did not see: for each study, the rule :func:`pick`
    picks on the others, replayed on it (no pruner where no rule is acceptable on the others:
    the study is then searched in full); length → figures pooled like :func:`figures`, with
    each pick."""
    held: dict[int, list[rp.ReplayResult]] = {n: [] for n in replays}
    picks = {}
    for name in names:
        label = pick(
            {
                n: {lb: figures([r for s, r in by.items() if s != name]) for lb, by in rs.items()}
                for n, rs in replays.items()
            }
        )
        picks[name] = label or Rules().label()
        for n, rs in replays.items():
            r = rs[label][name] if label else unpruned(next(iter(rs.values()))[name])
            held[n].append(r)
    return {n: {**figures(h), "picks": picks} for n, h in held.items()}


def unpruned(r: rp.ReplayResult) -> rp.ReplayResult:
    """What searching ``r``'s study in full spends and picks."""
    return dataclasses.replace(
        r, fold_epochs=r.full_fold_epochs, choice=r.full_choice, same_choice=True, regret=0.0
    )


def table(rows: list[tuple[str, dict]], n_studies: int, lost: dict | None = None) -> None:
    """A markdown table of rules' figures; ``lost``: label → choices lost at each length."""
    extra = " choice pruned at 20, 30, … trials |" if lost else ""
    print(f"| rules | fold-epochs × unpruned | choice pruned | mean regret (points) |{extra}")
    print("|---|--:|--:|--:|" + ("--:|" if lost else ""))
    for label, f in rows:
        more = f" {', '.join(map(str, lost[label]))} |" if lost else ""
        print(
            f"| {label} | {f['fold_epochs_fraction']:.2f} | {f['choice_pruned']} of "
            f"{n_studies} | {100 * f['mean_regret']:.2f} |{more}"
        )


def show(tables, best, loo, about, studies, replays, lengths) -> None:
    n_st, longest = len(studies), lengths[-1]
    print(f"\ncorpus: {n_st} studies, {about.get('machine')}, {about.get('date')}")
    t = tables[longest]
    plain = [Rules().label(), Rules("median", 5).label(), Rules("wilcoxon", prune_p=0.3).label()]
    print(f"\npruners alone ({longest} trials):\n")
    table([(lb, t[lb]) for lb in plain], n_st)
    print(f"\nthe cheapest rules by the number of choices they lose ({longest} trials):\n")
    per = {lb: [tables[n][lb]["choice_pruned"] for n in lengths] for lb in t}
    for lost in range(4):
        ok = sorted(
            (f["fold_epochs_fraction"], lb) for lb, f in t.items() if f["choice_pruned"] == lost
        )[:3]
        table([(lb, t[lb]) for _, lb in ok], n_st, per)
    for label, what in ((best, "recommended"), (BEFORE.label(), "recommended before")):
        if label is None:
            continue
        print(f"\n{what}: {label}, by study length (the studies' first N trials):\n")
        print("| trials | fold-epochs × unpruned | choice pruned | mean regret (points) |")
        print("|--:|--:|--:|--:|")
        for n in lengths:
            f = tables[n][label]
            print(
                f"| {n} | {f['fold_epochs_fraction']:.2f} | {f['choice_pruned']} of {n_st} | "
                f"{100 * f['mean_regret']:.2f} |"
            )
    print("\nthe tuning, leaving one study out (picked on the others, replayed on it):\n")
    print("| trials | fold-epochs × unpruned | choice pruned | mean regret (points) |")
    print("|--:|--:|--:|--:|")
    for n in lengths:
        lo = loo[n]
        print(
            f"| {n} | {lo['fold_epochs_fraction']:.2f} | {lo['choice_pruned']} of {n_st} | "
            f"{100 * lo['mean_regret']:.2f} |"
        )
    if best is None:
        print(f"\nno rule keeps every choice at {longest} trials")
        return
    print("\nper study:\n\n| study | fold-epochs × unpruned | same choice | regret (points) |")
    print("|---|--:|:-:|--:|")
    for name, r in replays[longest][best].items():
        same = "yes" if r.same_choice else "no"
        print(f"| {name} | {r.fold_epochs_fraction:.2f} | {same} | {100 * r.regret:.2f} |")
    print(f"\nleave one study out, the picks: {json.dumps(loo[longest]['picks'], indent=1)}")


def recommended() -> Rules:
    """The rules ``tune`` recommends (no pruner between folds, ``search.stop``'s defaults)."""
    return Rules(stop=StopSpec())


def records(study: rp.RecordedStudy) -> set[int]:
    """The trials that set a new best value in the recorded order (the last: the full choice)."""
    best, out = None, set()
    for t in study.trials:
        if t.value is not None and (best is None or t.value > best):
            best, out = t.value, out | {t.number}
    return out


def where(a: argparse.Namespace) -> None:
    """Where the fold-epochs go under the recommended rules, and what any rule must spend."""
    _, studies = rp.read_corpus(a.corpus)
    studies = [rp.first_trials(s, a.trials) for s in studies]
    full = spent = 0
    parts = dict.fromkeys(("full choice", "other complete", "pruned between folds", "stopped"), 0)
    floor, must = dict.fromkeys((1, 2, 3, 4), 0), 0
    plain = dict.fromkeys(("full choice", "trials below the median value", "patience tails"), 0)
    for s in studies:
        r = rp.replay(s, recommended())
        unpruned = rp.replay(s, Rules())  # each trial's fold-epochs without pruning
        for part, e in unpruned_parts(s, unpruned).items():
            plain[part] += e
        full, spent = full + r.full_fold_epochs, spent + r.fold_epochs
        for n, e in r.trial_epochs.items():
            how = r.decisions[n]
            part = "full choice" if n == r.full_choice else "other complete"
            if how != "complete":
                part = "stopped" if n in r.stopped_at else "pruned between folds"
            parts[part] += e
        rec = records(s)
        must += sum(e for n, e in unpruned.trial_epochs.items() if n in rec)
        for k in floor:
            floor[k] += sum(min(e, k) for n, e in unpruned.trial_epochs.items() if n not in rec)
    print(f"\nno pruner, {full} fold-epochs:\n\n| of which | fold-epochs × unpruned |\n|---|--:|")
    for part, e in plain.items():
        print(f"| {part} | {e / full:.2f} |")
    print(f"\n{recommended().label()}: {spent / full:.2f}× of {full} fold-epochs\n")
    print("| trials | fold-epochs × unpruned |\n|---|--:|")
    for part, e in parts.items():
        print(f"| {part} | {e / full:.2f} |")
    print(
        f"\ntrials that set a new best (completed by any rule whose bound holds for them): "
        f"{must / full:.2f}×"
    )
    print(
        "with every other trial stopped after k fold-epochs (an oracle): "
        + ", ".join(f"k={k}: {(must + e) / full:.2f}×" for k, e in floor.items())
    )


def unpruned_parts(study: rp.RecordedStudy, unpruned: rp.ReplayResult) -> dict[str, int]:
    """Fold-epochs of the unpruned ``study`` spent by its full choice, by trials whose value
    ends below the median of the complete trials' (failed ones too), and after each fold's best
    trained epoch (patience tails; a repeated parameter set's folds counted once)."""
    values = sorted(t.value for t in study.trials if t.value is not None)
    median = values[len(values) // 2]
    below = [t.number for t in study.trials if t.value is None or t.value < median]
    seen, tails = set(), 0
    for t in study.trials:
        for f in t.folds:
            trained = [(v, -e) for e, v in f.points if e >= 1]
            if trained and (t.params_hash, f.fold) not in seen:
                tails += f.epochs + max(trained)[1]  # epochs after the (first) best one
            seen.add((t.params_hash, f.fold))
    return {
        "full choice": unpruned.trial_epochs.get(unpruned.full_choice, 0),
        "trials below the median value": sum(unpruned.trial_epochs.get(n, 0) for n in below),
        "patience tails": tails,
    }


@dataclass(frozen=True)
class RankStop:
    """``explore``'s rank rule for one fold: at a rung epoch, stop below the k-th best level
    of the same fold's complete curves (``levels``: rung → levels, best first); else ``base``."""

    base: FoldStop
    k: int
    levels: dict[int, list[float]]

    def reason(self, epoch: int, best: float) -> str | None:
        lv = self.levels.get(epoch, [])
        if len(lv) >= self.k and best < lv[self.k - 1]:
            return f"stopped at epoch {epoch}: below the {self.k}-th best fold at that epoch"
        return self.base.reason(epoch, best)


def rank_rule(rungs: tuple[int, ...], k: int, folds: tuple[int, ...] | None) -> rp.StopWith:
    """The :class:`RankStop` maker for ``replay(stop_with=…)``; ``folds`` None: every fold.
    Nothing stops where the recommended rule has no bound yet (its startup)."""

    def make(base: FoldStop | None, fold: int, same: list[Curve]) -> RankStop | None:
        if base is None:
            return None
        on = rungs if folds is None or fold in folds else ()
        levels = {
            r: sorted(
                (max(v for t, v in c if t <= r) for c in same if c and c[0][0] <= r), reverse=True
            )
            for r in on
        }
        return RankStop(base, k, levels)

    return make


def explore(a: argparse.Namespace) -> None:
    """The rank rule over a grid, in sample and leaving one study out (see the module doc)."""
    about, studies = rp.read_corpus(a.corpus)
    rules = [Rules()]  # no pruner: the fallback where nothing is acceptable
    rank: list[tuple[str, tuple]] = [(Rules().label(), ((), 1, None))]
    rungs_grid = ((), (2,), (3,), (4,), (2, 4), (3, 6), (2, 4, 8), (3, 6, 9))
    for rungs, k, folds, slack in itertools.product(
        rungs_grid, (1, 2, 3), ((0,), None), (0.02, 0.04)
    ):
        if not rungs and (k, folds) != (1, None):
            continue  # no rung: the gain rule alone, once per slack
        base = Rules(stop=StopSpec(slack=slack, fold_slack=slack))
        label = base.label() + (
            f" + rank(rungs={','.join(map(str, rungs))}, k={k}, "
            f"folds={'all' if folds is None else ','.join(map(str, folds))})"
            if rungs
            else ""
        )
        rules.append(base)
        rank.append((label, (rungs, k, folds)))  # no rung: the gain rule alone
    replays = replay_grid(rules, studies, (a.trials,), a.jobs, rank)
    table_ = {label: figures(list(by.values())) for label, by in replays[a.trials].items()}
    loo = leave_one_out(replays, [s.name for s in studies])[a.trials]
    print(
        f"\ncorpus: {len(studies)} studies, first {a.trials} trials, {about.get('date')}; the "
        "cheapest rules by the number of studies whose full-protocol choice they lose:\n"
    )
    for lost in range(len(studies) + 1):
        ok = sorted(
            (f["fold_epochs_fraction"], lb)
            for lb, f in table_.items()
            if f["choice_pruned"] == lost
        )[:3]
        if ok:
            table([(lb, table_[lb]) for _, lb in ok], len(studies))
    print(
        f"\nleave one study out: {loo['fold_epochs_fraction']:.2f}× fold-epochs, choice "
        f"pruned in {loo['choice_pruned']} of {loo['studies']}, mean regret "
        f"{100 * loo['mean_regret']:.2f} points; picks: {json.dumps(loo['picks'], indent=1)}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("corpus", help="run the corpus studies and write the corpus file")
    c.add_argument("--trials", type=int, default=50)
    c.add_argument("--storage", default=None, help="a store to run in (or reuse)")
    c.add_argument("--dataset", type=Path, default=os.environ.get("MLRC_OMNIGLOT_ZIP") or None)
    c.add_argument("--out", type=Path, default=CORPUS)
    t = sub.add_parser("tune", help="replay the corpus under a grid of rules")
    t.add_argument("--corpus", type=Path, default=CORPUS)
    t.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="replay processes")
    for cmd, what in (("where", "where the fold-epochs go"), ("explore", "the rank rule")):
        w = sub.add_parser(cmd, help=what)
        w.add_argument("--corpus", type=Path, default=CORPUS)
        w.add_argument("--trials", type=int, default=max(LENGTHS), help="each study's first N")
        w.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="replay processes")
    a = ap.parse_args()
    {"corpus": run_corpus, "tune": tune, "where": where, "explore": explore}[a.cmd](a)


if __name__ == "__main__":
    main()
