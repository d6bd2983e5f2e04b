"""``mlrc campaign plan`` and the planned-vs-spent table of ``campaign status``: every figure
checked against a naive recomputation from the store's rows (read here with SQLAlchemy, not
through the planner), CI half-widths against ``scipy.stats.t``, ``--target-ci`` by brute force.

Most tests write a campaign's rows with the store's own write operations (no training: fast);
one runs a real one-study campaign and plans it grown."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from importlib import resources

import numpy as np
import pytest
import torch
import typer
import yaml
from scipy import stats
from sqlalchemy import func, select
from typer.testing import CliRunner

from mlrc import data, store
from mlrc.cli.campaign import campaign_app
from mlrc.protocol import mlrc_split
from mlrc.search.campaign_runner import parse_campaign, register, resolve_campaign
from mlrc.search.embeddings import write_npz
from mlrc.search.plan import plan_campaign
from mlrc.search.plan_ci import TYPICAL, reproductions_for
from mlrc.search.pruning import RISK_TABLE
from mlrc.store import results, trials
from mlrc.store.engine import session
from mlrc.store.schema import EpochMetric, FoldRun, Study, TestResult, Trial
from mlrc.train.model import build_model

runner = CliRunner()
app = typer.Typer()
app.add_typer(campaign_app, name="campaign")
TINY = {  # as tests/search/test_campaign_runner.py: 2 folds, 16-px crops, epochs of 5 iterations
    "iterations_per_epoch": 5,
    "max_epochs": 6,
    "validate_every": {"default": 1},
    "patience": {"default": 5},
    "folds": 2,
    "image": {"resize": 20, "crop": 16},
    "eval_batch_size": 256,
}
LOSSES = ["contrastive", "triplet", "ntxent"]
NAMES = [f"camp-glyphs-{loss}" for loss in LOSSES]


def doc(**changes) -> dict:
    base = {
        "name": "camp",
        "datasets": [{"name": "glyphs"}],
        "losses": LOSSES,
        "preset": "cpu",
        "search": {"trials": 3, "seed": 5},
        "test": {"reproductions": 3},
        "overrides": TINY,
    }
    return {**base, **changes}


def cli(*args, code: int = 0):
    r = runner.invoke(app, [str(a) for a in args])
    assert r.exit_code == code, r.output
    return r


# --- a campaign's rows, written with the store's own operations --------------------------------

# study → [(kind, reproduction, fold, epochs, wall seconds, device, status)]
FOLDS = {
    NAMES[0]: [
        ("search", 0, f, e, w, "cpu", "complete") for f, e, w in [(0, 3, 6.0), (1, 5, 12.0)]
    ]  # fmt: skip
    + [("search", 0, 2 + f, e, w, "cuda:0", "complete") for f, e, w in [(0, 4, 1.0), (1, 6, 2.0)]]
    + [
        ("test", r, f, e, w, "cpu", "complete")
        for r, f, e, w in [
            (1, 0, 4, 9.0),
            (1, 1, 6, 11.0),
            (2, 0, 5, 10.0),
            (2, 1, 5, 12.0),
            (3, 0, 6, 13.0),
        ]
    ]  # fmt: skip
    + [("test", 3, 1, 2, None, "cpu", "interrupted")],
    NAMES[1]: [("search", 0, f, e, w, "cpu", "complete") for f, e, w in [(0, 2, 3.0), (1, 4, 7.0)]]
    + [("search", 0, 2, 1, 2.0, "cpu", "failed")],
}
TRIALS = {NAMES[0]: ["complete", "complete", "pruned"], NAMES[1]: ["complete", "failed"]}
TESTED = {NAMES[0]: {1: 0.2512, 2: 0.2591}}  # reproduction → concatenated test MAP@R


def _write_fold(engine, study_id: int, row: tuple) -> None:
    kind, rep, fold, epochs, wall, device, status = row
    key = {"study_id": study_id, "kind": kind, "params_hash": f"h{fold // 2}",
           "reproduction": rep, "fold": fold % 2 if kind == "search" else fold}  # fmt: skip
    run_id = trials.start_fold(engine, key, "fold", trial_number=0, seed=0, device=device)
    for epoch in range(epochs + 1):
        trials.record_epoch(engine, run_id, epoch, "fold", train_loss=1.0, map_at_r=0.1,
                            precision_at_1=0.1, r_precision=0.1)  # fmt: skip
    provenance = {"device": device, "device_name": "Test CPU" if device == "cpu" else "Test GPU"}
    trials.finish_fold(engine, key, "fold", status=status, wall_time_s=wall, provenance=provenance)


def seed_store(url: str, **changes) -> None:
    """Register the campaign and write its studies' trials, folds and test results."""
    engine = store.connect(url)
    cfg = parse_campaign(doc(**changes))
    register(engine, cfg, resolve_campaign(cfg))
    ids = {s.name: s.id for s in store.studies.studies(engine)}
    for name, states in TRIALS.items():
        for number, state in enumerate(states):
            trials.start_trial(engine, ids[name], number, {}, f"h{number}")
            trials.finish_trial(engine, ids[name], number, state, 0.1, 0.0, None)
    for name, rows in FOLDS.items():
        for row in rows:
            _write_fold(engine, ids[name], row)
    for name, reps in TESTED.items():
        for rep, value in reps.items():
            metrics = {"map_at_r": value, "precision_at_1": 0.5, "r_precision": 0.3}
            rows = [("concatenated", -1, metrics), ("separated", -1, {**metrics, "map_at_r": 0.1})]
            results.record_reproduction(engine, ids[name], rep, {}, rows)


@pytest.fixture
def seeded(tmp_path) -> str:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    seed_store(url)
    return url


# --- the naive recomputation -------------------------------------------------------------------


def naive(url: str, device: str = "cpu") -> dict:
    """What the plan should say, from the rows: per study the fold trainings left, the mean
    epochs per search/test fold and the seconds per epoch (nearest scope: the study, else the
    other studies of the campaign), hours left and the spread of the concatenated MAP@R."""
    with session(store.connect(url)) as s:
        studies = {st.id: st.name for st in s.execute(select(Study)).scalars()}
        last = dict(s.execute(select(EpochMetric.fold_run_id, func.max(EpochMetric.epoch))
                              .group_by(EpochMetric.fold_run_id)).all())  # fmt: skip
        folds = [(studies[f.study_id], f.kind, f.status, f.reproduction, last.get(f.id),
                  f.wall_time_s, f.device) for f in s.execute(select(FoldRun)).scalars()]  # fmt: skip
        finished = defaultdict(int)
        for t in s.execute(select(Trial)).scalars():
            finished[studies[t.study_id]] += t.state in ("complete", "failed", "pruned")
        values = defaultdict(dict)
        for r in s.execute(select(TestResult).where(TestResult.fold == -1)).scalars():
            if r.mode == "concatenated":
                values[studies[r.study_id]][r.reproduction] = r.map_at_r
    out = {}
    for name in NAMES:
        own = [f for f in folds if f[0] == name and f[2] == "complete"]
        scope = own or [f for f in folds if f[2] == "complete"]  # the other studies: same preset
        epochs = {}
        for kind in ("search", "test"):
            rows = [f for f in scope if f[1] == kind] or scope
            epochs[kind] = sum(f[4] for f in rows) / len(rows)
        timed = [f for f in own if f[6].split(":")[0] == device] or [
            f for f in folds if f[2] == "complete" and f[6].split(":")[0] == device
        ]
        per = sum(f[5] for f in timed) / sum(f[4] for f in timed)
        tested = len(values[name])
        reused = sum(f[1] == "test" and f[3] > tested for f in own)
        left = {"search": (3 - finished[name]) * 2, "test": (3 - tested) * 2 - reused}
        eps = left["search"] * epochs["search"] + left["test"] * epochs["test"]
        spread = np.std(np.array(list(values[NAMES[0]].values())) * 100, ddof=1)
        out[name] = {"left": left, "epochs": epochs, "per": per, "hours": eps * per / 3600,
                     "s": spread}  # fmt: skip
    return out


def plan_of(url: str, device: str = "cpu", target: float | None = None, **changes):
    cfg = parse_campaign(doc(**changes))
    grid = [(c.row, r) for c, r in resolve_campaign(cfg)]
    return plan_campaign(store.connect(url, read_only=True), "camp", grid, device, target)


# --- tests -------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_plan_matches_a_naive_count_of_the_store(seeded, device):
    want = naive(seeded, device)
    plan = plan_of(seeded, device)
    assert [p.study for p in plan.studies] == NAMES
    for p in plan.studies:
        w = want[p.study]
        assert (p.search_left, p.test_left) == (w["left"]["search"], w["left"]["test"])
        assert (p.search_folds, p.test_folds) == (6, 6)
        for kind in ("search", "test"):
            assert p.epochs_per_fold[kind].value == pytest.approx(w["epochs"][kind])
            assert p.epochs_per_fold[kind].kind == "measured"
        assert p.seconds_per_epoch.value == pytest.approx(w["per"])
        assert p.hours() == pytest.approx(w["hours"])
        assert p.spread.value == pytest.approx(w["s"])
    # by hand, the first study: 1 trial pruned (finished), 2 reps tested, 1 fold of rep 3 reused
    assert (plan.studies[0].search_left, plan.studies[0].test_left) == (0, 1)
    assert plan.studies[2].epochs_per_fold["search"].source == (
        "measured: 6 search folds of other studies of glyphs with this preset"
    )
    assert (
        "2 of 3 studies already in the store: planning only what is left (15 of 36"
        in (plan.notes[-1])
    )


def test_ci_half_width_is_the_t_interval_and_target_n_the_smallest(seeded):
    plan = plan_of(seeded, target=0.3)
    values = np.array([0.2512, 0.2591]) * 100
    s = values.std(ddof=1)
    for p in plan.studies:  # planned n = 3; the other studies pool the first one's spread
        assert p.ci == pytest.approx(stats.t.ppf(0.975, 2) * s / math.sqrt(3))
        brute = next(n for n in range(2, 10_000) if stats.t.ppf(0.975, n - 1) * s / n**0.5 <= 0.3)
        assert p.target_n == brute and p.target_n > 3
    assert [p.spread.kind for p in plan.studies] == ["measured", "pooled", "pooled"]
    for s_, target in [(0.41, 0.29), (2.0, 0.5), (0.1, 5.0), (0.0, 0.1)]:
        brute = next(
            n for n in range(2, 10_000) if stats.t.ppf(0.975, n - 1) * s_ / n**0.5 <= target
        )
        assert reproductions_for(s_, target) == brute
    assert reproductions_for(1000.0, 1e-6) is None


def test_disk_at_each_retention_counts_real_checkpoint_files(seeded, tmp_path):
    torch.manual_seed(0)
    plan0 = plan_of(seeded)
    preset = resolve_campaign(parse_campaign(doc()))[0][1].preset
    torch.save(build_model(preset, pretrained=False).state_dict(), tmp_path / "best.pt")
    best = (tmp_path / "best.pt").stat().st_size
    assert plan0.studies[0].checkpoint_bytes == pytest.approx(best, rel=0.05)
    # the test embeddings every policy keeps: a real file of the test half's shape, per rep
    labels = data.build("glyphs").labels
    n_test = int(np.isin(labels, mlrc_split(labels).test_classes).sum())
    arrays = {"separated": np.ones((2, n_test, preset.embedding_size), dtype=np.float32)}
    write_npz(tmp_path / "e.npz", **arrays, labels=labels[:n_test], roles=["all"] * n_test,
              super_labels=None, best_epochs=np.ones(2))  # fmt: skip
    emb = 3 * (tmp_path / "e.npz").stat().st_size
    # resume: one reproduction's fold models (2 folds), what export-model exports (#37)
    assert plan0.studies[0].disk_bytes == pytest.approx(2 * best + emb, rel=0.05)
    keep_best = plan_of(seeded, artifacts={"keep": "best"}).studies[0]
    assert keep_best.disk_bytes == pytest.approx((3 + 1) * 2 * best + emb, rel=0.05)
    keep_all = plan_of(seeded, artifacts={"keep": "all"}).studies[0]
    assert keep_all.disk_bytes == pytest.approx((3 + 3) * 2 * best * 4 + emb, rel=0.05)


def test_cli_plan_table_json_and_sources(seeded):
    out = cli("campaign", "plan", "camp", "--storage", seeded, "--target-ci", "0.3").output
    assert "campaign camp on cpu (keep: resume)" in out and "n for ±0.3" in out
    assert "[1] measured: 4 search folds of this study" in out
    assert "measured: this study's 2 tested reproductions" in out
    assert "no timing data" not in out
    import json

    js = json.loads(cli("campaign", "plan", "camp", "--storage", seeded, "--json").output)
    want = naive(seeded)
    assert js["total"]["fold_trainings_left"] == sum(
        w["left"]["search"] + w["left"]["test"] for w in want.values()
    )
    assert js["total"]["hours_left"] == pytest.approx(sum(w["hours"] for w in want.values()))


def test_no_timing_data_says_what_it_estimates_from(seeded, tmp_path):
    path = tmp_path / "camp.yaml"
    path.write_text(yaml.safe_dump(doc()))
    out = cli("campaign", "plan", path, "--storage", f"sqlite:///{tmp_path / 'new.db'}").output
    assert "no store at" in out
    line = [x for x in out.splitlines() if x.startswith("no timing data")]
    assert line == [
        "no timing data for cpu with preset cpu in the store: estimating from bench/trainer.py "
        "(train_fold, 26.6 it/s on one thread of a 2-core AMD EPYC, docs/guide/performance.md; "
        "training steps and a tiny validation)"
    ]
    assert "upper bound: max_epochs" in out and TYPICAL.source in out.replace("\n", " ")
    out = cli("campaign", "plan", "camp", "--storage", seeded, "--device", "mps").output
    assert [x for x in out.splitlines() if x.startswith("no timing data")] == [
        "no timing data for mps with preset cpu in the store, and no benchmark of tiny_cnn at "
        "batch 32 on mps: hours unknown"
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--device", "gpu0"], "error: --device gpu0: not a device (cpu, cuda, cuda:N or mps)"),
        (["--device", "cuda:x"], "error: --device cuda:x: not a device"),
        (["--target-ci", "0"], "error: --target-ci 0.0: a half-width must be positive"),
        (["--target-ci", "-1"], "error: --target-ci -1.0: a half-width must be positive"),
    ],
)
def test_bad_plan_options_are_one_line(seeded, args, message):
    r = cli("campaign", "plan", "camp", "--storage", seeded, *args, code=2)
    assert r.output.startswith(message) and r.output.count("\n") == 1, r.output


def test_unknown_campaign_is_one_line(seeded, tmp_path):
    r = cli("campaign", "plan", "nope", "--storage", seeded, code=2)
    assert r.output.startswith("error: no campaign 'nope'")
    r = cli("campaign", "plan", "camp", "--storage", f"sqlite:///{tmp_path / 'x.db'}", code=2)
    assert r.output.startswith("error: no campaign 'camp'")


def test_status_shows_planned_vs_spent(seeded):
    out = cli("campaign", "status", "camp", "--storage", seeded).output
    want = naive(seeded)
    plan = plan_of(seeded)
    for name, p in zip(NAMES, plan.studies, strict=True):
        rows = [r for r in FOLDS.get(name, [])]
        ended = sum(r[6] in ("complete", "failed") for r in rows)
        epochs = sum(r[3] for r in rows)
        spent = out.split("planned vs spent")[1].splitlines()  # the work table is above it
        line = next(x for x in spent if x.startswith(f"│ {name} "))
        assert f"{ended} / 12" in line and f"{epochs} / {p.epochs(left=False):,.0f}" in line
        full = 6 * want[name]["epochs"]["search"] + 6 * want[name]["epochs"]["test"]
        assert p.epochs(left=False) == pytest.approx(full)
    assert "planned vs spent (hours on cpu)" in out


@pytest.mark.slow
def test_a_real_campaign_run_partly_then_planned_grown(tmp_path):
    """One study trained for real (1 trial, 2 reproductions), then planned with 2 trials and 3
    reproductions: what is left, epochs and seconds per epoch as the rows say."""
    small = {**doc(losses=["contrastive"]), "search": {"trials": 1, "seed": 5},
             "test": {"reproductions": 2}, "overrides": {**TINY, "max_epochs": 2}}  # fmt: skip
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(small))
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    cli("campaign", "run", path, "--storage", url, "--artifacts", tmp_path / "art", "--quiet")
    grown = {**small, "search": {"trials": 2, "seed": 5}, "test": {"reproductions": 3}}
    cfg = parse_campaign(grown)
    grid = [(c.row, r) for c, r in resolve_campaign(cfg)]
    (p,) = plan_campaign(store.connect(url, read_only=True), "camp", grid, "cpu").studies
    with session(store.connect(url)) as s:
        runs = s.execute(select(FoldRun)).scalars().all()
        last = dict(s.execute(select(EpochMetric.fold_run_id, func.max(EpochMetric.epoch))
                              .group_by(EpochMetric.fold_run_id)).all())  # fmt: skip
        maps = s.execute(select(TestResult.map_at_r).where(
            TestResult.fold == -1, TestResult.mode == "concatenated")).scalars().all()  # fmt: skip
    assert (p.search_left, p.test_left) == (2, 2) and (p.search_folds, p.test_folds) == (4, 6)
    test = [r for r in runs if r.kind == "test"]
    assert p.epochs_per_fold["test"].value == pytest.approx(
        sum(last[r.id] for r in test) / len(test)
    )
    assert p.seconds_per_epoch.value == pytest.approx(
        sum(r.wall_time_s for r in runs) / sum(last[r.id] for r in runs)
    )
    s = np.std(np.array(maps) * 100, ddof=1)
    assert p.ci == pytest.approx(stats.t.ppf(0.975, 2) * s / math.sqrt(3))
    out = cli("campaign", "status", path, "--storage", url).output
    assert "6 / 6" in out  # every planned fold training spent


def test_a_pruned_campaign_says_its_search_is_an_upper_bound(tmp_path):
    path = tmp_path / "camp.yaml"
    path.write_text(yaml.safe_dump(doc(search={"trials": 3, "seed": 5, "pruner": "wilcoxon"})))
    out = cli("campaign", "plan", path, "--storage", f"sqlite:///{tmp_path / 'new.db'}").output
    table = json.loads(resources.files("mlrc.resources").joinpath(RISK_TABLE).read_text())
    entry = table["rules"].get("wilcoxon(p=0.3)")
    lines = [x for x in out.replace("\n ", " ").splitlines() if "searched with pruning" in x]
    assert len(lines) == len(LOSSES)
    assert "(wilcoxon(p=0.3)): its search figures are upper bounds" in lines[0]
    if entry is not None:  # measured on the corpus: the replay figure for 3 trials (the first 20)
        spent = entry["by_length"]["20"]["fold_epochs_fraction"]
        assert f"spent {spent:.2f}× the unpruned" in lines[0]
