"""The preset's fast paths on CPU: each falls back cleanly and keeps results within float noise
(bf16/fp16 autocast within low-precision noise), as the README's "Performance" section says."""

from __future__ import annotations

import pytest
import torch
from conftest import train_tiny_fold

from mlrc.config import load_preset
from mlrc.train import build_model, loader_options

EXACT = {
    "channels_last": True,
    "cudnn_benchmark": True,
    "pin_memory": True,
    "persistent_workers": True,
}


@pytest.fixture(scope="module")
def plain(glyphs_ds, tmp_path_factory):
    """The fold with every fast path off (the reference run of this module)."""
    return train_tiny_fold(glyphs_ds, tmp_path_factory.mktemp("plain"), iterations=4)


def _val(res) -> list[float]:
    return [h.map_at_r for h in res.history]


def test_exact_fast_paths_give_the_same_fold(glyphs_ds, tmp_path, plain):
    """channels_last, cudnn.benchmark, pinned memory and persistent workers change no number
    beyond float noise. On CPU cudnn and pinning are no-ops; NHWC convolutions sum in another
    order (~1e-7), which RMSprop's first steps (g/√v ≈ ±10·lr for tiny g) amplify, so the
    comparison is of the untrained model's validation and the first epoch's loss."""
    fast = train_tiny_fold(glyphs_ds, tmp_path / "fast", iterations=4, preset_overrides=EXACT)
    assert fast.status == plain.status == "complete"
    assert fast.history[0].map_at_r == pytest.approx(plain.history[0].map_at_r, abs=1e-6)
    assert fast.history[1].train_loss == pytest.approx(plain.history[1].train_loss, rel=0.02)


def test_channels_last_same_forward_and_gradients():
    preset = load_preset("cpu")
    torch.manual_seed(0)
    plain = build_model(preset)
    fast = build_model(preset)
    fast.load_state_dict(plain.state_dict())
    fast.fast_paths("off", channels_last=True)
    x = torch.randn(8, 3, preset.image.crop, preset.image.crop)
    outs = []
    for m in (plain, fast):
        m.zero_grad()
        out = m(x)
        out.square().sum().backward()
        outs.append((out.detach(), [p.grad.clone() for p in m.parameters()]))
    torch.testing.assert_close(outs[1][0], outs[0][0], rtol=1e-5, atol=1e-5)
    for g_fast, g_plain in zip(outs[1][1], outs[0][1], strict=True):
        assert (g_fast - g_plain).abs().max() <= 1e-4 * g_plain.abs().max()  # float32 noise


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_mixed_precision_trains_on_cpu(glyphs_ds, tmp_path, amp, plain):
    """Autocast runs on the CPU too (fp16 with a gradient scaler); the fold completes and its
    loss stays within low-precision noise of float32."""
    res = train_tiny_fold(glyphs_ds, tmp_path / amp, iterations=4, preset_overrides={"amp": amp})
    assert res.status == "complete", res.reason
    assert res.history[-1].train_loss == pytest.approx(plain.history[-1].train_loss, rel=0.05)
    assert _val(res) == pytest.approx(_val(plain), abs=0.05)


def test_autocast_forward_returns_float32():
    preset = load_preset("cpu")
    model = build_model(preset).fast_paths("bf16", channels_last=True).eval()
    x = torch.randn(2, 3, preset.image.crop, preset.image.crop)
    with torch.no_grad():
        out = model(x)
    assert out.dtype == torch.float32 and out.shape == (2, preset.embedding_size)
    assert next(model.trunk.parameters()).dtype == torch.float32  # weights stay float32


def test_loader_options_fall_back_on_cpu():
    preset = load_preset("cpu", {"pin_memory": True, "persistent_workers": True})
    assert loader_options(preset, "cpu") == {
        "num_workers": 0,
        "pin_memory": False,
        "persistent_workers": False,
    }
    with_workers = load_preset(
        "cpu", {"pin_memory": True, "persistent_workers": True, "num_workers": 2}
    )
    assert loader_options(with_workers, "cuda:0") == {
        "num_workers": 2,
        "pin_memory": True,
        "persistent_workers": True,
    }


@pytest.mark.parametrize(
    "spec",
    [
        {"input_range": 255, "bgr": True, "mean": [104, 117, 128], "std": [1, 1, 1]},
        {
            "input_range": 1,
            "bgr": False,
            "mean": [0.485, 0.456, 0.406],
            "std": [0.229, 0.224, 0.225],
        },
    ],
)
def test_one_step_trunk_input_is_bit_identical_to_torchvision(spec):
    """ToTrunkInput vs the plain composition ToTensor → ×range → [BGR] → Normalize."""
    import numpy as np
    from PIL import Image
    from torchvision import transforms as T

    from mlrc.data.transforms import ToTrunkInput, ToUint8Input, to_trunk_input

    rng = np.random.default_rng(0)
    pic = Image.fromarray(rng.integers(0, 256, (37, 29, 3), dtype=np.uint8))
    x = T.ToTensor()(pic) * float(spec["input_range"])
    x = x[[2, 1, 0]] if spec["bgr"] else x
    expected = T.Normalize(spec["mean"], spec["std"])(x)
    assert torch.equal(ToTrunkInput(spec)(pic), expected)
    # the training loop's split: uint8 per image on the CPU, a whole batch normalised at once
    pics = [pic, Image.fromarray(rng.integers(0, 256, (37, 29, 3), dtype=np.uint8))]
    batch = torch.stack([ToUint8Input(spec)(p) for p in pics])
    assert batch.dtype == torch.uint8
    assert torch.equal(
        to_trunk_input(batch, spec), torch.stack([ToTrunkInput(spec)(p) for p in pics])
    )


def test_decoded_cache_trains_the_very_same_fold(glyphs_ds, tmp_path, plain, monkeypatch):
    """decoded_cache: same images after Resize, same RNG → the same fold, number for number."""
    monkeypatch.setenv("MLRC_CACHE", str(tmp_path / "cache"))
    res = train_tiny_fold(
        glyphs_ds, tmp_path / "cached", iterations=4, preset_overrides={"decoded_cache": True}
    )
    assert [vars(h) for h in res.history] == [vars(h) for h in plain.history]
    assert len(list((tmp_path / "cache" / "decoded").glob("glyphs-r36-*.u8"))) == 1
