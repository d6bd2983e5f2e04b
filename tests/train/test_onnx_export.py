"""``mlrc study export-model --format onnx`` (issue #26): the ONNX file, run by onnxruntime (not
by torch), gives the embeddings of the ``.pt`` module (the reference: the fold models as mlrc
tests them, which ``test_retention`` checks against a study's stored test MAP@R) on the glyphs
test images, preprocessed as the file's own metadata documents it; any batch size; rows of unit
length (the file holds the L2 normalisation, as the ``.pt2`` program does). A trunk with an
operator ONNX cannot express is refused in one line naming that operator. Fold models here are
seeded random weights written as ``best.pt`` (no study is trained: seconds, not minutes); the
command's path from a study to these functions is the one ``test_retention`` exercises.

Where onnxruntime / onnxscript are absent these tests skip (fail in CI, MLRC_REQUIRE_ALL=1)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from conftest import require
from typer.testing import CliRunner

from mlrc import data
from mlrc.cli import app
from mlrc.models import TRUNKS
from mlrc.models.small import SmallCNN
from mlrc.protocol import mlrc_split

runner = CliRunner()
TINY = {"iterations_per_epoch": 2, "max_epochs": 1, "validate_every": {"default": 1}}
HAVE_ONNX = all(importlib.util.find_spec(m) for m in ("onnx", "onnxruntime", "onnxscript"))
# float32 through two runtimes: convolutions summed in another order differ by ~1e-7 per unit row
ATOL = 1e-5


def cli(*args: object, code: int = 0):
    r = runner.invoke(app, [str(a) for a in args])
    assert r.exit_code == code, r.output
    return r


class SvdCNN(SmallCNN):
    """``tiny_cnn`` whose features are scaled by 1 + 0 · (a singular value of themselves):
    the same numbers, but the graph holds ``aten._linalg_svd``, which ONNX has no operator for."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = super().forward(x)
        s = torch.linalg.svdvals(f.view(f.shape[0], 8, -1)).sum(1, keepdim=True)
        return f * (1 + 0 * s)


def _svd_cnn(*, pretrained: bool | str = False) -> SmallCNN:
    return SvdCNN(widths=(16, 32, 64, 128))


def fold_models(tmp: Path, preset, folds: int) -> list[Path]:
    """``folds`` fold models of ``preset`` as their ``best.pt``: random weights and BatchNorm
    statistics (not the identity an untrained BatchNorm holds), seeded."""
    from mlrc.train import build_model

    torch.manual_seed(0)
    paths = []
    for f in range(folds):
        model = build_model(preset, pretrained=False)
        for bn in (m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)):
            bn.running_mean.normal_(0, 0.5)
            bn.running_var.uniform_(0.5, 2)
            bn.weight.data.uniform_(0.5, 1.5)
            bn.bias.data.normal_(0, 0.2)
        paths.append(tmp / f"fold{f}.pt")
        torch.save(model.state_dict(), paths[-1])
    return paths


def glyph_test_images(meta: dict) -> torch.Tensor:
    """The glyphs test classes, preprocessed as the export's metadata documents it."""
    ds = data.build("glyphs")
    split = mlrc_split(ds.labels, scheme="mlrc")
    spec = meta["input"]
    tf = T.Compose([T.Resize(spec["resize"]), T.CenterCrop(spec["crop"]), T.PILToTensor()])
    keep = np.flatnonzero(np.isin(ds.labels, split.test_classes))
    x = torch.stack([tf(ds.load_image(i)) for i in keep]).float() / 255 * spec["input_range"]
    mean = torch.tensor(spec["mean"]).view(1, -1, 1, 1)
    std = torch.tensor(spec["std"]).view(1, -1, 1, 1)
    return (x - mean) / std


@pytest.mark.parametrize("folds", [2, 1])
def test_the_onnx_file_gives_the_pytorch_embeddings_in_onnxruntime(tmp_path, folds):
    """2 fold models (a concatenated model: the 512-D one has 4, the same code) and 1 (a 128-D
    fold model), ``cpu`` preset (``tiny_cnn``), as ``export-model`` writes them; the reference
    is the ``.pt`` module."""
    require(HAVE_ONNX, "onnx, onnxruntime or onnxscript is not installed (pip install -e .[onnx])")
    import onnxruntime as ort

    from mlrc.config import load_preset
    from mlrc.train import export_model, load_exported

    preset = load_preset("cpu")
    paths = fold_models(tmp_path, preset, folds)
    export_model(preset, paths, tmp_path / "m.pt", {"study": "o"})
    export_model(preset, paths, tmp_path / "m.onnx", {"study": "o"}, "onnx")
    module, meta = load_exported(tmp_path / "m.pt")
    run = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    stored = json.loads(run.get_modelmeta().custom_metadata_map["mlrc.json"])
    assert stored["study"] == "o" and stored["input"] == meta["input"]
    assert [i.name for i in run.get_inputs()] == ["images"]
    dim = 128 * folds
    x = glyph_test_images(stored)
    with torch.no_grad():
        want = module(x).numpy()
    got = run.run(["embeddings"], {"images": x.numpy()})[0]
    assert got.shape == (len(x), dim) == want.shape and stored["dim"] == dim
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1, atol=1e-6)  # normalised inside
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)
    few = run.run(["embeddings"], {"images": x[:3].numpy()})[0]  # any batch size
    np.testing.assert_allclose(few, want[:3], atol=ATOL, rtol=0)


def test_a_trunk_onnx_cannot_express_is_refused_in_one_line_naming_the_operator(tmp_path):
    """A plug-in trunk with ``aten._linalg_svd`` in its graph, as a fold's ``best.pt``: the
    export is refused with the operator named (the CLI prints it after ``error: study 'NAME':``
    and leaves no file, as every failed export)."""
    require(HAVE_ONNX, "onnx, onnxruntime or onnxscript is not installed (pip install -e .[onnx])")
    from mlrc.config import load_preset
    from mlrc.train import OnnxExportError, export_model

    TRUNKS.register("test_svd_cnn", _svd_cnn)
    try:
        preset = load_preset("cpu", {"trunk": "test_svd_cnn"})
        paths = fold_models(tmp_path, preset, 1)
        with pytest.raises(OnnxExportError) as caught:
            export_model(preset, paths, tmp_path / "m.onnx", {}, "onnx")
    finally:
        TRUNKS.unregister("test_svd_cnn")
    # the exporter's own message is 20 lines; what the user reads is this one
    assert str(caught.value) == (
        "the model cannot be exported to ONNX: no ONNX translation of operator "
        "aten._linalg_svd.default (use --format export)"
    )


def test_an_unknown_format_is_one_line(tmp_path):
    r = cli("study", "export-model", "o", "--storage", f"sqlite:///{tmp_path / 'db.sqlite'}",
            "--out", tmp_path / "m.x", "--format", "tflite", code=2)  # fmt: skip
    assert r.output.strip() == "error: --format: expected state-dict, export or onnx (got 'tflite')"
