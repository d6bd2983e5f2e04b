"""Published search spaces (issue #13.3): studies/reference/<dataset>/<loss>.yaml for the 14
reality-check methods, ProxyAnchor and the three mean-field losses on CUB200, Cars196 and SOP; the
per-dataset ranges of studies/spaces/losses/<loss>.yaml; the two campaign files; and every best
hyperparameter MLRC published lies inside the range its study searches."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from mlrc import config
from mlrc.config import ConfigError, ParamSpace, StudyConfig, default_space, load_yaml, resolve
from mlrc.search.campaign_runner import load_campaign, parse_campaign, resolve_campaign

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "studies" / "reference"
CAMPAIGNS = REPO / "studies" / "campaigns"
DATASETS = ("cub200", "cars196", "sop")

# notes/protocol-and-anchors.md §1.14: the 14 methods of the reality check, as file stems
# (registry loss names; "ms-miner" = multi_similarity loss + multi_similarity miner).
REALITY_CHECK = (
    "contrastive",
    "triplet",
    "ntxent",
    "proxy_nca",
    "margin",
    "margin_per_class",
    "normalized_softmax",
    "cosface",
    "arcface",
    "fastap",
    "snr",
    "multi_similarity",
    "ms-miner",
    "soft_triple",
)
# notes/004-mean-field.md §4, Tables 7–9, in the paper's row order.
MEAN_FIELD = (
    "arcface",
    "cosface",
    "multi_similarity",
    "ms-miner",
    "proxy_nca",
    "proxy_anchor",
    "contrastive",
    "mean_field_contrastive",
    "class_wise_multi_similarity",
    "mean_field_class_wise_multi_similarity",
)
METHODS = tuple(dict.fromkeys(REALITY_CHECK + MEAN_FIELD))  # 18

# notes/protocol-and-anchors.md §1.12 "Best hyperparameters found" (= powerful-benchmarker
# docs/papers/mlrc.md, "Optimal hyperparameters"), every cell, copied as published.
PUBLISHED = """
| loss | CUB200 | Cars196 | SOP | CUB200 batch 256 |
|---|---|---|---|---|
| Contrastive pos/neg margin | −0.2000 / 0.3841 | 0.2652 / 0.5409 | 0.2850 / 0.5130 | 0.2227 / 0.7694 |
| Triplet margin | 0.0961 | 0.1190 | 0.0451 | 0.1368 |
| NTXent temperature | 0.0091 | 0.0219 | 0.0002 | 0.0415 |
| ProxyNCA proxy lr / softmax_scale | 6.04e-3 / 13.98 | 4.43e-3 / 7.97 | 5.28e-4 / 10.73 | 2.16e-1 / 10.03 |
| Margin beta lr / margin / init beta | 1.31e-3 / 0.0878 / 0.7838 | 1.11e-4 / 0.0781 / 1.3164 | 1.82e-3 / 0.0915 / 1.1072 | 1.00e-6 / 0.0674 / 0.9762 |
| Margin/class beta lr / margin / init beta | 2.65e-4 / 0.0779 / 0.9796 | 4.76e-5 / 0.0776 / 0.9598 | 7.10e-5 / 0.0518 / 0.8424 | 1.32e-2 / −0.0204 / 0.1097 |
| NormSoftmax weights lr / temperature | 4.46e-3 / 0.1087 | 1.10e-2 / 0.0886 | 5.46e-4 / 0.0630 | 7.20e-2 / 0.0707 |
| CosFace weights lr / margin / scale | 2.53e-3 / 0.6182 / 100.0 | 7.41e-3 / 0.4324 / 161.5 | 2.16e-3 / 0.3364 / 100.0 | 3.99e-3 / 0.4144 / 88.23 |
| ArcFace weights lr / margin(°) / scale | 5.13e-3 / 23.22 / 100.0 | 7.39e-6 / 20.52 / 49.50 | 2.01e-3 / 18.63 / 220.3 | 3.95e-2 / 23.14 / 78.86 |
| FastAP num_bins | 17 | 27 | 16 | 86 |
| SNR pos / neg margin / reg weight | 0.3264 / 0.8446 / 0.1382 | 0.1670 / 0.9337 / 0 | 0.3759 / 1.0831 / 0 | 0.1182 / 0.6822 / 0.4744 |
| MS alpha / beta / base | 0.01 / 50.60 / 0.56 | 14.35 / 75.83 / 0.66 | 8.49 / 57.38 / 0.41 | 0.01 / 46.85 / 0.82 |
| MS+Miner alpha / beta / base / eps | 17.97 / 75.66 / 0.77 / 0.39 | 7.49 / 47.99 / 0.63 / 0.72 | 15.94 / 156.61 / 0.72 / 0.34 | 11.63 / 55.20 / 0.85 / 0.42 |
| SoftTriple weights lr / la / gamma / reg / margin | 5.37e-5 / 78.02 / 58.95 / 0.3754 / 0.4307 | 1.40e-4 / 17.69 / 19.18 / 0.0669 / 0.3588 | 8.68e-5 / 100.00 / 47.90 / N/A / 0.3145 | 1.06e-4 / 72.12 / 51.07 / 0.4430 / 0.6959 |
"""  # noqa: E501
# Each row: its study (file stem) and the names of its cells in the study's search space. Units
# are the space's: the published values need no conversion. ArcFace's margin is in degrees in
# the PML MLRC used (0.9.9x: ``self.margin = np.radians(margin)``; its search range [0, 90]) and
# in PML 2.9, which mlrc wraps; the "lr" cells are the loss optimiser's lr (``loss_lr``); the
# Margin losses' "init beta" is ``beta`` (the learnt beta's initial value); SNR's "reg weight"
# is ``regularizer_weight``; the miner's epsilon is ``miner.epsilon``.
ROWS = {
    "Contrastive pos/neg margin": ("contrastive", ("pos_margin", "neg_margin")),
    "Triplet margin": ("triplet", ("margin",)),
    "NTXent temperature": ("ntxent", ("temperature",)),
    "ProxyNCA proxy lr / softmax_scale": ("proxy_nca", ("loss_lr", "softmax_scale")),
    "Margin beta lr / margin / init beta": ("margin", ("loss_lr", "margin", "beta")),
    "Margin/class beta lr / margin / init beta": (
        "margin_per_class",
        ("loss_lr", "margin", "beta"),
    ),
    "NormSoftmax weights lr / temperature": ("normalized_softmax", ("loss_lr", "temperature")),
    "CosFace weights lr / margin / scale": ("cosface", ("loss_lr", "margin", "scale")),
    "ArcFace weights lr / margin(°) / scale": ("arcface", ("loss_lr", "margin", "scale")),
    "FastAP num_bins": ("fastap", ("num_bins",)),
    "SNR pos / neg margin / reg weight": (
        "snr",
        ("pos_margin", "neg_margin", "regularizer_weight"),
    ),
    "MS alpha / beta / base": ("multi_similarity", ("alpha", "beta", "base")),
    "MS+Miner alpha / beta / base / eps": ("ms-miner", ("alpha", "beta", "base", "miner.epsilon")),
    "SoftTriple weights lr / la / gamma / reg / margin": (
        "soft_triple",
        ("loss_lr", "la", "gamma", "reg_weight", "margin"),
    ),
}
# The table's columns → our datasets. The batch-256 column is MLRC's supplementary CUB run at
# another batch size (and partly other ranges: notes §1.11 "CUB-256"); it has no study here.
COLUMNS = ("cub200", "cars196", "sop", None)


def published() -> list[tuple[str, str, str, float | None]]:
    """(dataset, study stem, parameter, value) for every cell of the three dataset columns;
    value None = "N/A" (not searched)."""
    out = []
    lines = PUBLISHED.strip().splitlines()[2:]  # the rows, below the header
    assert [ln.split("|")[1].strip() for ln in lines] == list(ROWS)  # every row, in order
    for line in lines:
        label, *cells = (c.strip() for c in line.strip().strip("|").split("|"))
        stem, names = ROWS[label]
        assert len(cells) == len(COLUMNS)
        for dataset, cell in zip(COLUMNS, cells, strict=True):
            values = [v.strip().replace("−", "-") for v in cell.split(" / ")]
            assert len(values) == len(names), f"{label}: {cell}"
            if dataset is None:
                continue
            for name, v in zip(names, values, strict=True):
                out.append((dataset, stem, name, None if v == "N/A" else float(v)))
    return out


def read_study(path: Path):
    """A study file validated and resolved without its dataset (roots are the user's)."""
    return resolve(StudyConfig.model_validate(load_yaml(path)), str(path))


def study_path(dataset: str, stem: str) -> Path:
    return REFERENCE / dataset / f"{stem}.yaml"


def inside(space: ParamSpace, value: float) -> bool:
    """Boundary values included; an int space takes whole numbers only."""
    if space.int_ and not float(value).is_integer():
        return False
    return space.low <= value <= space.high


# --- the files ---------------------------------------------------------------------------------


def test_the_grid_is_18_methods_on_three_datasets():
    from mlrc.methods import losses

    assert len(METHODS) == 18 and len(REALITY_CHECK) == 14 and len(MEAN_FIELD) == 10
    found = {(p.parent.name, p.stem) for p in REFERENCE.rglob("*.yaml")}
    assert found == {(d, m) for d in DATASETS for m in METHODS}
    # file stems are registry names (bar ms-miner)
    assert set(METHODS) - {"ms-miner"} <= set(losses.available())


@pytest.mark.parametrize("dataset", DATASETS)
@pytest.mark.parametrize("stem", METHODS)
def test_every_reference_file_validates(dataset, stem):
    path = study_path(dataset, stem)
    r = read_study(path)
    s = r.study
    assert s.name == f"{dataset}-{stem}" and s.dataset.name == dataset
    assert s.preset == "reference" and r.trials == 50 and r.reproductions == 10
    assert r.preset.trunk == "bninception" and s.dataset.root and s.strategy is None
    if stem == "ms-miner":
        assert s.loss.name == "multi_similarity" and s.miner.name == "multi_similarity"
    else:
        assert s.loss.name == stem and s.miner is None
    # the files rely on the space files (one place for a range): no explicit loss.search
    assert s.loss.search is None and s.loss.params == {}
    assert r.space, f"{path}: nothing searched"


def test_study_names_are_unique():
    names = [read_study(p).study.name for p in sorted(REFERENCE.rglob("*.yaml"))]
    assert len(names) == len(set(names)) == 54


@pytest.mark.parametrize(
    ("file", "name", "methods"),
    [
        ("reality-check.yaml", "reality-check", REALITY_CHECK),
        ("mean-field.yaml", "mean-field", MEAN_FIELD),
    ],
)
def test_each_paper_has_a_campaign_of_the_same_studies(file, name, methods):
    """Each campaign validates (every study resolved) and its grid is the paper's, with the
    same search spaces as the reference study files."""
    cfg = load_campaign(CAMPAIGNS / file, check_roots=False)
    plan = resolve_campaign(cfg, str(CAMPAIGNS / file))
    assert cfg.name == name and cfg.preset == "reference"
    assert [d.name for d in cfg.datasets] == list(DATASETS)
    assert [loss.label or loss.name for loss in cfg.losses] == list(methods)
    assert len(plan) == len(DATASETS) * len(methods)
    for cell, resolved in plan:
        dataset, stem = cell.column, cell.row
        ref = read_study(study_path(dataset, stem))
        assert resolved.study.name == f"{name}-{dataset}-{stem}"
        assert resolved.space == ref.space and resolved.fixed == ref.fixed
        assert (resolved.study.miner is None) == (ref.study.miner is None)
        assert (resolved.trials, resolved.reproductions) == (50, 10)


# --- the published best hyperparameters --------------------------------------------------------


def test_the_transcribed_table_has_every_cell():
    cells = published()
    per_dataset = {d: [c for c in cells if c[0] == d] for d in DATASETS}
    # 14 rows of 1–5 cells: 2+1+1+2+3+3+2+3+3+1+3+3+4+5 = 36 cells per dataset column
    assert {d: len(c) for d, c in per_dataset.items()} == dict.fromkeys(DATASETS, 36)
    assert [c for c in cells if c[3] is None] == [("sop", "soft_triple", "reg_weight", None)]


@pytest.mark.parametrize(
    ("dataset", "stem", "name", "value"),
    published(),
    ids=lambda v: str(v),
)
def test_every_published_best_value_lies_inside_its_study_space(dataset, stem, name, value):
    space = read_study(study_path(dataset, stem)).space
    if value is None:  # "N/A": MLRC did not search it there, nor does the study
        assert name not in space, f"{dataset}/{stem}: {name} is searched but MLRC did not"
        return
    assert name in space, f"{dataset}/{stem}: {name} is not searched"
    s = space[name]
    assert inside(s, value), f"{dataset}/{stem}: {name} = {value} outside [{s.low}, {s.high}]"


def test_the_check_can_fail_on_the_base_ranges():
    """Without the per-dataset entries, two SOP optima lie outside (the issue's finding), and
    the check above would fail on them."""
    assert not inside(default_space("arcface")["scale"], 220.3)
    assert not inside(default_space("multi_similarity")["beta"], 156.61)
    assert not inside(default_space("ntxent")["temperature"], 0.00001)  # Cars/SOP's lower bound
    assert inside(read_study(study_path("sop", "arcface")).space["scale"], 220.3)
    assert inside(read_study(study_path("sop", "ms-miner")).space["beta"], 156.61)


def test_mean_field_defaults_lie_inside_the_mean_field_spaces():
    """The mean-field paper publishes no optima of its MLRC runs, only the defaults "chosen
    according to the results of the Bayesian optimization" (notes/004 §3.2): MFCont (m_P, m_N) =
    (0.02, 0.3), MFCWMS (α, β, δ) = (0.01, 80, 0.8); ProxyAnchor's fixed (α, δ) = (32, 0.1)."""
    defaults = {
        "mean_field_contrastive": {"pos_margin": 0.02, "neg_margin": 0.3},
        "mean_field_class_wise_multi_similarity": {"alpha": 0.01, "beta": 80.0, "delta": 0.8},
        "proxy_anchor": {"alpha": 32.0, "margin": 0.1},
    }
    for dataset in DATASETS:
        for stem, values in defaults.items():
            space = read_study(study_path(dataset, stem)).space
            for k, v in values.items():
                assert inside(space[k], v), f"{dataset}/{stem}: {k} = {v}"


# --- per-dataset ranges in a space file --------------------------------------------------------


def test_per_dataset_ranges_apply_by_dataset_and_miner():
    def ranges(loss, dataset, miner=None):
        doc = {"name": "s", "dataset": {"name": dataset}, "loss": {"name": loss}}
        if miner:
            doc["miner"] = {"name": miner}
        r = resolve(StudyConfig.model_validate(doc), "s.yaml")
        return {k: (v.low, v.high) for k, v in r.space.items()}

    assert ranges("arcface", "sop")["scale"] == (0.01, 300.0)
    assert ranges("arcface", "cub200")["scale"] == (0.01, 200.0)
    assert ranges("multi_similarity", "cub200")["alpha"] == (0.001, 100.0)
    # with the MS miner its own table replaces the loss's: CUB alpha back to [0.01, 100]
    assert ranges("multi_similarity", "cub200", "multi_similarity")["alpha"] == (0.01, 100.0)
    assert ranges("multi_similarity", "sop", "multi_similarity")["beta"] == (0.01, 200.0)
    assert ranges("multi_similarity", "sop")["beta"] == (0.01, 100.0)
    assert "reg_weight" not in ranges("soft_triple", "sop")  # null: not searched there
    assert "reg_weight" in ranges("soft_triple", "cars196")


def test_a_study_fixing_or_searching_its_own_ranges_is_unaffected():
    doc = {"name": "s", "dataset": {"name": "sop"}, "loss": {"name": "arcface"}}
    fixed = {**doc, "loss": {"name": "arcface", "params": {"scale": 64.0}}}
    assert "scale" not in resolve(StudyConfig.model_validate(fixed), "s").space
    own = {**doc, "loss": {"name": "arcface", "search": {"scale": {"low": 1, "high": 2}}}}
    r = resolve(StudyConfig.model_validate(own), "s")
    assert (r.space["scale"].low, r.space["scale"].high) == (1.0, 2.0)


@pytest.mark.parametrize(
    "path", sorted((REPO / "studies" / "spaces" / "losses").glob("*.yaml")), ids=lambda p: p.stem
)
def test_datasets_without_entries_keep_the_base_space(path):
    """A study on a dataset a space file does not list (and so every study that existed before
    per-dataset ranges: omniglot, glyphs, …) resolves to exactly the base space, so its stored
    fingerprint still matches its unchanged file."""
    base = default_space(path.stem)
    data = yaml.safe_load(path.read_text()) or {}
    listed = set(data.get("per_dataset") or {})
    for entry in (data.get("with_miner") or {}).values():
        listed |= set((entry or {}).get("per_dataset") or {})
    assert not listed - set(DATASETS), "per-dataset ranges outside the reference datasets"
    for dataset in ("omniglot", "glyphs", "inshop", *(set(DATASETS) - listed)):
        assert default_space(path.stem, dataset=dataset) == base
        if path.stem == "multi_similarity":
            assert default_space(path.stem, dataset=dataset, miner="multi_similarity") == base
    assert base == {
        k: ParamSpace.model_validate(v)
        for k, v in data.items()
        if k not in ("per_dataset", "with_miner")
    }


def space_file(tmp_path: Path, monkeypatch, text: str) -> Path:
    """A loss space file in a stand-in studies/spaces/losses/ folder."""
    monkeypatch.setattr(config.spaces, "LOSS_SPACES_DIR", tmp_path)
    path = tmp_path / "arcface.yaml"
    path.write_text("scale: {low: 0.01, high: 200.0}\nmargin: {low: 0, high: 90}\n" + text)
    return path


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "per_dataset: {sopp: {scale: {low: 0.01, high: 300}}}",
            "per_dataset.sopp: unknown dataset 'sopp'; did you mean 'sop'?",
        ),
        (
            "per_dataset: {sop: {scal: {low: 0.01, high: 300}}}",
            "per_dataset.sop.scal: not a parameter of this space; did you mean 'scale'? "
            "(parameters: scale, margin)",
        ),
        (
            "per_dataset: {sop: {scale: {low: 300, high: 0.01}}}",
            "per_dataset.sop.scale: low (300.0) > high (0.01)",
        ),
        (
            "per_dataset: {sop: {scale: {lo: 1, high: 2}}}",
            "per_dataset.sop.scale: unknown key 'lo'",
        ),
        ("per_dataset: [sop]", "per_dataset: expected a mapping of dataset"),
        (
            "per_dataset: {sop: 3}",
            "per_dataset.sop: expected a mapping of parameter ranges, got int",
        ),
        (
            "with_miner: {multi_similarityy: {per_dataset: {}}}",
            "with_miner.multi_similarityy: unknown miner 'multi_similarityy'; "
            "did you mean 'multi_similarity'?",
        ),
        (
            "with_miner: {multi_similarity: {per_datset: {}}}",
            "with_miner.multi_similarity.per_datset: unknown key; did you mean 'per_dataset'?",
        ),
        (
            "with_miner: {multi_similarity: {per_dataset: {cub: {}}}}",
            "with_miner.multi_similarity.per_dataset.cub: unknown dataset 'cub'",
        ),
    ],
)
def test_a_mistake_in_a_per_dataset_table_is_one_line_naming_file_and_key(
    tmp_path, monkeypatch, text, message
):
    path = space_file(tmp_path, monkeypatch, text)
    with pytest.raises(ConfigError) as err:
        default_space("arcface", tmp_path)  # checked even without a dataset
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value)
    assert "\n" not in str(err.value)


def test_a_per_dataset_table_applies_in_a_stand_in_folder(tmp_path, monkeypatch):
    space_file(
        tmp_path, monkeypatch, "per_dataset: {sop: {scale: {low: 0.01, high: 300}, margin: null}}"
    )
    assert default_space("arcface", tmp_path, dataset="sop") == {
        "scale": ParamSpace(low=0.01, high=300.0)
    }
    assert default_space("arcface", tmp_path, dataset="cub200")["scale"].high == 200.0


def test_miner_and_strategy_spaces_take_no_per_dataset_table(tmp_path):
    path = tmp_path / "multi_similarity.yaml"
    path.write_text("epsilon: {low: 0, high: 1}\nper_dataset: {sop: {}}\n")
    with pytest.raises(ConfigError, match=re.escape(f"{path}: per_dataset: only a loss's space")):
        default_space("multi_similarity", tmp_path)


# --- a campaign loss item with its own miner ---------------------------------------------------


def test_a_campaign_loss_item_can_carry_its_own_miner():
    doc = {
        "name": "camp",
        "datasets": [{"name": "sop"}],
        "losses": [
            "multi_similarity",
            {
                "name": "multi_similarity",
                "miner": {"name": "multi_similarity"},
                "label": "ms-miner",
            },
        ],
        "preset": "reference",
    }
    plan = dict((c.name, r) for c, r in resolve_campaign(parse_campaign(doc, check_roots=False)))
    plain, mined = plan["camp-sop-multi_similarity"], plan["camp-sop-ms-miner"]
    assert plain.study.miner is None and mined.study.miner.name == "multi_similarity"
    assert plain.space["beta"].high == 100.0 and mined.space["beta"].high == 200.0
    assert "miner.epsilon" in mined.space and "miner" not in mined.study.loss.model_dump()
    bad = {
        **doc,
        "losses": [{"name": "mean_field_contrastive", "miner": {"name": "multi_similarity"}}],
    }
    with pytest.raises(ConfigError) as err:
        resolve_campaign(parse_campaign(bad, "c.yaml", check_roots=False), "c.yaml")
    assert str(err.value).startswith("c.yaml: losses.0.miner: loss 'mean_field_contrastive' does")
