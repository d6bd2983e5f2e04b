"""The study's samplers (mlrc.search.space.sampler): parallel-aware suggestions (TPE's constant
liar, the GP's pending points) that change nothing for one worker, checked against Optuna's own
samplers; ``sampler: ax`` checked against Ax's own Sobol sequence and its GP step."""

from __future__ import annotations

import importlib.util
import math

import optuna
import pytest
import yaml
from conftest import require
from optuna.trial import TrialState

from mlrc.config import ParamSpace
from mlrc.config.identity import derive_seed
from mlrc.search import ax_sampler
from mlrc.search.errors import StudyError
from mlrc.search.space import distributions, sampler, suggest

HAS_AX = importlib.util.find_spec("ax") is not None
SPACE = {
    "lr": ParamSpace(low=1e-4, high=1.0, log=True),
    "margin": ParamSpace(low=-0.2, high=2.0),
    "k": ParamSpace.model_validate({"low": 1, "high": 8, "int": True}),
}


def bowl(p: dict) -> float:
    """A cheap objective (maximised at lr = 1e-2, margin = 0.5, k = 3)."""
    return -((math.log10(p["lr"]) + 2) ** 2) - (p["margin"] - 0.5) ** 2 - 0.1 * (p["k"] - 3) ** 2


def sequence(make, n: int) -> list[dict]:
    """``n`` suggestions in turn, each from ``make(position)`` as the local backend does."""
    study = optuna.create_study(direction="maximize")
    for k in range(n):
        study.sampler = make(k)
        trial = study.ask()
        study.tell(trial, bowl(suggest(trial, SPACE)))
    return [t.params for t in study.trials]


@pytest.mark.parametrize("n", [5, 14])
def test_constant_liar_changes_nothing_for_one_worker(n):
    ours = sequence(lambda k: sampler("tpe", 7, SPACE, position=k), n)
    plain = sequence(
        lambda k: optuna.samplers.TPESampler(
            seed=derive_seed(7, "sampler", k), constant_liar=False
        ),
        n,
    )
    assert ours == plain


def _after_one_running(make) -> tuple[dict, dict]:
    """The suggestion after 12 complete trials, with the best one's twin RUNNING, and without."""
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(1))
    for _ in range(12):
        t = study.ask()
        study.tell(t, bowl(suggest(t, SPACE)))
    out = []
    for running in (True, False):
        s = optuna.create_study(direction="maximize")
        s.add_trials(study.trials)
        if running:
            s.enqueue_trial(study.best_params)
            suggest(s.ask(), SPACE)  # stays RUNNING
        s.sampler = make()
        out.append(suggest(s.ask(), SPACE))
    return out[0], out[1]


def test_tpe_constant_liar_and_gp_pending_points_see_running_trials():
    with_running, without = _after_one_running(lambda: sampler("tpe", 3, SPACE))
    assert with_running != without
    liar_off = _after_one_running(lambda: optuna.samplers.TPESampler(seed=3, constant_liar=False))
    assert liar_off[0] == liar_off[1]  # without the liar a running trial is invisible
    # Optuna's GPSampler (n_startup_trials=10 < 12): the running point joins a q-batch log EI
    with_running, without = _after_one_running(lambda: sampler("gp", 3, SPACE))
    assert with_running != without


@pytest.fixture
def ax():
    require(HAS_AX, "ax-platform is not installed (pip install -e '.[ax]')")
    import ax

    return ax


def ax_sobol(seed: int, n: int) -> list[dict]:
    """Ax's own quasi-random search of SPACE (no centre point): its first ``n`` points."""
    from ax.api import Client, RangeParameterConfig

    client = Client(random_seed=seed)
    client.configure_experiment(
        parameters=[
            RangeParameterConfig(
                name="lr", bounds=(1e-4, 1.0), parameter_type="float", scaling="log"
            ),
            RangeParameterConfig(name="margin", bounds=(-0.2, 2.0), parameter_type="float"),
            RangeParameterConfig(name="k", bounds=(1, 8), parameter_type="int"),
        ]
    )
    client.configure_optimization(objective="y")
    client.configure_generation_strategy(
        method="random_search", initialization_random_seed=seed, initialize_with_center=False
    )
    points = []
    for _ in range(n):
        ((index, p),) = client.get_next_trials(max_trials=1).items()
        client.complete_trial(index, {"y": bowl(p)})
        points.append(dict(p))
    return points


def test_ax_sampler_is_sobol_then_the_gp(ax):
    s = sampler("ax", 11, SPACE)
    study = optuna.create_study(direction="maximize", sampler=s)
    study.enqueue_trial({"lr": 0.5, "margin": 1.0, "k": 2})  # given: not a Sobol point
    nodes = []
    for _ in range(7):
        t = study.ask()
        p = suggest(t, SPACE)
        nodes.append(None if t.number == 0 else s.last_node)
        t.set_user_attr("sem", 0.01)
        study.tell(t, bowl(p))
    n = ax_sampler.n_sobol(distributions(SPACE))
    assert n == 5
    sobol = ax_sobol(11, n + 1)
    drawn = [t.params for t in study.trials[1:]]
    for ours, ref in zip(drawn[:n], sobol[:n], strict=True):
        assert ours["k"] == ref["k"] and isinstance(ours["k"], int)
        assert ours["lr"] == pytest.approx(ref["lr"], rel=1e-12)
        assert ours["margin"] == pytest.approx(ref["margin"], rel=1e-12)
    assert nodes == [None] + ["Sobol"] * n + ["MBM"]
    assert drawn[n] != sobol[n]  # the 6th suggested point comes from the GP
    assert all(t.state == TrialState.COMPLETE for t in study.trials)


def test_ax_sampler_maps_choices_back(ax):
    space = {"kind": ParamSpace(choices=["a", 2, None]), "x": ParamSpace(low=0.0, high=1.0)}
    study = optuna.create_study(sampler=sampler("ax", 0, space))
    for _ in range(3):
        t = study.ask()
        suggest(t, space)
        study.tell(t, 0.0)
    assert all(t.params["kind"] in ("a", 2, None) for t in study.trials)
    assert len({t.params["x"] for t in study.trials}) == 3


def test_ax_missing_is_one_line(monkeypatch):
    monkeypatch.setattr(ax_sampler, "ax_available", lambda: False)
    with pytest.raises(
        StudyError, match=r"^sampler: ax needs the ax extra: pip install 'mlrc\[ax\]'$"
    ):
        sampler("ax", 0, SPACE)


def test_study_run_with_sampler_ax(ax, tmp_path):
    """A real study (2 trials, tiny folds): Ax's first Sobol points, the fold SEM recorded."""
    from ax.api import Client, RangeParameterConfig
    from sqlalchemy import select
    from typer.testing import CliRunner

    from mlrc import store
    from mlrc.cli import app
    from mlrc.config import load_study
    from mlrc.store.engine import session
    from mlrc.store.schema import Trial

    doc = {
        "name": "ax-tiny",
        "dataset": {"name": "glyphs", "params": {"size": 24}},
        "preset": "cpu",
        "loss": {"name": "contrastive"},
        "search": {"trials": 2, "sampler": "ax", "seed": 5},
        "test": {"reproductions": 2},
        "overrides": {
            "iterations_per_epoch": 2,
            "max_epochs": 2,
            "validate_every": {"default": 1},
            "patience": {"default": 2},
            "folds": 2,
            "image": {"resize": 18, "crop": 16},
            "eval_batch_size": 256,
        },
    }
    path = tmp_path / "ax-tiny.yaml"
    path.write_text(yaml.safe_dump(doc))
    url = f"sqlite:///{tmp_path / 'ax.db'}"
    args = ["study", "run", str(path), "--storage", url, "--artifacts", str(tmp_path / "art")]
    r = CliRunner().invoke(app, [*args, "--quiet"])
    assert r.exit_code == 0, r.output

    space = load_study(path).space  # Ax's own Sobol points over the same ranges
    client = Client(random_seed=5)
    client.configure_experiment(
        parameters=[
            RangeParameterConfig(
                name=n, bounds=(s.low, s.high), parameter_type="float", scaling="linear"
            )
            for n, s in space.items()
        ]
    )
    client.configure_optimization(objective="y")
    client.configure_generation_strategy(
        method="random_search", initialization_random_seed=5, initialize_with_center=False
    )
    expected = list(client.get_next_trials(max_trials=2).values())
    ostudy = optuna.load_study(study_name="ax-tiny", storage=url)
    assert [t.state for t in ostudy.trials] == [TrialState.COMPLETE] * 2
    for t, p in zip(ostudy.trials, expected, strict=True):
        assert t.params == pytest.approx(dict(p), rel=1e-12)
    with session(store.connect(url)) as s:
        rows = {row.number: row for row in s.scalars(select(Trial))}
    for t in ostudy.trials:  # the SEM Ax is given is mlrc's fold SEM of that trial
        assert t.user_attrs["sem"] == pytest.approx(rows[t.number].sem, abs=1e-15)
        assert rows[t.number].sem > 0
