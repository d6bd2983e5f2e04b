"""The traditional protocol (#16 point 3): one fold on every train+val class, validated on the
test classes; the selection metric, optimisers, learning-rate schedule, frozen-trunk warm-up and
random batches of the seed papers' code. References: the protocol's own definition of the halves,
torch's StepLR/MultiStepLR, the metric's own history, and the test stage's independent
re-embedding of the test classes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from sqlalchemy import select
from typer.testing import CliRunner

from mlrc import data, store
from mlrc.cli import app
from mlrc.config import ConfigError, Preset, ScheduleSpec, load_preset, load_study
from mlrc.config.presets import is_traditional, objective_label
from mlrc.methods import samplers
from mlrc.protocol import mlrc_split
from mlrc.protocol.analysis import recall_ks
from mlrc.protocol.splits import SplitError, custom_split
from mlrc.store.engine import session
from mlrc.store.schema import EpochMetric, FoldRun, TestResult
from mlrc.train import FoldSpec, train_fold
from mlrc.train.schedule import lr_factor
from mlrc.train.setup import make_optimizer

runner = CliRunner()
TINY = {
    "trunk": "tiny_cnn",
    "pretrained": False,
    "freeze_batchnorm": False,
    "embedding_size": 32,
    "image": {"resize": 36, "crop": 32, "scale": [0.5, 1.0], "flip": False},
    "batch": {"size": 32},
    "optimizer": {"name": "adamw", "lr": 1.0e-3, "weight_decay": 1.0e-4},
    "iterations_per_epoch": 4,
    "max_epochs": 3,
    "num_workers": 0,
    "eval_batch_size": 128,
}


# --- the split -----------------------------------------------------------------------------------


def test_one_fold_trains_on_the_first_half_and_validates_on_the_test_half():
    labels = np.repeat(np.arange(40), 3)[::-1]  # order of the samples does not matter
    split = mlrc_split(labels, n_folds=1, scheme="traditional")
    classes = sorted(set(labels.tolist()))
    assert split.trainval_classes == tuple(classes[:20])
    assert split.test_classes == tuple(classes[20:])
    (fold,) = split.folds
    assert fold.index == 0
    assert fold.train_classes == split.trainval_classes
    assert fold.val_classes == split.test_classes  # test-set selection, by definition
    assert split.summary().startswith("20 train classes, 20 test classes, no folds")


def test_a_custom_split_takes_test_classes_only():
    split = custom_split(range(10), [7, 8, 9], scheme="traditional", origin="f")
    assert split.folds[0].train_classes == tuple(range(7))
    assert split.folds[0].val_classes == (7, 8, 9)
    with pytest.raises(SplitError, match="no folds"):
        custom_split(range(10), [7, 8, 9], [[0, 1], [2, 3]], scheme="traditional")


def test_folds_and_scheme_must_agree():
    with pytest.raises(ConfigError, match="exactly one fold"):
        load_preset("traditional", {"folds": 4})
    with pytest.raises(ConfigError, match="'mlrc' needs at least 2 folds, got 1"):
        load_preset("cpu", {"folds": 1})
    with pytest.raises(ConfigError, match="use precision_at_1"):
        load_preset("traditional", {"selection_metric": "recall_at_1"})
    assert load_preset("cpu", {"folds": 1, "split_scheme": "traditional"}).folds == 1


def test_a_split_file_with_folds_is_refused_under_the_traditional_preset(tmp_path):
    (tmp_path / "split.yaml").write_text("test: ['1', '2']\nfolds: [['3', '4'], ['5', '6']]\n")
    doc = {
        "name": "t",
        "dataset": {"name": "glyphs"},
        "preset": "traditional",
        "loss": {"name": "contrastive", "params": {}, "search": {}},
        "search": {"trials": 1},
        "split": "split.yaml",
        "overrides": TINY,
    }
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match="split: split.yaml: the traditional preset has no folds"):
        load_study(path)


# --- schedule, optimisers, sampler -------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "torch_scheduler"),
    [
        ({"step_size": 3, "gamma": 0.5}, lambda o: torch.optim.lr_scheduler.StepLR(o, 3, 0.5)),
        (
            {"milestones": [4, 7], "gamma": 0.3},
            lambda o: torch.optim.lr_scheduler.MultiStepLR(o, [4, 7], 0.3),
        ),
    ],
)
def test_learning_rate_schedule_matches_torch_stepped_after_every_epoch(spec, torch_scheduler):
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-4)
    sched = torch_scheduler(opt)
    schedule = ScheduleSpec(**spec)
    for epoch in range(1, 13):
        assert opt.param_groups[0]["lr"] == pytest.approx(1e-4 * lr_factor(schedule, epoch))
        opt.step()
        sched.step()
    assert lr_factor(None, 50) == 1.0


def test_schedule_and_optimizer_fields_are_checked():
    with pytest.raises(ConfigError, match="either step_size or milestones"):
        load_preset("traditional", {"lr_schedule": {"gamma": 0.5}})
    with pytest.raises(ConfigError, match="increasing"):
        load_preset("traditional", {"lr_schedule": {"milestones": [5, 3], "gamma": 0.5}})
    with pytest.raises(ConfigError, match="Adam takes none"):
        load_preset("traditional", {"optimizer": {"name": "adam", "lr": 1e-5, "momentum": 0.9}})
    with pytest.raises(ConfigError, match="optimizer.name"):
        load_preset("traditional", {"optimizer": {"name": "sgd", "lr": 1e-5}})


def test_adam_couples_weight_decay_and_adamw_decouples_it():
    """Adam adds wd·θ to the gradient (the DAS code's torch.optim.Adam); AdamW shrinks θ by
    lr·wd before the step: from θ = 1 with zero gradient, Adam moves by its normalised step
    (lr), AdamW by exactly lr·wd."""
    lr, wd = 0.1, 0.5
    moved = {}
    for name in ("adam", "adamw"):
        p = torch.nn.Parameter(torch.ones(1))
        opt = make_optimizer(name, [p], lr, wd)
        p.grad = torch.zeros(1)
        opt.step()
        moved[name] = 1.0 - float(p.detach())
    assert isinstance(
        make_optimizer("adam", [torch.nn.Parameter(torch.ones(1))], lr, wd), torch.optim.Adam
    )
    assert moved["adamw"] == pytest.approx(lr * wd)
    assert moved["adam"] == pytest.approx(lr, rel=1e-4)


def test_shuffle_sampler_is_one_pass_without_repeats_and_resumes():
    labels = np.repeat(np.arange(10), 7)  # 70 items
    s = samplers.build("shuffle", labels=labels, batch_size=16, m=1, iterations=70 // 16, seed=3)
    epoch = [i for b in s for i in b]
    assert len(epoch) == 64 and len(set(epoch)) == 64  # ⌊70/16⌋ batches, drop_last
    state = s.state()
    after = [i for b in s for i in b]
    s2 = samplers.build("shuffle", labels=labels, batch_size=16, m=1, iterations=4, seed=99)
    s2.set_state(state)
    assert [i for b in s2 for i in b] == after
    with pytest.raises(ValueError, match="larger than the 70 training images"):
        samplers.build("shuffle", labels=labels, batch_size=100, m=1, iterations=1, seed=0)


# --- the fold ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def glyphs():
    ds = data.build("glyphs")
    return ds, mlrc_split(ds.labels, n_folds=1, scheme="traditional")


def fold_spec(glyphs, workdir: Path, **over) -> FoldSpec:
    ds, split = glyphs
    (fold,) = split.folds
    preset = load_preset("traditional", {**TINY, **over})
    return FoldSpec(
        ds,
        "glyphs",
        fold.train_classes,
        fold.val_classes,
        "contrastive",
        {},
        None,
        preset,
        0,
        workdir,
        progress=False,
    )


def test_selection_metric_picks_the_epoch_and_the_objective(glyphs, tmp_path):
    res = train_fold(fold_spec(glyphs, tmp_path, selection_metric="precision_at_1", max_epochs=4))
    assert res.history[0].epoch == 0  # the untrained model is measured (curves) ...
    p1 = [(h.epoch, h.precision_at_1) for h in res.history if h.epoch >= 1]  # ... never picked
    best_epoch = max(p1, key=lambda e: (e[1], -e[0]))[0]  # highest R@1, earlier on ties
    assert res.best_epoch == best_epoch
    assert res.objective == max(v for e, v in p1)
    assert res.best["precision_at_1"] == dict(p1)[best_epoch]


def test_warm_up_freezes_the_trunk_then_trains_it(glyphs, tmp_path):
    spec = fold_spec(glyphs, tmp_path / "a", warmup_epochs=1, max_epochs=1)
    torch.manual_seed(spec.seed)
    from mlrc.train.model import build_model

    model = build_model(spec.preset)
    start = model.state_dict()
    train_fold(spec)
    after_1 = torch.load(tmp_path / "a" / "last.pt", weights_only=False)["model"]
    # parameters only: BatchNorm running statistics move in any forward pass in train mode
    trunk = [k for k, _ in model.named_parameters() if k.startswith("trunk.")]
    embedder = [k for k in start if k.startswith("embedder.")]
    assert all(torch.equal(start[k], after_1[k]) for k in trunk)
    assert not all(torch.equal(start[k], after_1[k]) for k in embedder)
    train_fold(fold_spec(glyphs, tmp_path / "b", warmup_epochs=1, max_epochs=2))
    after_2 = torch.load(tmp_path / "b" / "last.pt", weights_only=False)["model"]
    assert not all(torch.equal(start[k], after_2[k]) for k in trunk)


# --- a study, end to end -------------------------------------------------------------------------


def cli(*args: str):
    r = runner.invoke(app, list(args))
    assert r.exit_code == 0, r.output
    return r


@pytest.fixture(scope="module")
def tested(tmp_path_factory):
    """A traditional study with fixed parameters (nothing searched), tested twice."""
    tmp = tmp_path_factory.mktemp("trad")
    doc = {
        "name": "trad",
        "dataset": {"name": "glyphs"},
        "preset": "traditional",
        "loss": {
            "name": "contrastive",
            "params": {"pos_margin": 0.0, "neg_margin": 1.0},
            "search": {},
        },
        "sampler": {"name": "shuffle"},
        "search": {"trials": 1},
        "test": {"reproductions": 2},
        "overrides": {**TINY, "lr_schedule": {"step_size": 2, "gamma": 0.5}},
    }
    path = tmp / "trad.yaml"
    path.write_text(yaml.safe_dump(doc))
    url = f"sqlite:///{tmp / 'db.sqlite'}"
    cli("study", "test", str(path), "--storage", url, "--artifacts", str(tmp / "art"), "--quiet")
    return path, url


def test_test_rows_are_the_validation_of_the_chosen_epoch(tested):
    """Validation *is* the test set: each reproduction's test MAP@R, measured by the test stage
    from its own embedding of the test classes, equals the fold's validation MAP@R at the epoch
    it kept, and the stored best_epoch is that epoch."""
    _, url = tested
    with session(store.connect(url)) as s:
        runs = s.execute(select(FoldRun).filter_by(kind="test")).scalars().all()
        results = s.execute(select(TestResult)).scalars().all()
        curves = {
            r.id: {
                e.epoch: e
                for e in s.execute(select(EpochMetric).filter_by(fold_run_id=r.id)).scalars()
            }
            for r in runs
        }
    assert sorted((r.reproduction, r.fold) for r in runs) == [(1, 0), (2, 0)]
    for run in runs:
        rows = [t for t in results if t.reproduction == run.reproduction]
        assert sorted((t.mode, t.fold) for t in rows) == [
            ("concatenated", -1),
            ("separated", -1),
            ("separated", 0),
        ]
        at_best = curves[run.id][run.best_epoch]
        best_p1 = max(e.precision_at_1 for e in curves[run.id].values())
        assert at_best.precision_at_1 == best_p1  # chosen by R@1 on the test classes
        for t in rows:
            assert t.map_at_r == pytest.approx(at_best.map_at_r, abs=1e-6)
            assert t.precision_at_1 == pytest.approx(at_best.precision_at_1, abs=1e-6)
            assert t.extra["best_epoch"] == run.best_epoch
            assert t.extra["recall_at_1"] == pytest.approx(t.precision_at_1, abs=1e-9)
            assert set(recall_ks("glyphs")) <= {
                int(k[10:]) for k in t.extra if k.startswith("recall_at_")
            }


def test_export_of_a_fixed_study_needs_no_trial(tested, tmp_path):
    """A study with nothing to search is tested without a trial; `mlrc study export` writes its
    fixed parameters and whole preset all the same (runs before the status test's trial)."""
    path, url = tested
    out = tmp_path / "exported.yaml"
    cli("study", "export", "trad", "--out", str(out), "--storage", url)
    original, exported = load_study(path), load_study(out)
    assert exported.fixed == original.fixed and not exported.space
    assert exported.preset == original.preset  # split_scheme, schedule, selection, ...


def test_status_names_the_test_set_selection(tested):
    path, url = tested
    cli("study", "run", str(path), "--storage", url, "--quiet")
    out = cli("study", "status", "trad", "--storage", url).output
    assert "test R@1 §" in out
    assert "test-set selection" in out
    assert "± SEM" in out and "nan" not in out.lower()


def test_labels_and_flag_from_a_stored_config():
    assert objective_label({"preset": {"split_scheme": "mlrc"}}) == "val MAP@R"
    assert objective_label({"preset": {}}) == "val MAP@R"  # before these fields existed
    trad = {"preset": {"split_scheme": "traditional", "selection_metric": "map_at_r"}}
    assert objective_label(trad) == "test MAP@R §" and is_traditional(trad)
    assert not is_traditional(None)


def test_recall_ks_of_the_papers():
    assert recall_ks("sop") == (1, 10, 100, 1000)
    assert recall_ks("cub200") == recall_ks("cars196") == (1, 2, 4, 8)


def test_reference_presets_are_unchanged_by_the_new_fields():
    """The new fields default to what cpu/reference always did, and are left out of an old
    study's fingerprint at those defaults (old stores still match)."""
    for name in ("cpu", "reference", "modern"):
        p: Preset = load_preset(name)
        assert (p.selection_metric, p.lr_schedule, p.warmup_epochs) == ("map_at_r", None, 0)
        assert p.loss_optimizer.name == "rmsprop"


def test_dashboard_names_the_test_set_values(tested):
    """The study's section says what its search value and curves are: test-set numbers (§)."""
    from mlrc.report.dashboard import Dashboard

    path, url = tested
    cli("study", "run", str(path), "--storage", url, "--quiet")  # one trial: a history to draw
    page = Dashboard(url).page(plotly_js="cdn")
    assert "best so far: trial 0, test R@1 §" in page
    assert "<th>test R@1 §</th>" in page and "<th>fold test MAP@R §</th>" in page
    assert "val MAP@R" not in page  # no reality-check study in this store


def test_a_search_under_the_traditional_preset_maximises_the_test_recall(tmp_path):
    """A study may search instead of fixing: each trial is its one fold's best test R@1 over
    trained epochs (no SEM: one fold) — the leakage the § marks."""
    doc = {
        "name": "trad-search",
        "dataset": {"name": "glyphs"},
        "preset": "traditional",
        "loss": {
            "name": "contrastive",
            "search": {"neg_margin": {"low": 0.5, "high": 1.5}},
            "params": {"pos_margin": 0.0},
        },
        "search": {"trials": 2, "sampler": "tpe", "seed": 0},
        "overrides": {**TINY, "max_epochs": 2},
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    cli(
        "study", "run", str(path), "--storage", url, "--artifacts", str(tmp_path / "art"), "--quiet"
    )
    from mlrc.store.schema import Trial

    with session(store.connect(url)) as s:
        trials = s.execute(select(Trial)).scalars().all()
        runs = s.execute(select(FoldRun).filter_by(kind="search")).scalars().all()
        curves = {
            r.params_hash: [
                e for e in s.execute(select(EpochMetric).filter_by(fold_run_id=r.id)).scalars()
            ]
            for r in runs
        }
    assert len(trials) == 2 and len(runs) == 2 and {r.fold for r in runs} == {0}
    for t in trials:
        (run,) = [r for r in runs if r.params_hash == t.params_hash]
        best_test_r1 = max(e.precision_at_1 for e in curves[run.params_hash] if e.epoch >= 1)
        assert t.state == "complete" and t.sem is None
        assert t.value == pytest.approx(best_test_r1, abs=1e-12)
