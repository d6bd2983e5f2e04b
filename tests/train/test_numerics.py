"""A fold's numerics and their record (issue #22, point 5): the preset's ``tf32`` and
``deterministic`` applied to torch (read back through torch's own getters), the provenance of a
fold (the CPU model checked against ``/proc/cpuinfo`` read here), its round trip through
``last.pt`` adoption, and what ``study status`` and the report say of fold runs recorded by hand
through the store API (GPU fold runs written as a GPU machine would record them)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from mlrc import store
from mlrc.cli import app
from mlrc.config import load_preset
from mlrc.store import trials
from mlrc.store.engine import session
from mlrc.store.schema import Study, TestResult
from mlrc.train.checkpoint import adopted
from mlrc.train.numerics import CUBLAS_WORKSPACE, apply_numerics, cudnn_text, provenance

runner = CliRunner()


@pytest.fixture
def torch_flags(monkeypatch):
    """Put torch's process-wide numerics back as they were after the test."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    saved = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
    )
    yield
    mm, conv, det, warn, cudnn_det, bench = saved
    torch.backends.cuda.matmul.allow_tf32 = mm
    torch.backends.cudnn.allow_tf32 = conv
    torch.use_deterministic_algorithms(det, warn_only=warn)
    torch.backends.cudnn.deterministic = cudnn_det
    torch.backends.cudnn.benchmark = bench


def preset(**fields):
    return load_preset("reference").model_copy(update=fields)


def test_tf32_false_and_true_set_both_flags_and_none_leaves_them(torch_flags):
    apply_numerics(preset(tf32=False), "cuda:0")
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    assert torch.get_float32_matmul_precision() == "highest"  # the legacy and global APIs agree
    apply_numerics(preset(tf32=True), "cuda:0")
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    assert torch.get_float32_matmul_precision() == "high"
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = False, True
    apply_numerics(preset(tf32=None), "cuda:0")  # torch's defaults: left as they are
    assert not torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("high")  # code elsewhere may still use the global API
    assert torch.backends.cuda.matmul.allow_tf32


def test_tf32_on_a_cpu_run_warns_once_in_one_line(torch_flags, caplog, monkeypatch):
    from mlrc.train import numerics

    numerics.forget_warnings()  # as in a fresh process
    with caplog.at_level(logging.WARNING, logger="mlrc"):
        apply_numerics(preset(tf32=True), "cpu")
        apply_numerics(preset(tf32=True), "cpu")
    warnings = [r.getMessage() for r in caplog.records if "tf32" in r.getMessage()]
    assert len(warnings) == 1 and "\n" not in warnings[0] and "cpu" in warnings[0], warnings


def test_deterministic_sets_torch_cudnn_and_cublas_and_false_puts_the_defaults_back(torch_flags):
    torch.backends.cudnn.benchmark = True
    apply_numerics(preset(deterministic=True, cudnn_benchmark=True), "cuda:0")
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.is_deterministic_algorithms_warn_only_enabled()
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_WORKSPACE == ":4096:8"
    apply_numerics(preset(deterministic=False, cudnn_benchmark=True), "cuda:0")
    assert not torch.are_deterministic_algorithms_enabled()
    assert not torch.backends.cudnn.deterministic and torch.backends.cudnn.benchmark


def test_a_users_cublas_workspace_setting_is_kept(torch_flags, monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    apply_numerics(preset(deterministic=True), "cpu")
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"


def test_cpu_provenance_names_the_cpu_model_and_is_json(torch_flags):
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        pytest.skip("no /proc/cpuinfo on this system")
    names = [
        line.split(":", 1)[1].strip()
        for line in cpuinfo.read_text().splitlines()
        if line.startswith("model name")
    ]
    apply_numerics(preset(deterministic=False), "cpu")
    p = provenance("cpu", preset())
    assert json.loads(json.dumps(p)) == p
    if names:
        assert p["device_name"] == names[0]
    assert p["device"] == "cpu" and p["torch"] == torch.__version__
    assert p["deterministic"] is False
    assert not {"cuda", "cudnn", "driver", "tf32_matmul"} & set(p)


@pytest.mark.parametrize(
    ("number", "text"),
    [(91002, "9.10.2"), (90100, "9.1.0"), (8907, "8.9.7"), (8600, "8.6.0"), (None, None)],
)
def test_cudnn_version_numbers(number, text):
    assert cudnn_text(number) == text


H100 = {
    "device": "cuda:0",
    "device_name": "NVIDIA H100 80GB HBM3",
    "torch": "2.14.1+cu130",
    "cuda": "13.0",
    "cudnn": "9.10.2",
    "driver": "580.65.06",
    "tf32_matmul": False,
    "tf32_conv": False,
    "cudnn_benchmark": True,
    "deterministic": False,
}
H100_TEXT = (
    "NVIDIA H100 80GB HBM3 (CUDA 13.0, cuDNN 9.10.2, driver 580.65.06, torch 2.14.1+cu130, "
    "TF32 off, deterministic off)"
)
A100_TF32 = {
    **H100,
    "device": "cuda:3",
    "device_name": "NVIDIA A100-SXM4-80GB",
    "tf32_matmul": True,
    "tf32_conv": True,
}
A100_TEXT = (
    "NVIDIA A100-SXM4-80GB (CUDA 13.0, cuDNN 9.10.2, driver 580.65.06, torch 2.14.1+cu130, "
    "TF32 on, deterministic off)"
)


def test_a_fold_result_keeps_its_provenance_through_last_pt_adoption():
    result = {"status": "complete", "reason": None, "best_epoch": 1, "best": {"map_at_r": 0.5}}
    state = {"history": [], "result": {**result, "provenance": H100}}
    assert adopted(state).provenance == H100
    assert adopted({"history": [], "result": result}).provenance is None  # an older last.pt


def _study(engine, name: str, folds: list[tuple[str, dict | None]]) -> None:
    """A study with one tested reproduction and fold runs (status, provenance) recorded through
    the store API, as the search records them."""
    with session(engine) as s:
        st = Study(
            name=name,
            dataset="cub",
            loss=name,
            strategy=None,
            preset="reference",
            config={},
            code_version="test",
        )
        s.add(st)
        s.flush()
        study_id = st.id
        for rep in (1, 2):
            for mode in ("separated", "concatenated"):
                v = {"map_at_r": 0.2 + rep / 100, "precision_at_1": 0.5, "r_precision": 0.3}
                s.add(
                    TestResult(
                        study_id=study_id, reproduction=rep, mode=mode, fold=-1, params={}, **v
                    )
                )
    for i, (status, prov) in enumerate(folds):
        key = {"study_id": study_id, "kind": "search", "params_hash": "h", "reproduction": 0}
        key["fold"] = i
        trials.start_fold(engine, key, f"fold {i}", seed=i, device="cuda:0", code_version="t")
        trials.finish_fold(engine, key, f"fold {i}", status=status, provenance=prov)


@pytest.fixture
def url(tmp_path) -> str:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    engine = store.connect(url)
    _study(engine, "mixed", [("complete", H100)] * 3 + [("complete", A100_TF32)])
    _study(
        engine,
        "same",
        [("complete", H100), ("complete", H100), ("running", A100_TF32), ("failed", A100_TF32)],
    )
    _study(engine, "older", [("complete", H100), ("complete", None)])
    engine.dispose()
    return url


def status(url: str, name: str) -> str:
    r = runner.invoke(app, ["study", "status", name, "--storage", url])
    assert r.exit_code == 0, r.output
    return " ".join(r.output.split())  # the console may wrap


def test_study_status_says_what_computed_its_complete_folds(url):
    assert f"computed on: {H100_TEXT} ×3; {A100_TEXT} ×1 — mixed GPU models, TF32 settings" in (
        status(url, "mixed")
    )
    same = status(url, "same")  # running and failed fold runs computed nothing
    assert f"computed on: {H100_TEXT}" in same and "mixed" not in same and "A100" not in same
    older = status(url, "older")
    assert f"computed on: {H100_TEXT}; 1 fold run without a record" in older


def test_status_of_a_study_without_provenance_says_nothing_of_it(tmp_path):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    engine = store.connect(url)
    _study(engine, "old", [("complete", None)])
    engine.dispose()
    assert "computed on" not in status(url, "old")


def test_the_report_notes_what_computed_each_row_and_a_mix_of_gpus(url):
    r = runner.invoke(app, ["report", "--storage", url])
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())
    assert f"mixed (cub): folds computed on {H100_TEXT} ×3; {A100_TEXT} ×1." in out
    assert f"same (cub): folds computed on {H100_TEXT}." in out
    assert (
        "mixed (cub): its folds ran on different GPU models, TF32 settings; float results "
        "differ between them, so its numbers are not those of one device." in out
    )
    assert "same (cub): its folds ran on different" not in out


def test_a_block_whose_rows_agree_gets_one_note(tmp_path):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    engine = store.connect(url)
    _study(engine, "one", [("complete", H100)])
    _study(engine, "two", [("complete", H100)])
    engine.dispose()
    r = runner.invoke(app, ["report", "--storage", url])
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())
    assert f"cub: folds computed on {H100_TEXT}." in out
    assert "one (cub): folds computed" not in out
