"""Search samplers, parallel workers and warm starts, simulated on surrogates of a corpus of
complete studies (no training: each "trial" is one evaluation of a regression model).

    OMP_NUM_THREADS=1 .venv/bin/python bench/search_sim.py
        [--corpus bench/corpus/cpu-omniglot-glyphs.json.gz | --storage sqlite:///corpus.db]
        [--seeds 10] [--ax-seeds 5] [--trials 50] [--min-trials 50] [--warm-min-trials 5]

The corpus: the studies ``corpus-<loss>-<dataset>`` (dataset omniglot or glyphs; cpu-preset
studies, ``sampler: gp``) with at least ``--min-trials`` complete trials, either of the committed
corpus file (``--corpus``, the default: bench/pruning.py's; each study's space is its loss's
space resolved for its dataset and preset, each trial's fold SEM computed from its fold values
as the objective computes it) or of the Optuna studies of a store (``--storage``; the SEM read
from mlrc's trial table). The study a warm start copies its 5 points from needs only
``--warm-min-trials`` complete trials (it is not simulated). The ``ax`` extra is needed.

Surrogate of a study: a Gaussian-process regression (scikit-learn: Matern 5/2 with ARD length
scales plus a white-noise term, normalised targets) of its complete trials' MAP@R on the
parameters scaled to [0, 1] (log10 where the space is log). Its posterior mean is the "true"
value of a point; an evaluation returns the true value plus Gaussian noise whose standard
deviation is the fold SEM of the corpus trial nearest to the point, and reports that SEM (what
``sampler: ax`` gives Ax as known noise). The surrogate's optimum is the best true value over
the corpus trials and 4096 random points.

A search is judged by the true value of the trial it would pick (the best observed value) after
n trials, as a percentage of the optimum. Three simulations, on one core:

1. samplers: ``tpe``, ``gp`` (Optuna's) and ``ax`` (mlrc.search.ax_sampler), one worker;
2. parallel workers: 1, 4 and 16 trials in flight (Optuna's ask/tell, the oldest told first),
   TPE with and without the constant liar, and the GP (pending points always on);
3. warm start: the trials until the picked trial reaches 95 % of the optimum, cold vs warm,
   where warm first enqueues the 5 best trials of the same loss's study on the other dataset
   (corpus-<loss>-omniglot <-> corpus-<loss>-glyphs).

Writes bench/results/search_sim.csv (one row per run and trial count) and prints markdown
tables. Ax is slow (a GP fit per suggestion): it runs ``--ax-seeds`` seeds only.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import optuna
import pandas as pd
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import TrialState

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import machine, write_csv  # noqa: E402
from mlrc import store  # noqa: E402
from mlrc.config.study import StudyConfig, resolve  # noqa: E402
from mlrc.search import replay as rp  # noqa: E402
from mlrc.search.ax_sampler import AxSampler  # noqa: E402
from mlrc.search.space import distributions  # noqa: E402

optuna.logging.set_verbosity(optuna.logging.ERROR)
warnings.filterwarnings("ignore")
DATASETS = ("omniglot", "glyphs")
CORPUS = Path(__file__).resolve().parent / "corpus" / "cpu-omniglot-glyphs.json.gz"


@dataclass
class Corpus:
    """A complete study of the corpus: its space and its complete trials (value, fold SEM)."""

    name: str
    loss: str
    dataset: str
    space: dict[str, BaseDistribution]
    params: list[dict]
    values: np.ndarray
    sems: np.ndarray


def load_corpus(url: str, min_trials: int) -> dict[str, Corpus]:
    """The corpus studies of ``url`` with at least ``min_trials`` complete trials."""
    engine = store.connect(url, read_only=True)
    out = {}
    for summary in optuna.get_all_study_summaries(url):
        name = summary.study_name
        parts = name.split("-")
        if len(parts) != 3 or parts[0] != "corpus" or parts[2] not in DATASETS:
            continue
        study = optuna.load_study(study_name=name, storage=url)
        done = study.get_trials(deepcopy=False, states=[TrialState.COMPLETE])
        if len(done) < min_trials:
            continue
        record = store.studies.study_named(engine, name)
        if record is None:
            sys.exit(f"{url}: study {name} has no mlrc record (no fold SEMs)")
        sems = {t.number: t.sem for t in store.trials.study_trials(engine, record.id)}
        out[name] = Corpus(
            name=name,
            loss=parts[1],
            dataset=parts[2],
            space=dict(done[0].distributions),
            params=[t.params for t in done],
            values=np.array([t.value for t in done]),
            sems=np.array([sems.get(t.number) or 0.0 for t in done]),
        )
    return out


def load_corpus_file(path: Path, min_trials: int) -> dict[str, Corpus]:
    """The corpus studies of the corpus file ``path`` with at least ``min_trials`` complete
    trials; a trial's SEM is std(fold values, ddof 1) / √n, as mlrc's objective records it."""
    _, studies = rp.read_corpus(path)
    out = {}
    for st in studies:
        done = [t for t in st.trials if t.state == "complete" and t.value is not None]
        if len(done) < min_trials:
            continue
        doc = {"name": st.name, "dataset": {"name": st.dataset}, "preset": st.preset}
        config = StudyConfig.model_validate({**doc, "loss": {"name": st.loss}})
        space = distributions(resolve(config, str(path)).space)
        folds = [[f.objective for f in t.folds if f.objective is not None] for t in done]
        out[st.name] = Corpus(
            name=st.name,
            loss=st.loss,
            dataset=st.dataset,
            space=space,
            params=[{k: t.params[k] for k in space} for t in done],
            values=np.array([t.value for t in done]),
            sems=np.array([np.std(v, ddof=1) / math.sqrt(len(v)) for v in folds]),
        )
    return out


def unit(params: dict, space: dict[str, BaseDistribution]) -> np.ndarray:
    """``params`` scaled to [0, 1] per parameter (log10 where the space is log)."""
    x = []
    for name, d in space.items():
        v = params[name]
        if isinstance(d, CategoricalDistribution):
            x.append(d.choices.index(v) / max(1, len(d.choices) - 1))
        elif d.log:
            x.append((math.log10(v) - math.log10(d.low)) / (math.log10(d.high / d.low)))
        else:
            x.append((v - d.low) / (d.high - d.low) if d.high > d.low else 0.0)
    return np.array(x)


class Surrogate:
    """A GP regression of a corpus study; noisy evaluations with the nearest trial's SEM."""

    def __init__(self, c: Corpus, seed: int = 0) -> None:
        from sklearn.gaussian_process import GaussianProcessRegressor
        from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel

        self.corpus = c
        self.X = np.stack([unit(p, c.space) for p in c.params])
        d = self.X.shape[1]
        kernel = ConstantKernel() * Matern(length_scale=np.full(d, 0.3), nu=2.5) + WhiteKernel()
        self.gp = GaussianProcessRegressor(kernel, normalize_y=True, random_state=seed)
        self.gp.fit(self.X, c.values)
        grid = np.random.default_rng(seed).uniform(size=(4096, d))
        self.optimum = float(max(self.true(np.vstack([self.X, grid])).max(), 1e-12))

    def true(self, X: np.ndarray) -> np.ndarray:
        return self.gp.predict(np.atleast_2d(X))

    def evaluate(self, params: dict, rng: np.random.Generator) -> tuple[float, float, float]:
        """(true value, observed value, reported SEM) of one trial at ``params``."""
        x = unit(params, self.corpus.space)
        sem = float(self.corpus.sems[np.argmin(((self.X - x) ** 2).sum(axis=1))])
        true = float(self.true(x)[0])
        return true, true + float(rng.normal(0.0, sem)), sem


def make_sampler(kind: str, space: dict, seed: int) -> optuna.samplers.BaseSampler:
    if kind == "tpe":
        return optuna.samplers.TPESampler(seed=seed, constant_liar=True)
    if kind == "tpe-no-liar":
        return optuna.samplers.TPESampler(seed=seed, constant_liar=False)
    if kind == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    if kind == "ax":
        return AxSampler(space, seed)
    raise ValueError(kind)


def search(
    s: Surrogate, kind: str, seed: int, trials: int, workers: int = 1, warm: list[dict] = ()
) -> list[float]:
    """The picked trial's true value after 1..``trials`` trials (``workers`` in flight)."""
    space = s.corpus.space
    study = optuna.create_study(direction="maximize", sampler=make_sampler(kind, space, seed))
    for params in warm:
        study.enqueue_trial(params)
    rng = np.random.default_rng(seed)
    flight: deque = deque()
    asked, told, picked, best_obs = 0, 0, [], -math.inf
    best_true = -math.inf
    while told < trials:
        while len(flight) < workers and asked < trials:
            t = study.ask(fixed_distributions=space)
            flight.append((t, s.evaluate(t.params, rng)))
            asked += 1
        t, (true, obs, sem) = flight.popleft()
        t.set_user_attr("sem", sem)
        study.tell(t, obs)
        told += 1
        if obs > best_obs:
            best_obs, best_true = obs, true
        picked.append(best_true)
    return picked


def run(args: argparse.Namespace, corpus: dict[str, Corpus]) -> pd.DataFrame:
    """Every simulation on the surrogates of ``corpus``: one row per run and trial count."""
    surrogates = {
        name: Surrogate(c) for name, c in sorted(corpus.items()) if len(c.values) >= args.min_trials
    }
    rows: list[dict] = []

    def record(exp: str, name: str, kind: str, workers: int, warm: bool, seed: int, picked):
        opt = surrogates[name].optimum
        for n, v in enumerate(picked, 1):
            rows.append(
                dict(
                    experiment=exp,
                    study=name,
                    sampler=kind,
                    workers=workers,
                    warm=warm,
                    seed=seed,
                    trials=n,
                    picked=v,
                    optimum=opt,
                    pct=100 * v / opt,
                )
            )

    for name, s in surrogates.items():
        start = time.time()
        for kind in args.samplers:
            for seed in range(args.ax_seeds if kind == "ax" else args.seeds):
                record("samplers", name, kind, 1, False, seed, search(s, kind, seed, args.trials))
        for kind in ("tpe", "tpe-no-liar", "gp"):
            for workers in (4, 16):
                for seed in range(args.seeds):
                    picked = search(s, kind, seed, args.trials, workers)
                    record("parallel", name, kind, workers, False, seed, picked)
        other = corpus.get(f"corpus-{s.corpus.loss}-{_other(s.corpus.dataset)}")
        if other is not None:
            top = [_into(other.params[i], s.corpus.space) for i in np.argsort(-other.values)[:5]]
            for kind in ("tpe", "gp"):
                for seed in range(args.seeds):
                    picked = search(s, kind, seed, args.trials, warm=top)
                    record("warm", name, kind, 1, True, seed, picked)
        print(f"{name}: {time.time() - start:.0f} s", file=sys.stderr, flush=True)
    return pd.DataFrame(rows)


def _into(params: dict, space: dict[str, BaseDistribution]) -> dict:
    """``params`` of another study's space moved into ``space`` (per-dataset ranges can differ):
    numbers clipped to the range, a missing or foreign choice left to the sampler."""
    out = {}
    for name, d in space.items():
        if name not in params:
            continue
        v = params[name]
        if isinstance(d, CategoricalDistribution):
            if v in d.choices:
                out[name] = v
        else:
            out[name] = type(d.low)(min(max(v, d.low), d.high))
    return out


def _other(dataset: str) -> str:
    return DATASETS[1 - DATASETS.index(dataset)]


def tables(df: pd.DataFrame) -> str:
    """The three markdown tables (mean % of the surrogate's optimum over studies and seeds)."""
    out = []
    one = df[df.workers == 1]
    last = int(df.trials.max())
    at = sorted({n for n in (5, 10, 15, 20, 30, 40) if n < last} | {last})
    runs = one[one.experiment == "samplers"]
    sam = runs[runs.trials.isin(at)]
    t = sam.pivot_table(index="sampler", columns="trials", values="pct", aggfunc="mean")
    t.insert(0, "seeds", sam.groupby("sampler").seed.nunique())
    t[f"SE at {last}"] = _se(sam[sam.trials == last], "sampler")
    out.append(
        "Picked trial's true value, % of the surrogate's optimum, after n trials "
        "(1 worker; mean over studies and seeds; SE: standard error over the runs):\n\n" + _md(t)
    )
    par = pd.concat([runs[runs.sampler.isin(["tpe", "gp"])], df[df.experiment == "parallel"]])
    par = par[par.trials.isin([last // 2, last])]
    t = par.pivot_table(index=["sampler", "workers"], columns="trials", values="pct")
    t[f"SE at {last}"] = _se(par[par.trials == last], ["sampler", "workers"])
    out.append(
        "Parallel workers (trials in flight), % of the optimum after n trials "
        "(tpe: constant liar on; 1 worker: the same search either way):\n\n" + _md(t)
    )
    warm = df[df.experiment == "warm"]
    if len(warm):
        cold = one[(one.experiment == "samplers") & one.sampler.isin(["tpe", "gp"])]
        cold = cold[cold.study.isin(warm.study.unique())]
        both = pd.concat([cold, warm])
        reach = (
            both.assign(hit=both.pct >= 95)
            .groupby(["study", "sampler", "warm", "seed"])
            .apply(lambda g: g.trials[g.hit].min() if g.hit.any() else np.nan, include_groups=False)
            .rename("reach")
            .reset_index()
        )
        t = reach.groupby(["study", "sampler", "warm"])["reach"].agg(
            median_trials="median", reached=lambda x: f"{x.notna().sum()}/{len(x)}"
        )
        out.append(
            "Warm start: trials until the picked trial reaches 95 % of the optimum "
            "(median over the seeds that reach it; reached: seeds within the "
            "budget):\n\n" + _md(t)
        )
    return "\n\n".join(out)


def _se(df: pd.DataFrame, by) -> pd.Series:
    """Standard error of the mean ``pct`` over the runs of each group."""
    return df.groupby(by).pct.agg(lambda x: x.std(ddof=1) / math.sqrt(len(x)))


def _md(t: pd.DataFrame) -> str:
    """``t`` as a markdown table (index columns first, numbers to one decimal)."""
    t = t.reset_index()
    cols = [str(c) for c in t.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in t.itertuples(index=False):
        cells = [f"{v:.1f}" if isinstance(v, float) else str(v) for v in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = p.add_mutually_exclusive_group()
    src.add_argument("--corpus", type=Path, default=CORPUS, help="a corpus file (bench/pruning.py)")
    src.add_argument("--storage", help="a store of corpus studies, e.g. sqlite:///corpus.db")
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--ax-seeds", type=int, default=5)
    p.add_argument("--trials", type=int, default=50)
    p.add_argument("--min-trials", type=int, default=50)
    p.add_argument("--warm-min-trials", type=int, default=5)
    p.add_argument("--samplers", nargs="+", default=["tpe", "gp", "ax"])
    p.add_argument("--tables", type=Path, help="print the tables of a CSV this wrote; run nothing")
    args = p.parse_args()
    if args.tables:
        print(tables(pd.read_csv(args.tables)))
        return
    start = time.time()
    least = min(args.min_trials, args.warm_min_trials)
    source = args.storage or args.corpus
    if args.storage:
        corpus = load_corpus(args.storage, least)
    else:
        corpus = load_corpus_file(args.corpus, least)
    if not any(len(c.values) >= args.min_trials for c in corpus.values()):
        sys.exit(f"no corpus study with >= {args.min_trials} complete trials in {source}")
    print(
        "corpus: " + ", ".join(f"{n} ({len(c.values)})" for n, c in corpus.items()), file=sys.stderr
    )
    df = run(args, corpus)
    path = write_csv(df, "search_sim")
    print(f"{machine()}; {time.strftime('%Y-%m-%d')}; {time.time() - start:.0f} s; {path}\n")
    print(tables(df))


if __name__ == "__main__":
    main()
