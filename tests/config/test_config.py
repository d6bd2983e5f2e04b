"""Study files: a valid one resolves; each mistake is one clear error naming file and key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mlrc.config import LOSS_LR, ConfigError, load_preset, load_study

VALID = {
    "name": "omniglot-contrastive",
    "dataset": {"name": "glyphs"},
    "preset": "cpu",
    "loss": {
        "name": "contrastive",
        "params": {},
        "search": {
            "pos_margin": {"low": -0.2, "high": 2.0},
            "neg_margin": {"low": -0.2, "high": 2.0},
        },
    },
    "strategy": None,
    "search": {"trials": 6, "sampler": "gp", "seed": 0},
    "test": {"reproductions": 2},
    "overrides": {},
}


def write(tmp_path: Path, doc: dict | str) -> Path:
    path = tmp_path / "study.yaml"
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return path


def with_(**changes) -> dict:
    doc = yaml.safe_load(yaml.safe_dump(VALID))
    for dotted, value in changes.items():
        node = doc
        *parents, last = dotted.split("__")
        for k in parents:
            node = node[k]
        if value is ...:
            del node[last]
        else:
            node[last] = value
    return doc


def test_the_issue_example_resolves(tmp_path):
    r = load_study(write(tmp_path, VALID))
    assert (r.trials, r.sampler, r.reproductions) == (6, "gp", 2)
    assert set(r.space) == {"pos_margin", "neg_margin"} and r.fixed == {}
    assert r.preset.trunk == "tiny_cnn" and r.preset.per_dataset("patience", "omniglot") == 3


def test_repository_study_file_resolves():
    repo = Path(__file__).resolve().parents[2]
    r = load_study(repo / "studies" / "omniglot-contrastive.yaml")
    # no root: mlrc downloads the subset (SHA-256 checked), so a bare clone runs it as is
    assert (r.study.dataset.name, r.study.dataset.root) == ("omniglot", None)


def test_defaults_come_from_preset_and_loss_space(tmp_path):
    doc = with_(loss__search=..., search=..., test=...)
    r = load_study(write(tmp_path, doc))
    assert (r.trials, r.reproductions) == (4, 3)  # cpu preset
    assert set(r.space) == {"pos_margin", "neg_margin"}  # studies/spaces/losses/contrastive.yaml


def test_loss_with_parameters_searches_loss_lr(tmp_path):
    doc = with_(loss={"name": "normalized_softmax", "params": {"temperature": 0.05}})
    r = load_study(
        write(tmp_path, doc)
    )  # default space: studies/spaces/losses/normalized_softmax.yaml
    assert set(r.space) == {LOSS_LR} and r.fixed == {"temperature": 0.05}
    assert (r.space[LOSS_LR].low, r.space[LOSS_LR].high, r.space[LOSS_LR].log) == (1e-6, 1.0, True)
    search = {"temperature": {"low": 0.01, "high": 1.0, "log": True}}
    doc = with_(loss={"name": "normalized_softmax", "search": search})
    r = load_study(write(tmp_path, doc))  # a user space without loss_lr: the preset's range
    assert set(r.space) == {"temperature", LOSS_LR} and r.space[LOSS_LR].low == 1e-5


def test_overrides_merge_into_the_preset(tmp_path):
    r = load_study(write(tmp_path, with_(overrides={"max_epochs": 3, "optimizer": {"lr": 0.5}})))
    assert r.preset.max_epochs == 3 and r.preset.optimizer.lr == 0.5
    assert r.preset.optimizer.momentum == 0.9  # untouched sibling


def test_reference_preset_has_every_protocol_number():
    p = load_preset("reference")
    assert (p.trunk, p.pretrained, p.freeze_batchnorm, p.embedding_size) == (
        "bninception",
        True,
        True,
        128,
    )
    assert (p.image.resize, p.image.crop, p.image.scale, p.image.ratio) == (
        256,
        227,
        (0.16, 1.0),
        (0.75, 1.33),
    )
    assert p.batch.size == 32 and p.batch.images_per_class == {"pair": 4, "class": 1}
    assert (p.optimizer.lr, p.optimizer.weight_decay, p.optimizer.momentum) == (1e-6, 1e-4, 0.9)
    assert (p.loss_optimizer.lr.low, p.loss_optimizer.lr.high, p.loss_optimizer.lr.log) == (
        1e-6,
        1.0,
        True,
    )
    assert (p.iterations_per_epoch, p.max_epochs, p.folds, p.split_scheme) == (100, 1000, 4, "mlrc")
    for ds, k, pat in (("cub200", 2, 9), ("cars196", 5, 14), ("sop", 20, 39)):
        assert (p.per_dataset("validate_every", ds), p.per_dataset("patience", ds)) == (k, pat)
    assert (p.search.trials, p.search.sampler, p.test.reproductions) == (50, "gp", 10)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (with_(trails=3), "unknown key 'trails'"),
        (with_(search__trails=3), "unknown key 'search.trails'; did you mean 'trials'?"),
        (
            with_(loss__name="contrastiv"),
            "loss.name: unknown loss 'contrastiv'; did you mean 'contrastive'?",
        ),
        (
            with_(loss__params={"margin": 0.1}),
            "loss.params.margin: loss 'contrastive' takes no parameter 'margin'",
        ),
        (
            with_(loss__search={"alpha": {"low": 0, "high": 1}}),
            "loss.search.alpha: loss 'contrastive' takes no",
        ),
        (
            with_(loss__search__pos_margin={"low": 2.0, "high": 1.0}),
            r"loss.search.pos_margin: low \(2.0\) > high \(1.0\)",
        ),
        (
            with_(loss__search__pos_margin={"low": 0.0, "high": 1.0, "log": True}),
            "a log range must be > 0, got low = 0.0",
        ),
        (
            with_(dataset={"name": "omniglot", "root": "/nonexistent/omniglot.zip"}),
            "dataset.root: /nonexistent/omniglot.zip does not exist",
        ),
        (
            with_(dataset={"name": "cub"}),
            "dataset.name: unknown dataset 'cub'; did you mean 'cub200'?",
        ),
        (with_(preset="cpuu"), "unknown preset 'cpuu'; did you mean 'cpu'?"),
        (
            with_(overrides={"max_epoch": 3}),
            "unknown preset field 'max_epoch'; did you mean 'max_epochs'?",
        ),
        (with_(overrides={"max_epochs": "many"}), "max_epochs: Input should be a valid integer"),
        (with_(search__sampler="random"), "search.sampler: Input should be 'gp', 'tpe' or 'ax'"),
        (
            with_(test__reproductions=1),
            "test.reproductions: Input should be greater than or equal to 2",
        ),
        (
            with_(loss__search={}, search__trials=3),
            "search.trials = 3 but the search space is empty",
        ),
        (with_(name="bad name!"), "name: String should match pattern"),
        (
            with_(loss__params={"pos_margin": 0.1}),
            r"loss.params and loss.search both set \['pos_margin'\]",
        ),
    ],
)
def test_each_mistake_is_one_clear_error(tmp_path, doc, message):
    path = write(tmp_path, doc)
    with pytest.raises(ConfigError, match=message) as err:
        load_study(path)
    assert str(err.value).startswith(str(path)) and "\n" not in str(err.value)


def test_malformed_yaml_names_line_and_column(tmp_path):
    path = write(tmp_path, "name: x\ndataset: {name: glyphs\nloss: {name: contrastive}\n")
    with pytest.raises(ConfigError, match=r"study.yaml: line 3, column 5: malformed YAML"):
        load_study(path)


def test_missing_study_file(tmp_path):
    with pytest.raises(ConfigError, match="nope.yaml: cannot read"):
        load_study(tmp_path / "nope.yaml")


def test_relative_root_is_found_next_to_the_study_file(tmp_path, monkeypatch):
    (tmp_path / "data" / "a").mkdir(parents=True)
    monkeypatch.chdir("/")
    r = load_study(write(tmp_path, with_(dataset={"name": "image_folder", "root": "data"})))
    assert r.study.dataset.root == str((tmp_path / "data").resolve())


def test_miner_joins_the_search_space_with_a_prefix(tmp_path):
    doc = with_(loss={"name": "multi_similarity"}, miner={"name": "multi_similarity"})
    r = load_study(write(tmp_path, doc))
    assert set(r.space) == {"alpha", "beta", "base", "miner.epsilon"}
    doc = with_(
        loss={"name": "triplet"},
        miner={"name": "triplet_margin", "params": {"type_of_triplets": "hard"}},
    )
    r = load_study(write(tmp_path, doc))
    assert r.fixed == {"miner.type_of_triplets": "hard"} and "miner.margin" in r.space


@pytest.mark.parametrize(
    ("miner", "loss", "message"),
    [
        (
            {"name": "multi_similarty"},
            "multi_similarity",
            "miner.name: unknown miner 'multi_similarty'; did you mean 'multi_similarity'?",
        ),
        (
            {"name": "multi_similarity", "params": {"margin": 1}},
            "multi_similarity",
            "miner.params.margin: miner 'multi_similarity' takes no parameter 'margin'",
        ),
        (
            {"name": "multi_similarity"},
            "mean_field_contrastive",
            "miner: loss 'mean_field_contrastive' does not use a miner's pairs",
        ),
    ],
)
def test_miner_mistakes(tmp_path, miner, loss, message):
    with pytest.raises(ConfigError, match=message):
        load_study(write(tmp_path, with_(loss={"name": loss}, miner=miner)))


REPO = Path(__file__).resolve().parents[2]


def _registered_losses() -> list[str]:
    from mlrc.methods import losses

    return [n for n in losses.available() if not n.startswith("test_")]  # tests add throwaways


@pytest.mark.parametrize("loss", _registered_losses())
def test_every_registered_loss_resolves_as_an_omniglot_study(loss, omniglot_zip):
    """The Omniglot study of every registered loss, generated (a new loss needs no study file):
    its default space and the cpu preset resolve."""
    from mlrc.config import StudyConfig, resolve

    doc = {
        "name": f"omniglot-{loss.replace('_', '-')}",
        "dataset": {"name": "omniglot", "root": str(omniglot_zip)},
        "preset": "cpu",
        "loss": {"name": loss},
        "search": {"trials": 1, "sampler": "gp", "seed": 0},  # 1: npairs has nothing to search
        "test": {"reproductions": 3},
    }
    r = resolve(StudyConfig.model_validate(doc), f"generated omniglot study of {loss}")
    assert r.study.loss.name == loss and r.preset.trunk == "tiny_cnn"


@pytest.mark.parametrize(
    "path",
    sorted((REPO / "studies" / "reference").rglob("*.yaml")),
    ids=lambda p: f"{p.parent.name}-{p.stem}",
)
def test_every_reference_study_file_resolves(path):
    """The reference grid (roots point at the user's data: checked when run, not here); its
    contents are checked in tests/e2e/test_reference_studies.py."""
    from mlrc.config import StudyConfig, resolve

    r = resolve(StudyConfig.model_validate(yaml.safe_load(path.read_text())), str(path))
    assert r.preset.trunk == "bninception" and r.trials == 50 and r.reproductions == 10
    assert r.study.dataset.name == path.parent.name


# Preset fields of #22 (GPU efficiency and numerics) and what they do to a study's identity.
NEW_SPEED = ("checkpoint_minutes", "decoded_cache", "persistent_workers")
NEW_NUMERICS = ("tf32", "deterministic", "augment_on_device")


@pytest.mark.parametrize("preset", ["reference", "traditional", "cpu"])
def test_presets_as_before_keep_the_fingerprint_of_their_studies(preset):
    """Every fold before #22 ran on a CPU, without TF32 (unset or false), determinism flags or
    device augmentation: a study of these presets keeps the fingerprint it was stored with."""
    from mlrc.config import StudyConfig, resolve

    doc = {
        "name": "s",
        "dataset": {"name": "glyphs"},
        "preset": preset,
        "loss": {"name": "contrastive"},
    }
    if preset == "traditional":
        doc["overrides"] = {"folds": 1}
    fp = resolve(StudyConfig.model_validate(doc), "s").fingerprint()["preset"]
    assert not set(NEW_SPEED + NEW_NUMERICS) & set(fp), sorted(fp)


@pytest.mark.parametrize(
    ("field", "value"), [("tf32", True), ("deterministic", True), ("augment_on_device", True)]
)
def test_numerics_are_part_of_a_study_s_identity(field, value):
    from mlrc.config import StudyConfig, resolve

    doc = {
        "name": "s",
        "dataset": {"name": "glyphs"},
        "preset": "reference",
        "loss": {"name": "contrastive"},
        "overrides": {field: value},
    }
    assert resolve(StudyConfig.model_validate(doc), "s").fingerprint()["preset"][field] == value
    doc["overrides"] = {"checkpoint_minutes": 1.5, "decoded_cache": False}  # speed only
    assert not set(NEW_SPEED) & set(
        resolve(StudyConfig.model_validate(doc), "s").fingerprint()["preset"]
    )
