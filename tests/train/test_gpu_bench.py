"""``bench/gpu_fold.py`` runs on CPU as a smoke test (tiny sizes), and the fold path imports
none of Ray, faiss, MLflow, Plotly or Optuna (issue #22)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("ray", "faiss", "mlflow", "plotly", "optuna")


def test_gpu_fold_cpu_smoke_prints_its_tables_and_writes_its_rows(tmp_path: Path) -> None:
    out = tmp_path / "gpu_fold.csv"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu_fold.py"), "--device", "cpu", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "160"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for line in ("One reference fold on cpu", "Folds packed on one device", "wrote "):
        assert line in proc.stdout, proc.stdout
    assert f"fold path imports: none of {', '.join(HEAVY)}" in proc.stdout, proc.stdout
    df = pd.read_csv(out)
    value = df.set_index(["section", "measure"]).value
    assert value["fold", "train_fold img/s"] > 0
    assert value["upper bound", "synthetic on-device img/s"] > 0
    ratio = value["fold", "train_fold img/s"] / value["upper bound", "synthetic on-device img/s"]
    assert value["fold", "÷ upper bound"] == round(ratio, 4)
    assert value["fold", "first batch, epoch 1"] >= 0 and value["fold", "first batch, epoch 2"] >= 0
    # last.pt at epochs 0, 1 (a validation epoch) and 2 (the fold's end), each timed
    assert value["fold", "last.pt writes"] >= 2
    assert value["fold", "last.pt write, mean"] > 0
    assert value["fold", "heavy imports"] == 0
    assert pd.isna(value["fold", "GPU busy"])  # no GPU: n/a, not a made-up number
    packed = df[(df.section == "packed") & (df.measure == "total img/s")]
    assert sorted(packed.workers.astype(int)) == [1, 2]
    assert (packed.value > 0).all(), packed
    mps = df[(df.section == "packed") & (df.measure == "MPS")]
    assert mps.note.str.startswith("skipped").all() and len(mps) == 1
    assert df.machine.str.contains("Python").all() and (df.device == "cpu").all()


def test_gpu_fold_refuses_cuda_where_there_is_none_in_one_line(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        return  # a GPU machine runs the real thing (bench/gpu_check.sh)
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu_fold.py"), "--out", str(tmp_path / "x.csv")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    assert proc.stdout.strip().splitlines() == [
        "gpu_fold: --device cuda:0: no CUDA device here (--device cpu: smoke run)"
    ]
    assert not (tmp_path / "x.csv").exists()


FOLD_PATH = textwrap.dedent(
    """
    import importlib.abc, json, sys

    HEAVY = {heavy!r}
    seen = {{}}

    class Watch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in HEAVY and name not in seen:
                f, chain = sys._getframe(1), []
                while f is not None:
                    module = f.f_globals.get("__name__", "")
                    if module.startswith("mlrc") and module not in chain:
                        chain.append(f"{{module}}:{{f.f_lineno}}")
                    f = f.f_back
                seen[name] = chain
            return None

    sys.meta_path.insert(0, Watch())
    from pathlib import Path
    from PIL import Image
    import mlrc.config, mlrc.data, mlrc.train
    from mlrc.train import FoldSpec, train_fold

    root = Path({root!r})
    for c in range(4):
        (root / f"c{{c}}").mkdir(parents=True)
        for i in range(4):
            Image.new("RGB", (90, 80), (60 * c, 40 * i, 90)).save(root / f"c{{c}}" / f"{{i}}.jpg")
    ds = mlrc.data.build("image_folder", root=root)
    preset = mlrc.config.load_preset("reference", {{
        "pretrained": False, "image": {{"resize": 72, "crop": 64}}, "batch": {{"size": 8}},
        "num_workers": 0, "eval_batch_size": 8, "iterations_per_epoch": 1, "max_epochs": 1,
        "validate_every": {{"default": 1}},
    }})
    spec = FoldSpec(ds, ds.name, [0, 1, 2], [3], "contrastive", {{}}, None, preset, 0,
                    root.parent / "work", progress=False)
    res = train_fold(spec)
    assert res.status == "complete", res.reason
    loaded = [m for m in HEAVY if m in sys.modules]
    print(json.dumps({{"loaded": loaded, "where": {{m: seen.get(m, []) for m in loaded}}}}))
    """
)


def test_the_fold_path_imports_no_ray_faiss_mlflow_plotly_or_optuna(tmp_path: Path) -> None:
    """Importing mlrc.train, mlrc.data and mlrc.config and training a reference-preset fold
    (decoded cache on) loads none of them: a GPU machine without them runs a fold."""
    code = FOLD_PATH.format(heavy=HEAVY, root=str(tmp_path / "images"))
    env = {**os.environ, "MLRC_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    where = "; ".join(
        f"{m} imported from {' <- '.join(chain) or '?'}" for m, chain in got["where"].items()
    )
    assert got["loaded"] == [], where


def test_gpu_scripts_parse_and_gpu_check_stops_after_env_without_a_gpu(tmp_path: Path) -> None:
    """Without --rehearse on a machine with no GPU, the check records what it runs on and
    stops there, saying so in its last line (exit 2)."""
    import torch

    for script in ("gpu_wheels.sh", "gpu_check.sh"):
        subprocess.run(["bash", "-n", str(REPO / "bench" / script)], check=True)
    if torch.cuda.is_available():
        return  # there it runs for real (minutes)
    proc = subprocess.run(
        ["bash", str(REPO / "bench" / "gpu_check.sh"), "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == (
        "gpu_check: torch sees no CUDA device here (--rehearse: the CPU rehearsal)"
    )
    parts = [json.loads(line)["part"] for line in (tmp_path / "results.jsonl").open()]
    assert parts == ["env"]
    assert json.loads((tmp_path / "env.json").read_text())["gpus"] == []
