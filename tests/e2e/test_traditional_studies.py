"""studies/traditional/ (issue #16 point 3): the seed papers' own headline settings as study
files — Proxy Anchor, DAS, Metrix and the mean-field paper on CUB200, Cars196 and SOP, with the
``traditional`` preset, every hyperparameter fixed (nothing searched).

Each file must resolve with :func:`mlrc.config.load_study`, be a traditional study (one fold,
512-D) with an empty search space, and carry the papers' numbers. The numbers are checked
against an INDEPENDENT reference: they are parsed out of the paper notes (the README command
table of Proxy Anchor, the DAS supplement's training settings and run scripts, Metrix's Appendix
B.1, the mean-field paper's traditional protocol), never restated here. The notes' sections are
copied verbatim into tests/fixtures/reference/ (each file names its note, paper and sections, and
which of the two it followed), so the checks run in any clone; where ../shared/notes is beside
the clone (always in CI), a test checks that every copied block still is the note's text."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import yaml
from conftest import REPO, require

from mlrc.config import StudyConfig, load_study, load_yaml, resolve

TRADITIONAL = REPO / "studies" / "traditional"
REFERENCE = REPO / "tests" / "fixtures" / "reference"  # verbatim extracts of the paper notes
NOTES = REPO.parent / "shared" / "notes"  # the notes themselves: beside a developer's clone, CI
VERBATIM = re.compile(
    r"^<!-- verbatim: ([\w.-]+), (.+?) -->\n(.*?)\n<!-- end verbatim -->$", re.M | re.S
)
DATASETS = ("cub200", "cars196", "sop")
METHODS = ("proxy_anchor", "das", "metrix", "mean_field")
FILES = [(d, m) for d in DATASETS for m in METHODS]
IDS = [f"{d}/{m}" for d, m in FILES]


# --- the independent reference: the paper notes ------------------------------------------------


def extracts(name: str) -> list[tuple[str, str, str]]:
    """The verbatim blocks of fixture ``name``: (note file, section, text)."""
    text = (REFERENCE / name).read_text(encoding="utf-8")
    return [m.groups() for m in VERBATIM.finditer(text)]


def note(name: str) -> str:
    """The sections of note ``name`` that the fixture copies (only the copied text, none of the
    fixture's own words), in the note's order."""
    blocks = extracts(name)
    assert blocks and all(src == name for src, _, _ in blocks), f"{name}: no extract of {name}"
    return "\n\n".join(text for _, _, text in blocks)


def find(pattern: str, text: str, where: str, flags: int = 0) -> re.Match:
    """``pattern`` in ``text``; a literal space also matches a line break (notes wrap)."""
    m = re.search(pattern.replace(" ", r"\s+"), text, flags)
    assert m is not None, f"{where}: pattern {pattern!r} not found (did the note change?)"
    return m


def num(s: str) -> float:
    return float(s.replace(",", ""))


def train_images() -> dict[str, int]:
    """Training images per dataset: note 001 §2's split table (the Proxy Anchor paper, §4.1),
    cross-checked against note 004 §3.3's (the mean-field paper, §4.1)."""
    pa, mf = note("001-proxy-anchor.md"), note("004-mean-field.md")
    out = {}
    for ds, row in (("cub200", "CUB-200-2011"), ("cars196", "Cars-196"), ("sop", "SOP")):
        cells = find(rf"^\| {re.escape(row)} \|([^|]*)\|", pa, "note 001 §2", re.M).group(1)
        n = int(num(find(r"([\d,]+) images", cells, f"note 001 §2 {row}").group(1)))
        mf_row = find(rf"^\| {re.escape(row)} \|[^|]*\|([^|]*)\|", mf, "note 004 §3.3", re.M)
        n_mf = int(num(find(r"([\d,]+) images", mf_row.group(1), f"note 004 {row}").group(1)))
        assert n == n_mf, f"{row}: note 001 says {n} training images, note 004 {n_mf}"
        out[ds] = n
    return out


def proxy_anchor_reference() -> dict[str, dict]:
    """Note 001: §2.1's README command table (BN-Inception, d=512) and §2's protocol table."""
    text = note("001-proxy-anchor.md")
    rows = re.findall(
        r"^\s*\| (CUB|Cars|SOP) \| (\d+) \| ([\d.e-]+) \| (\d+) \| (\d) \| (\d+) \| ([\d.]+)",
        text,
        re.M,
    )
    assert {r[0] for r in rows} == {"CUB", "Cars", "SOP"}, rows
    epochs = find(
        r"CUB, Cars: \*\*(\d+) epochs, initial lr ([\d.e-]+)\*\*\. "
        r"SOP, In-Shop: \*\*(\d+) epochs, initial lr ([\d.e-]+)\*\*",
        text,
        "note 001 §2 LR / epochs",
    )
    factor = num(find(r"\| Proxy LR \| \*\*(\d+)×\*\*", text, "note 001 §2 proxy lr").group(1))
    alpha, delta = find(r"\*\*α = (\d+), δ = ([\d.]+)\*\*", text, "note 001 §2").groups()
    wd = num(find(r"AdamW `weight_decay = ([\d.e-]+)`", text, "note 001 §2.1").group(1))
    find(r"\| Batch sampling \| \*\*Random\*\* batches", text, "note 001 §2 batch sampling")
    find(r"keeps the epoch with the best\s+test Recall@1", text, "note 001 §2.1 model selection")
    find(r"README commands \(BN-Inception, d=512\)", text, "note 001 §2.1")
    out = {}
    for name, batch, lr, warm, bn_freeze, step, gamma in rows:
        ds = {"CUB": "cub200", "Cars": "cars196", "SOP": "sop"}[name]
        paper_epochs, paper_lr = (
            (epochs.group(3), epochs.group(4)) if ds == "sop" else epochs.group(1, 2)
        )
        assert num(lr) == num(paper_lr), f"{name}: README lr {lr} ≠ paper's {paper_lr}"
        out[ds] = {
            "batch": int(batch),
            "lr": num(lr),
            "warm": int(warm),
            "bn_freeze": bool(int(bn_freeze)),
            "step": int(step),
            "gamma": num(gamma),
            "epochs": int(paper_epochs),
            "loss_lr": factor * num(lr),
            "alpha": num(alpha),
            "delta": num(delta),
            "weight_decay": wd,
        }
    return out


def das_reference() -> dict[str, dict]:
    """Note 002: §4.1 (supplement §C training settings), §1.7 (table1.sh), §2.1 (MS values)."""
    text = note("002-das.md")
    opt = find(
        r"\| Optimiser \| \*\*Adam\*\*, initial lr \*\*([\d.e-]+)\*\*, multiplied by "
        r"\*\*([\d.]+) at epochs (\d+) and (\d+)\*\*, weight decay \*\*([\d.e-]+)\*\*",
        text,
        "note 002 §4.1 optimiser",
    )
    epochs = int(find(r"\| Epochs \| \*\*(\d+)\*\*", text, "note 002 §4.1 epochs").group(1))
    spc, batch = find(
        r"\*\*SPC-(\d)\*\*.*?\*\*batch size (\d+)\*\*", text, "note 002 §4.1 batch"
    ).groups()
    script = find(
        r"--n_epochs (\d+) --tau (\d+) (\d+) --bs (\d+) --samples_per_class (\d+)",
        text,
        "note 002 §1.7 run scripts",
    )
    assert (int(script.group(1)), int(script.group(4)), int(script.group(5))) == (
        epochs,
        int(batch),
        int(spc),
    ), "note 002: the run scripts and the supplement disagree"
    assert [int(script.group(2)), int(script.group(3))] == [int(opt.group(3)), int(opt.group(4))]
    T, Z = find(r"T = (\d+) \(code default\), Z = (\d+) \(code default\)", text, "§1.7").groups()
    small = find(
        r"Table 1 \(MS, IBN512/R512\), CUB and CARS: `--das_dfs_num_scale (\d+)` \(K = \d+\), "
        r"scale range \[([\d.]+), ([\d.]+)\],\s+`--das_mts_scale ([\d.]+)`",
        text,
        "note 002 §1.7 Table 1 CUB/CARS",
    )
    sop = find(
        r"Table 1, SOP: K = (\d+), scale range \*\*\[([\d.]+), ([\d.]+)\]\*\* \(code default\),"
        r"\s+`--das_mts_scale ([\d.]+)`",
        text,
        "note 002 §1.7 Table 1 SOP",
    )
    ms = find(r"\*\*α = (\d+), β = (\d+), λ = ([\d.]+), ε = ([\d.]+)\*\*", text, "§2.1").groups()
    find(r"\| \*\*MS \+ DAS \(K=8\)\*\* \| IBN512 \|", text, "note 002 §5.4 Table 1")
    common = {
        "lr": num(opt.group(1)),
        "gamma": num(opt.group(2)),
        "milestones": [int(opt.group(3)), int(opt.group(4))],
        "weight_decay": num(opt.group(5)),
        "epochs": epochs,
        "batch": int(batch),
        "spc": int(spc),
        "T": int(T),
        "Z": int(Z),
        "ms": tuple(num(v) for v in ms),
    }
    out = {}
    for ds, m in (("cub200", small), ("cars196", small), ("sop", sop)):
        out[ds] = {
            **common,
            "K": int(m.group(1)),
            "scale": (num(m.group(2)), num(m.group(3))),
            "r_b": num(m.group(4)),
        }
    return out


def metrix_reference() -> dict[str, dict]:
    """Note 003: §5 (App. B.1, Table 4), §1.4 (MS values), §2–3 (Metrix values)."""
    text = note("003-metrix.md")
    epochs, batch, wd = find(
        r"\*\*AdamW\*\*, \*\*(\d+) epochs\*\*, \*\*batch size (\d+)\*\*, "
        r"weight decay \*\*([\d.e-]+)\*\*",
        text,
        "note 003 §5 optimiser",
    ).groups()
    lrs = find(
        r"CUB200 \*\*([\d.e-]+)\*\*, Cars196 \*\*([\d.e-]+)\*\*, SOP \*\*([\d.e-]+)\*\*",
        text,
        "note 003 §5 learning rates",
    ).groups()
    gamma_small = find(
        r"×\*\*[\d.]+\*\* for Contrastive, ×\*\*([\d.]+)\*\* for MS and PA", text, "§5"
    )
    gamma_sop = find(r"SOP and In-Shop: ×\*\*([\d.]+)\*\* for all losses", text, "note 003 §5")
    find(r"The decay schedule \(step epochs\) is not given", text, "note 003 §5")
    find(r"CUB200 and Cars196: \*\*random\*\* sampling", text, "note 003 §5 sampling")
    classes, per_class = find(
        r"\*\*(\d+) classes × (\d+) samples per class\*\*", text, "note 003 §5 sampling"
    ).groups()
    ms = find(r"\*\*β = (\d+), γ = (\d+), m = ([\d.]+)\*\*", text, "note 003 §1.4").groups()
    w = num(find(r"with weight \*\*w = ([\d.]+)\*\*", text, "note 003 §0").group(1))
    a, a2 = find(r"λ ~ Beta\((\d+), (\d+)\)", text, "note 003 §0").groups()
    assert a == a2
    find(r"The default is \*\*feature mixup\*\*", text, "note 003 §0")
    find(r"\*\*Backbone\*\*: ResNet-50", text, "note 003 §5")
    dim = int(find(r"FC layer to d = (\d+)", text, "note 003 §5").group(1))
    common = {
        "epochs": int(epochs),
        "batch": int(batch),
        "weight_decay": num(wd),
        "ms": tuple(num(v) for v in ms),
        "w": w,
        "a": num(a),
        "dim": dim,
    }
    return {
        "cub200": {**common, "lr": num(lrs[0]), "gamma": num(gamma_small.group(1))},
        "cars196": {**common, "lr": num(lrs[1]), "gamma": num(gamma_small.group(1))},
        "sop": {
            **common,
            "lr": num(lrs[2]),
            "gamma": num(gamma_sop.group(1)),
            "balanced": (int(classes), int(per_class)),
        },
    }


def mean_field_reference() -> dict:
    """Note 004 §3.2: the traditional protocol of Tables 2–3 (the paper's §4.2)."""
    text = note("004-mean-field.md")
    epochs, patience = find(
        r"\| Epochs \| Up to \*\*(\d+)\*\*, with \*\*early stopping patience (\d+)\*\*",
        text,
        "note 004 §3.2 epochs",
    ).groups()
    dim = int(find(r"\| Embedding \| \*\*(\d+)-D\*\*", text, "note 004 §3.2").group(1))
    batch = int(find(r"\| Batch size \| \*\*(\d+)\*\*", text, "note 004 §3.2").group(1))
    lr, mf_lr = find(
        r"\| Optimizer \| \*\*AdamW\*\*\. Embedding model lr \*\*([\d.e-]+)\*\*\. "
        r"\*\*Proxy lr [\d.e-]+\*\* \(100×\)\. \*\*Mean-field lr ([\d.e-]+)\*\*",
        text,
        "note 004 §3.2 optimiser",
    ).groups()
    loss = find(
        r"MFCWMS \(α, β, δ, λ_MF\) = \(([\d.]+), (\d+), ([\d.]+), (\d+)\)", text, "§3.2"
    ).groups()
    repeats = int(find(r"Procedure repeated \*\*(\d+) times\*\*", text, "§3.2").group(1))
    find(r"the test embedding with the best MAP@R", text, "note 004 §3.2 selection")
    find(r"\*\*Backbone\*\*: BN-Inception", text, "note 004 §3")
    return {
        "epochs": int(epochs),
        "patience": int(patience),
        "dim": dim,
        "batch": batch,
        "lr": num(lr),
        "loss_lr": num(mf_lr),
        "loss": tuple(num(v) for v in loss),
        "repeats": repeats,
    }


# --- the files ---------------------------------------------------------------------------------


def study_file(dataset: str, method: str) -> Path:
    return TRADITIONAL / dataset / f"{method}.yaml"


def loaded(dataset: str, method: str, tmp_path: Path):
    """The file through :func:`load_study`, its dataset root pointed at an existing folder (the
    committed roots are the user's, e.g. /data/CUB_200_2011)."""
    doc = load_yaml(study_file(dataset, method))
    root = tmp_path / "dataset"
    root.mkdir(exist_ok=True)
    doc["dataset"]["root"] = str(root)
    path = tmp_path / f"{method}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return load_study(path)


def close(a: float, b: float) -> bool:
    return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)


def test_the_grid_is_four_methods_on_three_datasets():
    on_disk = sorted(str(p.relative_to(TRADITIONAL)) for p in TRADITIONAL.rglob("*.yaml"))
    assert on_disk == sorted(f"{d}/{m}.yaml" for d, m in FILES)


@pytest.mark.parametrize(("dataset", "method"), FILES, ids=IDS)
def test_each_file_loads_as_a_traditional_study_with_nothing_searched(dataset, method, tmp_path):
    r = loaded(dataset, method, tmp_path)
    assert r.study.name == f"traditional-{dataset}-{method}"
    assert r.study.preset == "traditional" and r.study.dataset.name == dataset
    assert r.preset.split_scheme == "traditional" and r.preset.folds == 1
    assert r.preset.embedding_size == 512
    assert r.space == {} and r.trials == 1  # nothing searched
    for part in (r.study.loss, r.study.miner, r.study.strategy):
        assert part is None or part.search == {}, "search: {} — not the default space file"
    assert r.preset.validate_every["default"] == 1  # the test half after every epoch
    assert r.reproductions == 10
    # SOP: the dataset's own Ebay_train/Ebay_test lists; CUB/Cars: the first/second half
    assert (r.split.test if r.split else None) == ("predefined" if dataset == "sop" else None)
    # the committed file itself validates too (without its dataset)
    resolve(
        StudyConfig.model_validate(load_yaml(study_file(dataset, method))),
        str(study_file(dataset, method)),
    )


@pytest.mark.parametrize(("dataset", "method"), FILES, ids=IDS)
def test_every_number_carries_a_comment(dataset, method):
    """Every line with a number (but names and paths) says where the number comes from."""
    for i, line in enumerate(study_file(dataset, method).read_text().splitlines(), 1):
        code = line.split("#", 1)[0]
        key, _, value = code.partition(":")
        if key.strip() in ("name", "root") or not re.search(r"\d", value):
            continue
        assert "#" in line, f"{dataset}/{method}.yaml:{i}: a number without its source: {line}"


@pytest.mark.parametrize(("dataset", "method"), FILES, ids=IDS)
def test_one_epoch_is_one_pass_over_the_training_images(dataset, method):
    r = resolve(
        StudyConfig.model_validate(load_yaml(study_file(dataset, method))),
        str(study_file(dataset, method)),
    )
    n = train_images()[dataset]
    assert r.preset.iterations_per_epoch == n // r.preset.batch.size


@pytest.mark.parametrize("dataset", DATASETS)
def test_proxy_anchor_is_the_readme_command_and_the_paper(dataset, tmp_path):
    ref = proxy_anchor_reference()[dataset]
    r = loaded(dataset, "proxy_anchor", tmp_path)
    p = r.preset
    assert r.study.loss.name == "proxy_anchor" and r.study.miner is None
    assert r.study.strategy is None
    assert close(r.fixed["alpha"], ref["alpha"]) and close(r.fixed["margin"], ref["delta"])
    assert close(r.fixed["loss_lr"], ref["loss_lr"])  # proxies: 100 × the base lr
    assert p.trunk == "bninception"
    assert p.batch.size == ref["batch"]
    assert (p.optimizer.name, p.loss_optimizer.name) == ("adamw", "adamw")
    assert close(p.optimizer.lr, ref["lr"])
    assert close(p.optimizer.weight_decay, ref["weight_decay"])
    assert close(p.loss_optimizer.weight_decay, ref["weight_decay"])
    assert p.lr_schedule is not None and p.lr_schedule.milestones is None
    assert p.lr_schedule.step_size == ref["step"] and close(p.lr_schedule.gamma, ref["gamma"])
    assert p.warmup_epochs == ref["warm"]
    assert p.freeze_batchnorm is ref["bn_freeze"]
    assert p.max_epochs == ref["epochs"]
    assert p.per_dataset("patience", dataset) >= p.max_epochs  # no early stopping
    assert r.study.sampler.name == "shuffle"  # random batches
    assert p.selection_metric == "precision_at_1"  # best test Recall@1
    assert (p.image.crop, p.image.scale) == (224, (0.08, 1.0))  # RandomResizedCrop(224)


@pytest.mark.parametrize("dataset", DATASETS)
def test_das_is_table_1_ms_plus_das_k8_on_ibn512(dataset, tmp_path):
    ref = das_reference()[dataset]
    r = loaded(dataset, "das", tmp_path)
    p, f = r.preset, r.fixed
    assert r.study.loss.name == "multi_similarity"
    assert r.study.miner is not None and r.study.miner.name == "multi_similarity"
    assert r.study.strategy is not None and r.study.strategy.name == "das"
    alpha, beta, lam, eps = ref["ms"]
    assert close(f["alpha"], alpha) and close(f["beta"], beta) and close(f["base"], lam)
    assert close(f["miner.epsilon"], eps)
    assert (f["strategy.T"], f["strategy.K"], f["strategy.Z"]) == (ref["T"], ref["K"], ref["Z"])
    assert close(f["strategy.r_b"], ref["r_b"])
    lo, hi = ref["scale"]
    r_s = f["strategy.r_s"]
    if dataset == "sop":  # [0.5, 2.0] is not symmetric: the file keeps its lower end
        assert close(1 - r_s, lo) and 1 + r_s < hi
    else:
        assert close(1 - r_s, lo) and close(1 + r_s, hi)
    assert f["strategy.normalize"] is True
    assert p.trunk == "bninception"
    assert p.batch.size == ref["batch"] and r.study.sampler.name == "m_per_class"
    assert p.batch.images_per_class == {"pair": ref["spc"], "class": ref["spc"]}  # SPC-2
    assert p.optimizer.name == "adam" and close(p.optimizer.lr, ref["lr"])
    assert close(p.optimizer.weight_decay, ref["weight_decay"])
    assert p.lr_schedule is not None and p.lr_schedule.milestones == ref["milestones"]
    assert close(p.lr_schedule.gamma, ref["gamma"])
    assert p.max_epochs == ref["epochs"] and p.warmup_epochs == 0
    assert p.per_dataset("patience", dataset) >= p.max_epochs
    assert p.selection_metric == "precision_at_1"


@pytest.mark.parametrize("dataset", DATASETS)
def test_metrix_is_table_2_ms_plus_metrix_feature(dataset, tmp_path):
    ref = metrix_reference()[dataset]
    r = loaded(dataset, "metrix", tmp_path)
    p, f = r.preset, r.fixed
    assert r.study.loss.name == "multi_similarity" and r.study.miner is None
    assert r.study.strategy is not None and r.study.strategy.name == "metrix"
    beta, gamma, m = ref["ms"]  # the paper's β (positives), γ (negatives), m = PML's
    assert close(f["alpha"], beta) and close(f["beta"], gamma) and close(f["base"], m)
    assert f["strategy.mixup"] == "feature" and f["strategy.pairs"] == "random"
    assert close(f["strategy.w"], ref["w"]) and close(f["strategy.a"], ref["a"])
    assert p.trunk == "resnet50" and p.embedding_size == ref["dim"]
    assert p.batch.size == ref["batch"]
    assert p.optimizer.name == "adamw" and close(p.optimizer.lr, ref["lr"])
    assert close(p.optimizer.weight_decay, ref["weight_decay"])
    assert p.lr_schedule is not None and close(p.lr_schedule.gamma, ref["gamma"])
    assert p.lr_schedule.step_size is not None  # the step is not given: the file's choice
    assert p.max_epochs == ref["epochs"]
    assert p.per_dataset("patience", dataset) >= p.max_epochs
    if dataset == "sop":  # balanced: 20 classes × 5 images
        classes, per_class = ref["balanced"]
        assert r.study.sampler.name == "m_per_class"
        assert p.batch.images_per_class["pair"] == per_class  # MS is a pair loss
        assert p.batch.size // per_class == classes
    else:
        assert r.study.sampler.name == "shuffle"  # random sampling
    assert p.selection_metric == "precision_at_1"


@pytest.mark.parametrize("dataset", DATASETS)
def test_mean_field_is_the_traditional_protocol_of_tables_2_and_3(dataset, tmp_path):
    ref = mean_field_reference()
    r = loaded(dataset, "mean_field", tmp_path)
    p, f = r.preset, r.fixed
    assert r.study.loss.name == "mean_field_class_wise_multi_similarity"
    assert r.study.miner is None and r.study.strategy is None
    alpha, beta, delta, lambda_mf = ref["loss"]
    assert close(f["alpha"], alpha) and close(f["beta"], beta)
    assert close(f["delta"], delta) and close(f["lambda_mf"], lambda_mf)
    assert close(f["loss_lr"], ref["loss_lr"])  # the mean fields' lr
    assert p.trunk == "bninception" and p.embedding_size == ref["dim"]
    assert p.batch.size == ref["batch"]
    assert (p.optimizer.name, p.loss_optimizer.name) == ("adamw", "adamw")
    assert close(p.optimizer.lr, ref["lr"])
    assert p.max_epochs == ref["epochs"]
    assert p.per_dataset("patience", dataset) == ref["patience"]
    assert r.reproductions == ref["repeats"]
    assert p.selection_metric == "map_at_r"  # the best test MAP@R


FIXTURES = sorted(p.name for p in REFERENCE.glob("*.md") if p.name != "README.md")


def test_the_reference_is_the_four_papers_notes():
    assert FIXTURES == ["001-proxy-anchor.md", "002-das.md", "003-metrix.md", "004-mean-field.md"]
    for name in FIXTURES:
        head = (REFERENCE / name).read_text(encoding="utf-8").split("<!-- verbatim:", 1)[0]
        for source in ("**Note**", "**Paper**", "**Note against paper**", "shared/seeds/"):
            assert source in head, f"{name}: its header does not name {source}"


@pytest.mark.parametrize("name", FIXTURES)
def test_the_extracts_are_verbatim(name):
    """Every block of the fixture is the note's own text, character for character (whole
    lines); a note that changed fails here, naming the section to copy again."""
    path = NOTES / name
    require(
        path.is_file(),
        f"{path} is missing: the paper notes (../shared/notes) that the "
        "fixtures in tests/fixtures/reference copy",
    )
    lines = path.read_text(encoding="utf-8").split("\n")
    for _, section, text in extracts(name):
        block = text.split("\n")
        starts = [i for i, line in enumerate(lines) if line == block[0]]
        assert any(lines[i : i + len(block)] == block for i in starts), (
            f"tests/fixtures/reference/{name}: the block {section!r} is not verbatim in "
            f"{path} any more; copy that section again"
        )


def test_the_readme_lists_every_file():
    readme = (TRADITIONAL / "README.md").read_text(encoding="utf-8")
    for dataset, method in FILES:
        assert f"{dataset}/{method}.yaml" in readme
