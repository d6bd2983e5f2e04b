"""Bad input for one trial across several processes (``processes_per_trial``,
``--procs-per-trial``, ``--devices``): one line, exit 2, before anything is stored or trained."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mlrc.config import ConfigError, StudyConfig, load_yaml, resolve
from mlrc.config.ranks import check_ranks

from .conftest import invoke, message_of


def study(tmp: Path, *, loss: str = "contrastive", over: dict | None = None, **extra) -> Path:
    doc = {
        "name": "ranks-bad",
        "dataset": {"name": "glyphs"},
        "preset": "cpu",
        "loss": {"name": loss},
        "search": {"trials": 1},
        "overrides": {"iterations_per_epoch": 2, "max_epochs": 1, **(over or {})},
        **extra,
    }
    path = tmp / "study.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def one_line(args: list, tmp: Path) -> str:
    """``mlrc ARGS``: exit 2 with one ``error:`` line (returned without the prefix), nothing
    stored."""
    db = tmp / "store.sqlite"
    result = invoke([*args, "--storage", f"sqlite:///{db}", "--artifacts", tmp / "art"])
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert "Traceback" not in result.output
    if db.exists():  # the tables may exist; no study may be registered
        import sqlite3

        with sqlite3.connect(db) as c:
            assert c.execute("select count(*) from mlrc_study").fetchone() == (0,)
    return lines[0].removeprefix("error: ")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["--procs-per-trial", "3"],
            "--procs-per-trial: batch.size 32 does not split into 3 processes per trial as whole "
            "classes of 4 image(s) each (needs a multiple of 12)",
        ),
        (
            ["--procs-per-trial", "4", "--devices", "cpu,cpu"],
            "4 processes per trial need 4 devices, but --devices names 2 (cpu,cpu)",
        ),
        (
            ["--procs-per-trial", "2", "--devices", "gpu7,cpu"],
            "--device gpu7: not a device (cpu, cuda, cuda:N or mps)",
        ),
    ],
    ids=["batch-does-not-split", "fewer-devices", "not-a-device"],
)
def test_study_run_refuses_in_one_line(tmp_path, args, expected):
    path = study(tmp_path)
    assert one_line(["study", "run", path, *args], tmp_path) == expected


def test_a_fold_with_fewer_classes_than_a_batch_is_refused_before_registering(tmp_path):
    """proxy_anchor's batch is 64 classes × 1 here; fold 0 of glyphs trains on 42 classes, so
    the sampler would draw 42 images, which 4 ranks cannot share: refused on the split."""
    path = study(
        tmp_path, loss="proxy_anchor", over={"batch": {"size": 64}, "processes_per_trial": 4}
    )
    msg = one_line(["study", "run", path, "--procs-per-trial", "4"], tmp_path)
    assert msg.startswith("processes per trial: fold 0 trains on 42 classes, so its batches are")
    assert "42 classes × 1 = 42 images" in msg and "multiple of 4" in msg


@pytest.mark.parametrize(("file_k", "flag_k"), [(2, 1), (1, 2), (2, 4)])
def test_another_k_than_the_study_s_is_refused_with_random_crops(tmp_path, file_k, flag_k):
    """#37, finding 3: each rank draws its crops from its own stream, so K processes compute
    other numbers than the study's own processes_per_trial; refused in one line, before
    anything is stored, on `study run` and on a pool worker."""
    path = study(tmp_path, over={"processes_per_trial": file_k})
    for command in ("study", "run"), ("worker",):
        msg = one_line([*command, path, "--procs-per-trial", str(flag_k)], tmp_path)
        assert msg == (
            f"--procs-per-trial {flag_k}: study 'ranks-bad' trains with random augmentation, "
            f"which each process draws from its own stream, so {flag_k} processes compute other "
            f"numbers than its processes_per_trial: {file_k}; set processes_per_trial in the "
            "study file (another study) or leave out --procs-per-trial"
        )


def test_without_random_augmentation_any_k_is_the_same_study(tmp_path):
    from mlrc.search.session import rank_plan

    fixed = {"image": {"resize": 36, "crop": 32, "scale": [1.0, 1.0], "ratio": [1.0, 1.0],
                       "flip": False}}  # fmt: skip
    path = study(tmp_path, over={**fixed, "processes_per_trial": 2})
    resolved = resolve(StudyConfig.model_validate(load_yaml(path)), str(path))
    assert rank_plan(resolved, "cpu", 1) == ()
    assert rank_plan(resolved, "cpu", 4) == ("cpu",) * 4


def test_a_worker_cannot_pack_multi_process_trials(tmp_path):
    path = study(tmp_path)
    msg = one_line(["worker", path, "--procs-per-trial", "2", "--per-gpu", "2"], tmp_path)
    assert msg == "--per-gpu packs one-process trials on one GPU; it cannot pack --procs-per-trial"


def test_ray_cannot_split_a_fold_s_ranks_over_fold_tasks(tmp_path):
    path = study(tmp_path)
    args = ["study", "run", path, "--backend", "ray", "--fold-parallel", "--procs-per-trial", "2"]
    msg = one_line(args, tmp_path)
    assert (
        msg
        == "--procs-per-trial 2: a fold's ranks need the trial's resources; drop --fold-parallel"
    )


@pytest.mark.parametrize(
    "strategy",
    [
        {"name": "metrix", "params": {"mixup": "input"}},
        {"name": "metrix", "search": {"mixup": {"choices": ["embedding", "feature"]}}},
    ],
    ids=["fixed-input-mixup", "searched-feature-mixup"],
)
def test_metrix_image_mixup_is_refused_for_several_processes(tmp_path, strategy):
    path = study(tmp_path, over={"processes_per_trial": 2}, strategy=strategy)
    with pytest.raises(ConfigError, match="metrix mixup '(input|feature)' mixes the images"):
        resolve(StudyConfig.model_validate(load_yaml(path)), str(path))
    ok = study(tmp_path, over={"processes_per_trial": 2}, strategy={"name": "metrix"})
    resolve(StudyConfig.model_validate(load_yaml(ok)), str(ok))  # embedding mixup: accepted


def test_the_preset_field_is_checked_like_the_option(tmp_path):
    path = study(tmp_path, over={"processes_per_trial": 5})
    result = invoke(["study", "run", path, "--storage", f"sqlite:///{tmp_path / 's.db'}"])
    assert result.exit_code == 2
    msg = message_of(result.output.strip(), path)
    assert msg.startswith("processes_per_trial: batch.size 32 does not split into 5 processes")
    for bad in (0, -1):
        with pytest.raises(ConfigError, match="processes_per_trial"):
            p = study(tmp_path, over={"processes_per_trial": bad})
            resolve(StudyConfig.model_validate(load_yaml(p)), str(p))


def test_check_ranks_counts_whole_classes_per_rank(tmp_path):
    """A direct check of the rule against hand-computed cases: B = 32, m = 4 (contrastive)."""
    path = study(tmp_path)
    r = resolve(StudyConfig.model_validate(load_yaml(path)), str(path))
    for k in (1, 2, 4, 8):  # 32 = 8 classes × 4: 8/k whole classes per rank
        check_ranks(r, k, "x", [8, 20])
    for k in (3, 16):
        with pytest.raises(ConfigError):
            check_ranks(r, k, "x")
    with pytest.raises(ConfigError, match="fold 1 trains on 6 classes"):
        check_ranks(r, 4, "x", [8, 6])  # 6 classes × 4 = 24 images: 6 classes do not split in 4
    check_ranks(r, 2, "x", [8, 6])  # 3 whole classes per rank
