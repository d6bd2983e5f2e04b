"""Campaigns: a grid of studies (dataset × loss [× strategy]) run, resumed and watched as one."""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import pytest
import torch
import typer
import yaml
from sqlalchemy import select
from typer.testing import CliRunner

from mlrc import store
from mlrc.cli.campaign import campaign_app
from mlrc.config import ConfigError, default_space
from mlrc.methods import losses
from mlrc.search import open_study, run_search
from mlrc.search.campaign_runner import (
    cells,
    load_campaign,
    parse_campaign,
    register,
    resolve_campaign,
    sanitize,
    study_name,
)
from mlrc.store.engine import session
from mlrc.store.schema import CampaignStudy, FoldRun, Study, StudyHistory, TestResult, Trial

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()
app = typer.Typer()
app.add_typer(campaign_app, name="campaign")
TINY = {  # seconds per study on a CPU: 2 folds, 16-px crops, 2 epochs of 5 iterations
    "iterations_per_epoch": 5,
    "max_epochs": 2,
    "validate_every": {"default": 1},
    "patience": {"default": 5},
    "folds": 2,
    "image": {"resize": 20, "crop": 16},
    "eval_batch_size": 256,
}


def campaign_doc(**changes) -> dict:
    doc = {
        "name": "camp",
        "datasets": [{"name": "glyphs"}],
        "losses": ["contrastive", "mean_field_class_wise_multi_similarity"],
        "strategies": [None],
        "preset": "cpu",
        "search": {"trials": 1, "seed": 5},
        "test": {"reproductions": 2},
        "overrides": TINY,
    }
    return {**doc, **changes}


def write(tmp_path: Path, doc: dict, name: str = "campaign.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def cli(*args: str, code: int = 0):
    r = runner.invoke(app, [str(a) for a in args])
    assert r.exit_code == code, r.output
    return r


def rows(url: str, model) -> list:
    with session(store.connect(url)) as s:
        return s.execute(select(model)).scalars().all()


def table_rows(out: str) -> list[str]:
    """The losses of the report's rows with n = 2 (markup such as <ins> or ** stripped)."""
    found = []
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) > 2 and cells[1] == "2":
            found.append(re.sub(r"</?ins>|\*\*", "", cells[0]))
    return found


# --- the file ----------------------------------------------------------------------------------


def test_example_campaign_of_the_issue_resolves(monkeypatch, tmp_path):
    """studies/campaigns/omniglot.yaml resolves in a bare clone: its dataset has no root (mlrc
    downloads the Omniglot zip, SHA-256 checked, when a study first loads it)."""
    monkeypatch.chdir(tmp_path)  # from any folder: nothing relative to resolve
    path = REPO / "studies/campaigns/omniglot.yaml"
    plan = resolve_campaign(load_campaign(path), str(path))
    assert [c.name for c, _ in plan] == [
        "omniglot-campaign-omniglot-contrastive",
        "omniglot-campaign-omniglot-mean_field_class_wise_multi_similarity",
    ]
    for _, r in plan:
        assert (r.trials, r.reproductions, r.study.search.seed, r.study.preset) == (1, 2, 5, "cpu")
        assert (r.study.dataset.name, r.study.dataset.root) == ("omniglot", None)
    assert plan[1][1].space.keys() == {"alpha", "beta", "delta", "loss_lr"}


def test_example_campaigns_dataset_is_the_checked_download(omniglot_zip, monkeypatch, tmp_path):
    """What the example's dataset loads: the download, its SHA-256 checked (here from a local
    copy of the real subset through $MLRC_OMNIGLOT_URL, into an empty cache)."""
    from mlrc import data

    monkeypatch.setenv("MLRC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("MLRC_OMNIGLOT_URL", omniglot_zip.as_uri())
    path = REPO / "studies/campaigns/omniglot.yaml"
    (_, r), *_ = resolve_campaign(load_campaign(path), str(path))
    ds = data.build(r.study.dataset.name, root=r.study.dataset.root)
    assert (len(ds), ds.num_classes) == (2720, 136)
    assert (tmp_path / "cache/omniglot/images_background_small1.zip").is_file()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"lossses": ["contrastive"]}, "unknown key 'lossses'; did you mean 'losses'?"),
        ({"loss": {"name": "contrastive"}}, "unknown key 'loss'; did you mean 'losses'?"),
        (
            {"losses": [{"name": "contrastive", "parms": {}}]},
            "unknown key 'losses.0.parms'; did you mean 'params'?",
        ),
        ({"search": {"trails": 2}}, "unknown key 'search.trails'; did you mean 'trials'?"),
        (
            {"datasets": [{"name": "glyphs", "rot": "x"}]},
            "unknown key 'datasets.0.rot'; did you mean 'root'?",
        ),
        ({"losses": []}, "losses: List should have at least 1 item"),
        ({"datasets": []}, "datasets: List should have at least 1 item"),
        ({"test": {"reproductions": 1}}, "test.reproductions: Input should be greater than or"),
        ({"name": "my campaign"}, "name: String should match pattern"),
        (
            {"datasets": [{"name": "image_folder", "root": "no/such/dir"}]},
            "datasets.0.root: no/such/dir does not exist",
        ),
        (
            {"losses": ["contrastive", {"name": "contrastive", "params": {"pos_margin": 0.1}}]},
            "losses.1 and losses.0 give the same study name 'camp-glyphs-contrastive'; "
            "set a distinct `label`",
        ),
        (
            {"search": {"enqueue": [{"pos_margin": 0.0}]}},
            "search.enqueue: parameters differ per loss; give `enqueue` in a loss item",
        ),
    ],
)
def test_campaign_file_mistakes_are_one_line(tmp_path, changes, message):
    path = write(tmp_path, campaign_doc(**changes))
    with pytest.raises(ConfigError) as err:
        load_campaign(path)
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"losses": ["contrastive", "contrastiv"]},
            "losses.1.name: unknown loss 'contrastiv'; did you mean 'contrastive'?",
        ),
        (
            {"losses": [{"name": "triplet", "search": {"margin": {"low": 2, "high": 1}}}]},
            "losses.0.search.margin: low (2.0) > high (1.0)",
        ),
        (
            {"losses": [{"name": "triplet", "params": {"marginn": 0.1}}]},
            "losses.0.params.marginn: loss 'triplet' takes no parameter 'marginn'",
        ),
        (
            {"datasets": [{"name": "glyphs"}, {"name": "cub"}]},
            "datasets.1.name: unknown dataset 'cub'; did you mean 'cub200'?",
        ),
        (
            {"strategies": [None, "rho_distanse"]},
            "strategies.1.name: unknown strategy 'rho_distanse'",
        ),
        (
            {"strategies": ["rho_distance"]},
            "strategies.0: 'rho_distance' needs a tuple loss; "
            "loss 'mean_field_class_wise_multi_similarity' takes no tuples",
        ),
        (
            {"miner": {"name": "multi_similarity"}},
            "miner: loss 'mean_field_class_wise_multi_similarity' does not use a miner's pairs "
            "(study camp-glyphs-mean_field_class_wise_multi_similarity)",
        ),
        ({"overrides": {"max_epoch": 3}}, "unknown preset field 'max_epoch'; did you mean"),
        ({"preset": "cpuu"}, "unknown preset 'cpuu'; did you mean 'cpu'?"),
        (
            {"losses": ["npairs"], "search": {"trials": 3}},
            "search.trials = 3 but the search space is empty (nothing to search: use trials: 1) "
            "(study camp-glyphs-npairs)",
        ),
    ],
)
def test_every_study_is_resolved_with_the_campaign_key_in_the_message(tmp_path, changes, message):
    path = write(tmp_path, campaign_doc(**changes))
    with pytest.raises(ConfigError) as err:
        resolve_campaign(load_campaign(path), str(path))
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value)


def test_a_mistake_in_the_last_loss_stops_the_campaign_before_anything_runs(tmp_path):
    doc = campaign_doc(losses=["contrastive", "triplet", "ntxent", "snr", "multi_similarityy"])
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    r = cli("campaign", "run", write(tmp_path, doc), "--storage", url, "--quiet", code=2)
    assert r.output.startswith("error:") and "Traceback" not in r.output
    assert "losses.4.name: unknown loss 'multi_similarityy'" in r.output
    assert not (tmp_path / "db.sqlite").exists() and not (tmp_path / "mlrc-artifacts").exists()


def test_names_are_derived_and_sanitised():
    assert study_name("c", "omniglot", "contrastive") == "c-omniglot-contrastive"
    assert study_name("c", "cub200", "contrastive", "metrix") == "c-cub200-contrastive-metrix"
    assert sanitize("my images/v2 (2024)") == "my-images-v2-2024"
    assert sanitize("a.b_c-d") == "a.b_c-d" and sanitize("///") == "x"
    cfg = parse_campaign(
        campaign_doc(
            datasets=["glyphs", {"name": "image_folder", "label": "my images/v2"}],
            losses=[
                "contrastive",
                {"name": "contrastive", "params": {"pos_margin": 0.0}, "label": "contrastive m+=0"},
            ],
            strategies=[None, "metrix", {"name": "metrix", "params": {"w": 0.5}, "label": "mx½"}],
        ),
        check_roots=False,
    )
    grid = cells(cfg)
    assert len(grid) == 2 * 2 * 3 and [c.position for c in grid] == list(range(12))
    assert [c.name for c in grid[:6]] == [
        "camp-glyphs-contrastive",
        "camp-glyphs-contrastive-metrix",
        "camp-glyphs-contrastive-mx",
        "camp-glyphs-contrastive-m-0",
        "camp-glyphs-contrastive-m-0-metrix",
        "camp-glyphs-contrastive-m-0-mx",
    ]
    assert grid[-1].name == "camp-my-images-v2-contrastive-m-0-mx"
    assert (grid[-1].row, grid[-1].column) == ("contrastive m+=0 + mx½", "my images/v2")
    assert grid[-1].where == (1, 1, 2)
    # the items map onto the study's own sections
    s = grid[-1].study
    assert s.loss.params == {"pos_margin": 0.0} and s.strategy.params == {"w": 0.5}
    assert s.dataset.name == "image_folder" and s.search.trials == 1 and s.test.reproductions == 2


def test_loss_items_map_onto_the_study_loss_and_default_spaces(tmp_path):
    doc = campaign_doc(
        losses=[
            "contrastive",
            {"name": "contrastive", "params": {"pos_margin": 0.0}, "label": "fixed"},
            {"name": "triplet", "search": {"margin": {"low": 0.01, "high": 0.5, "log": True}}},
            {"name": "ntxent", "enqueue": [{"temperature": 0.1}]},
        ],
        strategies=[None, "rho_distance"],  # crossed with every loss: one for tuple losses
    )
    plan = dict((c.name, r) for c, r in resolve_campaign(parse_campaign(doc)))
    assert plan["camp-glyphs-contrastive"].space == default_space("contrastive")
    fixed = plan["camp-glyphs-fixed"]
    assert fixed.space.keys() == {"neg_margin"} and fixed.fixed == {"pos_margin": 0.0}
    assert plan["camp-glyphs-triplet"].space["margin"].log is True
    assert plan["camp-glyphs-ntxent"].study.search.enqueue == [{"temperature": 0.1}]
    assert plan["camp-glyphs-contrastive"].study.search.enqueue == []
    rho = plan["camp-glyphs-contrastive-rho_distance"]
    assert rho.study.strategy.name == "rho_distance"
    assert {k for k in rho.space if k.startswith("strategy.")} == {
        "strategy." + k for k in default_space("rho_distance", REPO / "studies/spaces/strategies")
    }


def test_membership_follows_the_campaign_file(tmp_path):
    """Registered in file order (idempotently); a study dropped from the file leaves the
    campaign, not the store; a grown campaign keeps its studies."""
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    engine = store.connect(url)

    def members(doc):
        cfg = parse_campaign(doc)
        register(engine, cfg, resolve_campaign(cfg))
        with session(engine) as s:
            found = s.execute(
                select(CampaignStudy.position, Study.name)
                .join(Study, Study.id == CampaignStudy.study_id)
                .order_by(CampaignStudy.position)
            ).all()
        return [tuple(r) for r in found]

    three = campaign_doc(losses=["contrastive", "triplet", "ntxent"])
    expected = [
        (0, "camp-glyphs-contrastive"),
        (1, "camp-glyphs-triplet"),
        (2, "camp-glyphs-ntxent"),
    ]
    assert members(three) == expected
    assert members(three) == expected  # idempotent
    assert members(campaign_doc(losses=["ntxent", "contrastive"])) == [
        (0, "camp-glyphs-ntxent"),
        (1, "camp-glyphs-contrastive"),
    ]
    assert len(rows(url, Study)) == 3
    out = cli("campaign", "status", "camp", "--storage", url).output
    assert "ntxent" in out and "triplet" not in out and "2 studies: 2 pending" in out


# --- a real campaign on the Omniglot subset ----------------------------------------------------


@pytest.fixture(scope="module")
def omniglot_campaign(tmp_path_factory, omniglot_zip):
    """2 losses × Omniglot, 1 trial, 2 reproductions, tiny epochs: run once for the module."""
    tmp = tmp_path_factory.mktemp("campaign")
    doc = campaign_doc(name="omni", datasets=[{"name": "omniglot", "root": str(omniglot_zip)}])
    path = write(tmp, doc)
    url, art = f"sqlite:///{tmp / 'db.sqlite'}", tmp / "art"
    t0 = time.monotonic()
    r = cli("campaign", "run", path, "--storage", url, "--artifacts", art, "--quiet")
    return path, url, art, r.output, time.monotonic() - t0


NAMES = ["omni-omniglot-contrastive", "omni-omniglot-mean_field_class_wise_multi_similarity"]


def test_campaign_runs_search_and_test_of_every_study(omniglot_campaign):
    _, url, _, out, _ = omniglot_campaign
    assert f"study 1/2 · {NAMES[0]}" in out and f"study 2/2 · {NAMES[1]}" in out
    assert "2 studies: 2 done" in out
    assert "### omniglot" in out
    assert table_rows(out) == ["contrastive", "mean_field_class_wise_multi_similarity"]
    studies = {s.id: s for s in rows(url, Study)}
    assert sorted(s.name for s in studies.values()) == NAMES
    members = sorted(rows(url, CampaignStudy), key=lambda m: m.position)
    assert [(m.campaign, studies[m.study_id].name, m.position) for m in members] == [
        ("omni", NAMES[0], 0),
        ("omni", NAMES[1], 1),
    ]
    assert members[0].campaign_config["name"] == "omni"
    assert members[0].campaign_config["losses"][1]["name"] == NAMES[1].split("-")[-1]
    trials = rows(url, Trial)
    assert len(trials) == 2 and {t.state for t in trials} == {"complete"}
    results = [r for r in rows(url, TestResult) if r.fold == -1]
    assert len(results) == 2 * 2 * 2  # studies × reproductions × (separated, concatenated)
    assert {studies[r.study_id].name for r in results} == set(NAMES)
    folds = rows(url, FoldRun)
    assert sum(f.kind == "search" for f in folds) == 2 * 2  # studies × folds
    assert sum(f.kind == "test" for f in folds) == 2 * 2 * 2  # studies × reproductions × folds
    assert {f.status for f in folds} == {"complete"}


def test_status_by_file_and_by_name(omniglot_campaign):
    path, url, _, _, _ = omniglot_campaign
    for ref in (str(path), "omni"):
        out = cli("campaign", "status", ref, "--storage", url).output
        assert "campaign omni" in out and "omniglot" in out and "contrastive" in out
        assert out.count("done") >= 2 and "2 studies: 2 done" in out
    r = cli("campaign", "status", "nope", "--storage", url, code=2)
    assert "error: no campaign 'nope'" in r.output


def test_rerun_resumes_without_training(omniglot_campaign):
    path, url, art, _, first_s = omniglot_campaign
    before = {(f.study_id, f.kind, f.params_hash, f.reproduction, f.fold): f.updated
              for f in rows(url, FoldRun)}  # fmt: skip
    n_results, n_members = len(rows(url, TestResult)), len(rows(url, CampaignStudy))
    t0 = time.monotonic()
    r = cli("campaign", "run", path, "--storage", url, "--artifacts", art, "--quiet")
    again_s = time.monotonic() - t0
    after = {(f.study_id, f.kind, f.params_hash, f.reproduction, f.fold): f.updated
             for f in rows(url, FoldRun)}  # fmt: skip
    assert after == before
    assert len(rows(url, TestResult)) == n_results and len(rows(url, CampaignStudy)) == n_members
    assert len(rows(url, Trial)) == 2 and "2 studies: 2 done" in r.output
    assert again_s < first_s / 2, (again_s, first_s)


def test_changed_campaign_is_refused_before_anything_runs(omniglot_campaign, tmp_path):
    path, url, art, _, _ = omniglot_campaign
    doc = yaml.safe_load(path.read_text())
    doc["search"]["seed"] = 6  # defines the numbers (a budget may change: see below)
    r = cli("campaign", "run", write(tmp_path, doc), "--storage", url, "--artifacts", art, code=2)
    assert r.output.startswith("error:") and "Traceback" not in r.output
    assert f"study '{NAMES[0]}' already exists in the store with a different configuration" in (
        r.output
    )
    assert "study.search.seed: 5 in the store, 6 now" in r.output
    assert len(rows(url, Trial)) == 2 and len(rows(url, Study)) == 2


def test_a_campaign_with_a_larger_budget_grows_its_studies(omniglot_campaign, tmp_path):
    path, url0, art0, _, _ = omniglot_campaign
    src = url0.removeprefix("sqlite:///")
    for suffix in ("", "-wal", "-shm"):  # a copy of the store: the module's stays as it was
        if Path(src + suffix).exists():
            shutil.copy(src + suffix, f"{tmp_path / 'db.sqlite'}{suffix}")
    url, art = f"sqlite:///{tmp_path / 'db.sqlite'}", tmp_path / "art"
    shutil.copytree(art0, art)
    before = {(t.study_id, t.number): (t.params, t.value) for t in rows(url, Trial)}
    doc = yaml.safe_load(path.read_text())
    doc["search"]["trials"] = 2
    out = cli("campaign", "run", write(tmp_path, doc), "--storage", url, "--artifacts", art,
              "--quiet").output  # fmt: skip
    assert "2 studies: 2 done" in out
    after = {(t.study_id, t.number): (t.params, t.value) for t in rows(url, Trial)}
    assert len(after) == 4 and {k: after[k] for k in before} == before  # only the new trials
    history = sorted((h.study_id, h.field, h.old, h.new) for h in rows(url, StudyHistory))
    ids = sorted(s.id for s in rows(url, Study))
    assert history == [(i, "search.trials", "1", "2") for i in ids]


# --- failures ----------------------------------------------------------------------------------


class _Exploding(torch.nn.Module):
    def forward(self, embeddings, labels):
        return embeddings.pow(2).mean() * float("nan")


def _exploding(*, num_classes: int, embedding_size: int):
    """NaN from the first iteration (for tests)."""
    return _Exploding()


@pytest.fixture
def campaign_nan():
    """Registered only while the test runs: other tests list every registered loss."""
    losses.register("test_campaign_nan", batch="pair")(_exploding)
    yield
    losses.LOSSES.unregister("test_campaign_nan")


def test_a_failed_study_is_reported_and_the_others_go_on(tmp_path, campaign_nan):
    doc = campaign_doc(losses=["test_campaign_nan", "contrastive"])
    path = write(tmp_path, doc)
    url, art = f"sqlite:///{tmp_path / 'db.sqlite'}", tmp_path / "art"
    store.connect(url).dispose()  # status only reads: a missing store file is refused
    out = cli("campaign", "status", path, "--storage", url).output
    assert out.count("not started") >= 2 and "2 studies: 2 not started" in out
    r = cli("campaign", "run", path, "--storage", url, "--artifacts", art, "--quiet", code=1)
    reason = (
        "failed: all 1 trials failed or scored 0 for a non-finite loss "
        "(last: non-finite loss at iteration 1, fold 0)"
    )
    assert f"study 1/2 failed: camp-glyphs-test_campaign_nan: {reason[8:]}" in r.output
    assert f"camp-glyphs-test_campaign_nan: {reason}" in r.output
    assert "study 2/2 · camp-glyphs-contrastive" in r.output
    assert "2 studies: 1 done, 1 failed" in r.output and table_rows(r.output) == ["contrastive"]
    out = cli("campaign", "status", "camp", "--storage", url).output
    assert f"camp-glyphs-test_campaign_nan: {reason}" in out and "1 done, 1 failed" in out
    # a grown campaign: the new study is registered, then searched, then tested
    doc["losses"].append("triplet")
    path = write(tmp_path, doc)
    out = cli("campaign", "status", path, "--storage", url).output
    assert "1 done, 1 failed, 1 not started" in out
    cfg = load_campaign(path)
    plan = resolve_campaign(cfg, str(path))
    register(store.connect(url), cfg, plan)
    out = cli("campaign", "status", "camp", "--storage", url).output
    assert "0/1 trials, 0/2 reps" in out and "1 done, 1 failed, 1 pending" in out
    with open_study(plan[2][1], url, art, progress=False) as ctx:
        run_search(ctx)
    out = cli("campaign", "status", "camp", "--storage", url).output
    assert "1/1 trials, 0/2 reps" in out and "1 done, 1 failed, 1 partial" in out
