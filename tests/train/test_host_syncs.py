"""The training step does not wait for the device (#22 point 2), and the exact k-NN keeps IEEE
float32 matmuls whatever the process's TF32 setting (#22 point 5).

On CPU a host "sync" cannot be observed directly, so these tests check what would sync on a GPU:
that the loss tally never reads a tensor back while adding, that the loop reads it once per
epoch, and that validation hands device tensors to the metrics. The GPU-only check
(``torch.cuda.set_sync_debug_mode("error")`` around a reference fold's step) is in
tests/train/test_gpu.py.
"""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch
from tqdm import tqdm

from mlrc.protocol import knn, retrieval_metrics
from mlrc.train import loop
from mlrc.train.embed import View, embed, embed_tensors
from mlrc.train.loop import LossTally

READS = ("item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__", "__index__")


@pytest.fixture
def no_reads(monkeypatch):
    """Within the block, reading a tensor back to the host raises."""

    def refuse(name):
        def method(*args, **kwargs):
            raise AssertionError(f"Tensor.{name} called: a host sync")

        return method

    class Guard:
        def __enter__(self):
            for name in READS:
                monkeypatch.setattr(torch.Tensor, name, refuse(name))

        def __exit__(self, *exc):
            monkeypatch.undo()

    return Guard()


def plain_python_mean(losses: list[torch.Tensor]) -> float:
    """Today's formula, written plainly: Python floats of ``loss.item()`` summed in order."""
    total = 0.0
    for loss in losses:
        total += loss.item()
    return total / max(len(losses), 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_the_tally_s_mean_is_bit_for_bit_the_python_float_sum(dtype):
    rng = np.random.default_rng(0)
    # magnitudes from 1e-6 to 1e4: the float64 sum rounds at almost every step
    values = rng.standard_normal(997) * 10.0 ** rng.uniform(-6, 4, 997)
    losses = [torch.tensor(v, dtype=dtype) for v in values]
    tally = LossTally()
    for it, loss in enumerate(losses, 1):
        tally.add(loss, it)
    mean, bad = tally.read()
    assert bad is None and tally.n == len(losses)
    assert mean == plain_python_mean(losses)  # exactly, not approximately
    assert mean != float(np.float32(np.mean(values)))  # a float32 sum would not do


def test_adding_a_loss_never_reads_a_tensor_back(no_reads):
    tally = LossTally()
    losses = [torch.tensor(1.5), torch.tensor(float("nan")), torch.tensor(2.0)]
    with no_reads:
        for it, loss in enumerate(losses, 1):
            tally.add(loss.requires_grad_(), it)
    assert tally.read() == (pytest.approx(math.nan, nan_ok=True), 2)


@pytest.mark.parametrize(
    "values, first",
    [
        ([1.0, 2.0, 3.0], None),
        ([1.0, math.nan, 3.0, 4.0], 2),  # finite again afterwards
        ([1.0, 2.0, math.inf, math.nan, math.nan], 3),  # non-finite from then on
        ([-math.inf, 1.0], 1),
    ],
)
def test_the_tally_names_the_first_non_finite_iteration(values, first):
    tally = LossTally()
    for it, v in enumerate(values, 101):  # iterations counted over the fold, not from 1
        tally.add(torch.tensor(v), it)
    assert tally.read()[1] == (None if first is None else 100 + first)


def test_a_hidden_bar_reads_the_losses_once_per_epoch(glyphs_ds, tmp_path, monkeypatch):
    from conftest import train_tiny_fold

    reads = []
    original = LossTally.read
    monkeypatch.setattr(LossTally, "read", lambda self: reads.append(self.n) or original(self))
    res = train_tiny_fold(glyphs_ds, tmp_path, iterations=3, preset_overrides={"max_epochs": 2})
    assert res.status == "complete" and reads == [3, 3]


def test_a_shown_bar_stops_the_epoch_at_the_first_read_after_a_non_finite_loss(
    glyphs_ds, tmp_path, monkeypatch
):
    """READ_SECONDS = 0: the shown bar reads after every step, so a NaN at iteration 2 stops the
    epoch there (no third step), with the same reason as at the end of an epoch."""
    from conftest import train_tiny_fold

    from mlrc.methods import losses

    calls = []

    class NaNAt2(torch.nn.Module):
        def forward(self, embeddings, labels):
            calls.append(1)
            return embeddings.pow(2).mean() * (math.nan if len(calls) == 2 else 1.0)

    losses.register("test_nan_at_2_bar", batch="pair")(lambda **_: NaNAt2())
    monkeypatch.setattr(loop, "READ_SECONDS", 0.0)
    monkeypatch.setattr(
        loop,
        "progress_bar",
        lambda run: tqdm(total=100, file=io.StringIO(), disable=False, mininterval=0),
    )
    try:
        res = train_tiny_fold(glyphs_ds, tmp_path, "test_nan_at_2_bar", iterations=6)
    finally:
        losses.LOSSES.unregister("test_nan_at_2_bar")
    assert res.status == "failed" and res.reason == "non-finite loss at iteration 2"
    assert len(calls) == 2


def test_validation_hands_device_tensors_to_the_metrics(glyphs_ds, tmp_path, monkeypatch):
    from conftest import train_tiny_fold

    seen = []
    original = loop.retrieval_metrics

    def spy(emb, labels, **kwargs):
        seen.append((type(emb), type(labels), kwargs.get("device")))
        return original(emb, labels, **kwargs)

    monkeypatch.setattr(loop, "retrieval_metrics", spy)
    assert train_tiny_fold(glyphs_ds, tmp_path).status == "complete"
    assert seen == [(torch.Tensor, torch.Tensor, "cpu")] * 2  # epochs 0 and 1


def test_embed_tensors_copies_nothing_per_batch_and_embed_gives_the_same_numbers(
    glyphs_ds, monkeypatch
):
    from mlrc.config import load_preset
    from mlrc.data.transforms import eval_transform
    from mlrc.train.model import build_model

    preset = load_preset("cpu")
    torch.manual_seed(0)
    model = build_model(preset)
    im = preset.image
    view = View(glyphs_ds, range(10), eval_transform(im.resize, im.crop, model.trunk.input_spec))
    copies = []
    original = torch.Tensor.cpu
    monkeypatch.setattr(torch.Tensor, "cpu", lambda t, *a, **k: copies.append(1) or original(t))
    emb, labels = embed_tensors(model, view, 16, "cpu")
    assert copies == [] and isinstance(emb, torch.Tensor) and emb.dtype == torch.float32
    monkeypatch.undo()
    emb_np, labels_np = embed(model, view, 16, "cpu")
    assert np.array_equal(emb.numpy(), emb_np) and np.array_equal(labels.numpy(), labels_np)


# --- the metrics take device tensors; the k-NN keeps IEEE float32 ----------------------------


def naive_metrics(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """MAP@R, P@1, R-Precision by a plain loop (float64, L2-normalised rows, Euclidean
    distance, self excluded, ties to the lower index)."""
    x = x.astype(np.float64)
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    sums, count = np.zeros(3), 0
    for q in range(len(x)):
        R = int((y == y[q]).sum()) - 1
        if R == 0:
            continue
        d = ((x - x[q]) ** 2).sum(1)
        d[q] = np.inf
        order = np.argsort(d, kind="stable")[:R]
        rel = (y[order] == y[q]).astype(float)
        ap = (np.cumsum(rel) / np.arange(1, R + 1) * rel).sum() / R
        sums += [ap, rel[0], rel.sum() / R]
        count += 1
    return tuple(sums / count)


@pytest.fixture
def clustered():
    rng = np.random.default_rng(3)
    y = np.repeat(np.arange(12), 9)
    x = (rng.standard_normal((12, 24))[y] + 0.6 * rng.standard_normal((len(y), 24))).astype(
        np.float32
    )
    return x, y


def test_metrics_of_tensors_equal_those_of_numpy_arrays(clustered):
    x, y = clustered
    want = retrieval_metrics(x, y)
    assert retrieval_metrics(torch.from_numpy(x), torch.from_numpy(y)) == want
    with knn.tuned(cpu_backend="torch"):  # the torch path (GPUs), here on CPU
        assert retrieval_metrics(torch.from_numpy(x), torch.from_numpy(y), device="cpu") == want
    got = [want[k] for k in ("map_at_r", "precision_at_1", "r_precision")]
    assert got == pytest.approx(naive_metrics(x, y), abs=1e-12)


@pytest.fixture
def caller_precision():
    """The process's matmul precision as a caller set it, restored after the test."""
    before = (
        torch.get_float32_matmul_precision(),
        torch.backends.cuda.matmul.fp32_precision,
        torch.backends.mkldnn.matmul.fp32_precision,
    )
    yield
    torch.set_float32_matmul_precision(before[0])
    torch.backends.cuda.matmul.fp32_precision = before[1]
    torch.backends.mkldnn.matmul.fp32_precision = before[2]


@pytest.mark.parametrize("outside", ["high", "medium"])
def test_the_knn_forces_full_fp32_matmuls_and_restores_the_caller_s_setting(
    clustered, monkeypatch, caller_precision, outside
):
    x, y = clustered
    under = []
    original = torch.Tensor.__matmul__

    def spy(a, b):
        under.append(
            (torch.backends.cuda.matmul.fp32_precision, torch.backends.mkldnn.matmul.fp32_precision)
        )
        return original(a, b)

    monkeypatch.setattr(torch.Tensor, "__matmul__", spy)
    torch.set_float32_matmul_precision(outside)
    with knn.tuned(cpu_backend="torch"):  # the torch path, as on a GPU
        m = retrieval_metrics(torch.from_numpy(x), torch.from_numpy(y), device="cpu")
    monkeypatch.setattr(torch.Tensor, "__matmul__", original)
    assert under and set(under) == {("ieee", "ieee")}  # every k-NN matmul ran in full fp32
    assert torch.get_float32_matmul_precision() == outside  # the caller's setting is back
    assert torch.backends.cuda.matmul.fp32_precision == "tf32"
    got = [m[k] for k in ("map_at_r", "precision_at_1", "r_precision")]
    assert got == pytest.approx(naive_metrics(x, y), abs=1e-12)


def test_full_fp32_matmul_restores_a_setting_made_with_the_new_api(caller_precision):
    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.fp32_precision = "tf32"  # per-backend API only
    torch.backends.mkldnn.matmul.fp32_precision = "bf16"
    with knn.full_fp32_matmul():
        assert torch.backends.cuda.matmul.fp32_precision == "ieee"
        assert torch.backends.mkldnn.matmul.fp32_precision == "ieee"
        assert torch.get_float32_matmul_precision() == "highest"
    assert torch.backends.cuda.matmul.fp32_precision == "tf32"
    assert torch.backends.mkldnn.matmul.fp32_precision == "bf16"


class _NaNThenError(torch.nn.Module):
    """NaN at call ``nan`` (0: never), then raises at call ``error``: a step failing on NaNs."""

    def __init__(self, nan: int, error: int) -> None:
        super().__init__()
        self.calls, self.nan, self.error = 0, nan, error

    def forward(self, embeddings, labels):
        self.calls += 1
        if self.calls == self.error:
            raise RuntimeError("probability tensor contains either inf, nan or element < 0")
        return embeddings.pow(2).mean() * (math.nan if self.calls == self.nan else 1.0)


@pytest.mark.parametrize("nan", [2, 0], ids=["after-a-nan", "no-nan"])
def test_a_step_failing_after_a_non_finite_loss_reports_the_loss(glyphs_ds, tmp_path, nan):
    from conftest import train_tiny_fold

    from mlrc.methods import losses

    name = f"test_nan_{nan}_then_error"
    losses.register(name, batch="pair")(lambda **_: _NaNThenError(nan, 3))
    try:
        if nan:
            res = train_tiny_fold(glyphs_ds, tmp_path, name, iterations=4)
            assert res.status == "failed" and res.reason == "non-finite loss at iteration 2"
        else:  # no NaN before it: the error is the step's own, raised as it is
            with pytest.raises(RuntimeError, match="probability tensor"):
                train_tiny_fold(glyphs_ds, tmp_path, name, iterations=4)
    finally:
        losses.LOSSES.unregister(name)
