"""Replay: what a finished, unpruned study would have spent and chosen under a pruner and an
in-fold stopping rule, without training. Its recorded trials are told, in trial order, to an
in-memory Optuna study with the same pruner, each fold's recorded validation curve walked epoch
by epoch under the same stopping rule (:mod:`mlrc.search.pruning`): exact for pruners and stop
rules (the same trials in the same order, the recorded curves). What a sampler would have
suggested after a pruned trial is outside it: the trials are the recorded ones.

A :class:`RecordedStudy` comes from the store (:func:`recorded_study`) or from a corpus file
(:func:`read_corpus`, gzip JSON written by :func:`write_corpus`; ``bench/corpus/``).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import optuna
from pydantic import ValidationError

from mlrc import store
from mlrc.config.load import did_you_mean
from mlrc.config.schema import StopSpec
from mlrc.protocol.stopping import Curve, FoldStop, Incumbent
from mlrc.search.errors import StudyError
from mlrc.search.pruning import (
    Rules,
    best_fold_values,
    fold_reports,
    fold_stop,
    incumbent_of,
    make_pruner,
    trained_curve,
    validation_epochs,
)

__all__ = [
    "RecordedFold",
    "RecordedStudy",
    "RecordedTrial",
    "ReplayResult",
    "StopWith",
    "first_trials",
    "read_corpus",
    "recorded_study",
    "replay",
    "parse_rules",
    "write_corpus",
]


@dataclass(frozen=True)
class RecordedFold:
    """A search fold as it ran: status, value (best trained validation value) and curve
    ((epoch, value) at each validation, epoch 0 included)."""

    fold: int
    status: str  # complete | failed
    objective: float | None
    points: tuple[tuple[int, float], ...]

    @property
    def epochs(self) -> int:
        """Epochs trained (the last validated epoch)."""
        return max((e for e, _ in self.points), default=0)


@dataclass(frozen=True)
class RecordedTrial:
    """A trial as it ran: ``state`` complete | failed, value (None when failed), its folds."""

    number: int
    params: dict[str, Any]
    params_hash: str
    state: str
    value: float | None
    folds: tuple[RecordedFold, ...]


@dataclass(frozen=True)
class RecordedStudy:
    """A complete, unpruned study: its trials in order and what replay needs of its protocol."""

    name: str
    loss: str
    dataset: str
    preset: str
    n_folds: int
    epochs: tuple[int, ...]  # the epochs at which a fold validates
    trials: tuple[RecordedTrial, ...]
    # the test stage's reproductions (reseeds of the chosen configuration on the same folds):
    # per reproduction, each fold's validation value (best trained epoch), folds ascending
    reseeds: tuple[tuple[float, ...], ...] = ()

    def full_choice(self) -> RecordedTrial:
        """The trial the full protocol picks: the best complete one (the first on a tie)."""
        done = [t for t in self.trials if t.state == "complete" and t.value is not None]
        return max(done, key=lambda t: (t.value, -t.number))


@dataclass(frozen=True)
class ReplayResult:
    """One study replayed under :class:`Rules`. ``fold_epochs``: epochs trained in all folds
    with the rules, ``full_fold_epochs`` without; ``regret``: validation value (a fraction) of
    the full choice minus that of the rules' choice (0 when the same)."""

    study: str
    rules: str
    fold_epochs: int
    full_fold_epochs: int
    full_choice: int
    choice: int | None
    same_choice: bool
    choice_pruned: bool
    regret: float
    pruned: int
    stopped: int
    decisions: dict[int, str] = field(default_factory=dict)  # trial → complete|pruned|failed
    trial_epochs: dict[int, int] = field(default_factory=dict)  # trial → fold-epochs it spent
    stopped_at: dict[int, tuple[int, int]] = field(default_factory=dict)  # trial → (fold, epoch)

    @property
    def fold_epochs_fraction(self) -> float:
        return self.fold_epochs / self.full_fold_epochs if self.full_fold_epochs else 1.0

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["fold_epochs_fraction"] = self.fold_epochs_fraction
        out.pop("decisions")
        out.pop("trial_epochs")
        out.pop("stopped_at")
        return out


# (the rule's FoldStop or None, the fold, the complete curves of that fold so far) → a rule
# with ``reason(epoch, best)``: bench/pruning.py tries rules of its own in replay with it
StopWith = Callable[[FoldStop | None, int, Sequence[Curve]], Any]


@dataclass
class _State:
    """What a replay knows as it goes: complete trials, their fold values, complete curves."""

    complete: list[tuple[int, str, float | None]] = field(default_factory=list)
    folds: dict[str, dict[int, float]] = field(default_factory=dict)
    curves: list[Curve] = field(default_factory=list)
    curve_folds: list[int] = field(default_factory=list)  # the fold of each of ``curves``
    spent: int = 0
    trial_epochs: dict[int, int] = field(default_factory=dict)
    stopped_at: dict[int, tuple[int, int]] = field(default_factory=dict)
    trained: set[tuple[str, int]] = field(default_factory=set)

    def incumbent(self, n_folds: int) -> Incumbent | None:
        full = {k: v for k, v in self.folds.items() if len(v) == n_folds}
        return incumbent_of(self.complete, full)


def replay(study: RecordedStudy, rules: Rules, stop_with: StopWith | None = None) -> ReplayResult:
    """Replay ``study`` under ``rules`` (see the module docstring). ``stop_with``: the in-fold
    rule each fold asks, made from the rules' own (None where they stop nothing) — for trying a
    rule in replay before it exists in a study's ``search.stop``."""
    ostudy = optuna.create_study(direction="maximize", pruner=make_pruner(rules))
    state, decisions, stopped = _State(), {}, 0
    for t in study.trials:
        how, was_stopped = _replay_trial(study, rules, ostudy, state, t, stop_with)
        decisions[t.number] = how
        stopped += was_stopped
    full = study.full_choice()
    done = [(n, v) for n, _, v in state.complete if v is not None]
    choice = max(done, key=lambda nv: (nv[1], -nv[0]))[0] if done else None
    value = {t.number: t.value for t in study.trials}
    return ReplayResult(
        study=study.name,
        rules=rules.label(),
        fold_epochs=state.spent,
        full_fold_epochs=sum(f.epochs for t in _first_runs(study.trials) for f in t),
        full_choice=full.number,
        choice=choice,
        same_choice=choice == full.number,
        choice_pruned=decisions[full.number] == "pruned",
        regret=0.0 if choice is None else float(full.value - value[choice]),
        pruned=sum(d == "pruned" for d in decisions.values()),
        stopped=stopped,
        decisions=decisions,
        trial_epochs=state.trial_epochs,
        stopped_at=state.stopped_at,
    )


def _first_runs(trials: Sequence[RecordedTrial]) -> list[list[RecordedFold]]:
    """Each trial's folds that were trained (a repeated parameter set reuses its fold runs)."""
    seen, out = set(), []
    for t in trials:
        out.append([f for f in t.folds if (t.params_hash, f.fold) not in seen])
        seen |= {(t.params_hash, f.fold) for f in t.folds}
    return out


def _replay_trial(
    study: RecordedStudy,
    rules: Rules,
    ostudy: optuna.Study,
    state: _State,
    t: RecordedTrial,
    stop_with: StopWith | None = None,
) -> tuple[str, bool]:
    """One trial told to ``ostudy`` as the live objective would: its folds in order, each
    possibly stopped, the pruner asked after each; (how it ended, whether a fold stopped)."""
    trial = ostudy.ask()
    values: dict[int, float] = {}
    order: list[int] = []
    for f in t.folds:
        stop = fold_stop(
            rules.stop,
            f.fold,
            study.n_folds,
            values,
            state.incumbent(study.n_folds),
            len(state.complete),
            state.curves,
            study.epochs,
            best_fold_values(state.folds.values()),
        )
        if stop_with is not None:
            same = [c for c, j in zip(state.curves, state.curve_folds, strict=True) if j == f.fold]
            stop = stop_with(stop, f.fold, same)
        at, stopped_best = _walk(f, stop)
        if (t.params_hash, f.fold) not in state.trained:  # a repeated set reuses its folds
            state.spent += at
            state.trial_epochs[t.number] = state.trial_epochs.get(t.number, 0) + at
            state.trained.add((t.params_hash, f.fold))
        if stopped_best is not None:  # its best so far is told to the pruner, then pruned
            state.stopped_at[t.number] = (f.fold, at)
            values[f.fold] = stopped_best
            order.append(f.fold)
            _report(rules, trial, order, values, study.n_folds)
            ostudy.tell(trial, state=optuna.trial.TrialState.PRUNED)
            return "pruned", True
        if f.status != "complete" or f.objective is None:
            break  # failed, or non-finite (then the trial's value is 0): no later fold ran
        values[f.fold] = f.objective
        order.append(f.fold)
        state.folds.setdefault(t.params_hash, {})[f.fold] = f.objective
        state.curves.append(trained_curve(f.points))
        state.curve_folds.append(f.fold)
        if _report(rules, trial, order, values, study.n_folds) and len(order) < study.n_folds:
            ostudy.tell(trial, state=optuna.trial.TrialState.PRUNED)
            return "pruned", False
    if t.state == "complete" and t.value is not None:
        ostudy.tell(trial, t.value)
        state.complete.append((t.number, t.params_hash, t.value))
        return "complete", False
    ostudy.tell(trial, state=optuna.trial.TrialState.FAIL)
    return "failed", False


def _walk(f: RecordedFold, stop: Any) -> tuple[int, float | None]:
    """(epochs trained, best so far where the rule ``stop`` ended the fold, else None): the
    rule is asked at each trained validation that does not end the fold by itself (a complete
    fold's last one ended it on patience or at the last epoch)."""
    trained = trained_curve(f.points)
    best: float | None = None
    for i, (e, v) in enumerate(trained):
        best = v if best is None else max(best, v)
        if stop is None or (f.status == "complete" and i == len(trained) - 1):
            break
        if stop.reason(e, best) is not None:
            return e, best
    return f.epochs, None


def _report(
    rules: Rules, trial: optuna.Trial, order: list[int], values: dict[int, float], n_folds: int
) -> bool:
    """What the live objective's ``should_prune`` does (:func:`mlrc.search.objective.pruning`)."""
    if rules.pruner == "none" or (rules.pruner == "median" and len(order) >= n_folds):
        return False
    for step, value in fold_reports(rules.pruner, order, values):
        trial.report(value, step=step)
    return trial.should_prune()


# --- recorded studies: from the store, to and from a corpus file ----------------------------


def recorded_study(engine: Any, name: str, finished: bool = True) -> RecordedStudy:
    """The stored study ``name`` as a :class:`RecordedStudy`; a :class:`StudyError` (one line)
    when it is unknown, was searched with pruning or in-fold stopping, or is not finished
    (``finished=False``: the trials done so far, running ones left out)."""
    st = store.studies.study_named(engine, name)
    if st is None:
        raise StudyError(f"no study named {name!r} in the store")
    cfg = st.config or {}
    search = (cfg.get("study") or {}).get("search") or {}
    if (cfg.get("pruner") or "none") != "none" or cfg.get("stop") or search.get("stop"):
        raise StudyError(
            f"study {name!r} was searched with pruning ({cfg.get('pruner')}"
            f"{', search.stop' if cfg.get('stop') else ''}): replay needs an unpruned study"
        )
    rows = store.trials.study_trials(engine, st.id)
    open_ = [t.number for t in rows if t.state in ("running", "pruned")]
    budget = int(cfg.get("trials") or 0)
    counted = [t for t in rows if t.state in ("complete", "failed")]
    if finished and (open_ or len(counted) < budget):
        raise StudyError(
            f"study {name!r} is not finished ({len(counted)} of {budget} trials done"
            f"{', trial ' + str(open_[0]) + ' still open' if open_ else ''}): "
            "replay needs a finished search"
        )
    if not any(t.state == "complete" and t.value is not None for t in counted):
        raise StudyError(f"study {name!r} has no complete trial: nothing to replay")
    preset = cfg.get("preset") or {}
    every = preset.get("validate_every") or {"default": 1}
    metric = preset.get("selection_metric") or "map_at_r"
    curves = store.curves.search_curves(engine, st.id, metric)
    by_hash: dict[str, list[RecordedFold]] = {}
    for c in sorted(curves, key=lambda c: c.fold):
        by_hash.setdefault(c.params_hash, []).append(
            RecordedFold(c.fold, c.status, c.objective, tuple(c.points))
        )
    trials = tuple(
        RecordedTrial(
            t.number,
            t.params,
            t.params_hash,
            t.state,
            t.value,
            tuple(by_hash.get(t.params_hash, [])),
        )
        for t in counted
    )
    return RecordedStudy(
        name=st.name,
        loss=st.loss,
        dataset=st.dataset,
        preset=st.preset,
        n_folds=int(preset.get("folds") or 4),
        epochs=validation_epochs(
            int(every.get(st.dataset, every.get("default", 1))), int(preset["max_epochs"])
        ),
        trials=trials,
        reseeds=reseeds(engine, st.id, int(preset.get("folds") or 4)),
    )


def reseeds(engine: Any, study_id: int, n_folds: int) -> tuple[tuple[float, ...], ...]:
    """Each complete reproduction's fold validation values (the search's objective: best
    trained epoch's), folds ascending; a reproduction with a fold missing or failed is left
    out."""
    by: dict[int, dict[int, float]] = {}
    for r in store.trials.fold_runs(engine, study_id):
        if r.kind == "test" and r.status == "complete" and r.objective is not None:
            by.setdefault(r.reproduction, {})[r.fold] = r.objective
    return tuple(
        tuple(folds[f] for f in range(n_folds))
        for _, folds in sorted(by.items())
        if len(folds) == n_folds
    )


def first_trials(study: RecordedStudy, n: int) -> RecordedStudy:
    """``study`` as if its search had stopped after its first ``n`` trials: what a study of
    budget ``n`` with the same sampler and seed runs (a :class:`StudyError` when it has fewer,
    or none of them complete)."""
    if len(study.trials) < n:
        raise StudyError(
            f"study {study.name!r} has {len(study.trials)} trials: cannot replay its first {n}"
        )
    out = replace(study, trials=study.trials[:n])
    if not any(t.state == "complete" and t.value is not None for t in out.trials):
        raise StudyError(f"study {study.name!r}: no complete trial among its first {n}")
    return out


def write_corpus(studies: Sequence[RecordedStudy], path: Path, about: dict[str, Any]) -> Path:
    """Write ``studies`` to the gzip JSON corpus ``path`` with ``about`` (machine, date, the
    script that made it)."""
    doc = {"about": about, "studies": [asdict(s) for s in studies]}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    data = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
    with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as fh:
        fh.write(data)  # mtime 0: the same corpus gives the same bytes
    tmp.replace(path)
    return path


def read_corpus(path: Path) -> tuple[dict[str, Any], list[RecordedStudy]]:
    """(about, studies) of a corpus file written by :func:`write_corpus`."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError) as e:
        raise StudyError(f"{path}: not a replay corpus ({e})") from None
    out = []
    for s in doc["studies"]:
        trials = tuple(
            RecordedTrial(
                **{
                    **t,
                    "folds": tuple(
                        RecordedFold(**{**f, "points": tuple(map(tuple, f["points"]))})
                        for f in t["folds"]
                    ),
                }
            )
            for t in s["trials"]
        )
        reseeds = tuple(map(tuple, s.get("reseeds", ())))
        fields = {**s, "epochs": tuple(s["epochs"]), "trials": trials, "reseeds": reseeds}
        out.append(RecordedStudy(**fields))
    return doc.get("about", {}), out


_PRUNER_KEYS = {
    "median": {"startup": "prune_startup"},
    "wilcoxon": {"p": "prune_p"},
    "sequential": {"delta": "prune_delta", "alpha": "prune_alpha", "startup": "prune_startup"},
    "forgiving": {"startup": "prune_startup"},
    "none": {},
}


def parse_rules(pruner: str, stop: str | None = None) -> Rules:
    """:class:`Rules` from command-line specs: ``--pruner none | median[:startup=N] |
    wilcoxon[:p=P] | sequential[:delta=D,alpha=A,startup=N]`` and ``--stop none |
    gain[:quantile=Q,slack=S,fold_slack=E,startup=N,future=incumbent|best]``; a
    :class:`StudyError` of one line for a bad one (with a "did you mean")."""
    name, kv = _spec(pruner, "--pruner")
    if name not in _PRUNER_KEYS:
        raise StudyError(f"--pruner: unknown pruner {name!r}{did_you_mean(name, _PRUNER_KEYS)}")
    fields: dict[str, Any] = {"pruner": name}
    for k, v in kv.items():
        if k not in _PRUNER_KEYS[name]:
            hint = did_you_mean(k, _PRUNER_KEYS[name])
            raise StudyError(f"--pruner {pruner}: {name} has no setting {k!r}{hint}")
        fields[_PRUNER_KEYS[name][k]] = _number(v, f"--pruner {pruner}: {k}")
    if stop not in (None, "none"):
        rule, skv = _spec(stop, "--stop")
        for k in skv.keys() - StopSpec.model_fields.keys():
            hint = did_you_mean(k, [f for f in StopSpec.model_fields if f != "rule"])
            raise StudyError(f"--stop {stop}: {rule} has no setting {k!r}{hint}")
        try:
            fields["stop"] = StopSpec(
                rule=rule,
                **{
                    k: v if k == "future" else _number(v, f"--stop {stop}: {k}")
                    for k, v in skv.items()
                },
            )
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(map(str, err["loc"]))
            raise StudyError(f"--stop {stop}: {where}: {err['msg']}") from None
    try:
        return Rules(**fields)
    except ValueError as e:
        raise StudyError(f"--pruner {pruner}: {e}") from None


def _spec(text: str, flag: str) -> tuple[str, dict[str, str]]:
    """``name:k=v,k=v`` → (name, {k: v})."""
    name, _, rest = text.partition(":")
    kv: dict[str, str] = {}
    for part in filter(None, rest.split(",")):
        k, eq, v = part.partition("=")
        if not eq:
            raise StudyError(f"{flag} {text}: expected NAME:key=value,… (got {part!r})")
        kv[k.strip()] = v.strip()
    return name.strip(), kv


def _number(text: str, what: str) -> float | int:
    try:
        return int(text) if text.lstrip("-").isdigit() else float(text)
    except ValueError:
        raise StudyError(f"{what}: not a number ({text!r})") from None
