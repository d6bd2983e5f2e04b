"""Trunks, weight loading, frozen BatchNorm and the embedder (CPU only, nothing downloaded).

BN-Inception is checked against its reference, ``pretrainedmodels.bninception`` (Cadene,
pretrainedmodels==0.7.4, in the ``dev`` extra): same module names and kinds, same state-dict keys
and shapes, same features on a random input once the reference's random weights are copied in.
Where pretrainedmodels is absent those tests skip (fail in CI, MLRC_REQUIRE_ALL=1); the
hand-written counts in ``test_bninception_layout_by_hand`` still guard the layout.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import torchvision
from conftest import require
from torch import nn

from mlrc.models import TRUNKS
from mlrc.models.bninception import BNInception
from mlrc.models.embedder import Embedder
from mlrc.models.freezing import freeze_batchnorm
from mlrc.models.small import SmallCNN
from mlrc.models.weights import load_weights, weights_cache_dir
from mlrc.registry import RegistryError

HAVE_PRETRAINEDMODELS = importlib.util.find_spec("pretrainedmodels") is not None


def _randomise(model: nn.Module, seed: int = 0) -> None:
    """Fresh random BatchNorm statistics/affine and biases; weights keep their random init.

    Keeps activations in a sane range (no overflow, no denormals) while making sure every BN
    running mean/var actually matters in an eval-mode comparison.
    """
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Conv2d | nn.Linear):
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) * m.weight.std())
                if m.bias is not None:
                    m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.1)
            elif isinstance(m, nn.BatchNorm2d):
                c = m.num_features
                m.weight.copy_(1 + 0.2 * torch.randn(c, generator=g))
                m.bias.copy_(0.2 * torch.randn(c, generator=g))
                m.running_mean.copy_(0.2 * torch.randn(c, generator=g))
                m.running_var.copy_(0.5 + torch.rand(c, generator=g))


@pytest.fixture(scope="module")
def reference() -> nn.Module:
    """``pretrainedmodels.bninception`` with random weights and BN statistics, in eval mode."""
    require(HAVE_PRETRAINEDMODELS, "pretrainedmodels is not installed (pip install -e .[dev])")
    import pretrainedmodels

    ref = pretrainedmodels.bninception(num_classes=1000, pretrained=None)
    _randomise(ref, seed=7)
    return ref.eval()


def _hyperparameters(m: nn.Module) -> dict[str, object]:
    return {k: v for k, v in vars(m).items() if not k.startswith("_") and k != "training"}


def _assert_same_tensors(model: nn.Module, expected: dict[str, torch.Tensor]) -> None:
    got = model.state_dict()
    assert set(got) == set(expected)
    for k, v in expected.items():
        assert torch.equal(got[k], v.reshape(got[k].shape)), k


def _one_line_error_naming(exc: pytest.ExceptionInfo[ValueError], path: Path) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    assert str(path) in msg
    return msg


# ------------------------------------------------------------------------------------ registry


def test_registry_lists_the_trunks() -> None:
    assert {"bninception", "resnet50", "small_cnn"} <= set(TRUNKS.available())


def test_unknown_trunk_is_a_clear_error() -> None:
    with pytest.raises(RegistryError, match=r"unknown trunk 'bninceptoin'.*did you mean"):
        TRUNKS.get("bninceptoin")


# --------------------------------------------------------------------------------- BN-Inception


def test_bninception_names_and_shapes_match_pretrainedmodels(reference: nn.Module) -> None:
    ref = reference
    ours = TRUNKS.build("bninception")
    ref_modules = {n: m for n, m in ref.named_modules() if n and not n.startswith("last_linear")}
    our_modules = {n: m for n, m in ours.named_modules() if n}
    assert list(our_modules) == list(ref_modules)
    for name, m in ref_modules.items():
        if name == "global_pool":  # AvgPool2d(7) there, adaptive average here
            continue
        assert type(our_modules[name]) is type(m), name
        # every hyperparameter: kernel, stride, padding, ceil_mode, count_include_pad, BN eps and
        # momentum, ReLU inplace, ...
        assert _hyperparameters(our_modules[name]) == _hyperparameters(m), name
    ref_sd = {k: v for k, v in ref.state_dict().items() if not k.startswith("last_linear.")}
    our_sd = ours.state_dict()
    assert list(our_sd) == list(ref_sd)
    assert {k: v.shape for k, v in our_sd.items()} == {k: v.shape for k, v in ref_sd.items()}


@pytest.mark.parametrize("side", [224, 227])
def test_bninception_features_match_pretrainedmodels(reference: nn.Module, side: int) -> None:
    ref = reference
    ours = TRUNKS.build("bninception")
    ours.load_state_dict(
        {k: v for k, v in ref.state_dict().items() if not k.startswith("last_linear.")},
        strict=True,
    )
    ours.eval()
    x = torch.rand(2, 3, side, side, generator=torch.Generator().manual_seed(1)) * 255 - 117
    with torch.no_grad():
        ref_map = ref.features(x)
        ref_pooled = ref.global_pool(ref_map).view(2, -1)  # as in BNInception.logits
        our_map = ours.features(x)
        our_pooled = ours(x)
    assert our_map.shape == ref_map.shape == (2, 1024, 7, 7)
    assert our_pooled.shape == (2, 1024)
    torch.testing.assert_close(our_map, ref_map, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(our_pooled, ref_pooled, atol=1e-5, rtol=1e-5)
    assert 1e-2 < ref_pooled.abs().max() < 1e4  # neither vanishing nor overflowing


def test_bninception_layout_by_hand() -> None:
    """Independent of pretrainedmodels: counts and a few names/shapes of the Cadene layout."""
    sd = BNInception().state_dict()
    assert len(sd) == 483  # 69 conv + 69 BN units; 2 + 5 tensors each
    buffers = ("running_mean", "running_var", "num_batches_tracked")
    assert sum(v.numel() for k, v in sd.items() if not k.endswith(buffers)) == 10_270_240
    assert sd["conv1_7x7_s2.weight"].shape == (64, 3, 7, 7)
    assert sd["conv1_7x7_s2_bn.running_var"].shape == (64,)
    assert sd["inception_3a_pool_proj.weight"].shape == (32, 192, 1, 1)
    assert sd["inception_3c_double_3x3_2.weight"].shape == (96, 96, 3, 3)
    assert sd["inception_5b_pool_proj_bn.bias"].shape == (128,)
    assert "inception_3c_1x1.weight" not in sd and "inception_4e_pool_proj.weight" not in sd
    assert not any(k.startswith("last_linear") for k in sd)


def test_bninception_output_and_input_spec() -> None:
    model = TRUNKS.build("bninception").eval()
    with torch.no_grad():
        out = model(torch.randn(2, 3, 227, 227))
    assert out.shape == (2, 1024)
    assert model.output_size == 1024
    assert model.input_spec == {
        "mean": [104.0, 117.0, 128.0],
        "std": [1.0, 1.0, 1.0],
        "input_range": 255,
        "bgr": True,
    }


def test_bninception_loads_a_local_state_dict_and_drops_last_linear(tmp_path: Path) -> None:
    src = BNInception()
    _randomise(src, seed=3)
    saved = dict(src.state_dict())
    head = {"last_linear.weight": torch.randn(1000, 1024), "last_linear.bias": torch.randn(1000)}
    path = tmp_path / "bn_inception.pth"
    torch.save({**saved, **head}, path)
    model = TRUNKS.build("bninception", pretrained=str(path))
    _assert_same_tensors(model, saved)


def test_bninception_loads_a_legacy_layout(tmp_path: Path) -> None:
    """Pre-0.4.1 checkpoints: no num_batches_tracked, and BN vectors stored as (1, C)."""
    src = BNInception()
    _randomise(src, seed=4)
    legacy = {
        k: (v.unsqueeze(0) if "_bn." in k else v)
        for k, v in src.state_dict().items()
        if not k.endswith("num_batches_tracked")
    }
    path = tmp_path / "legacy.pth"
    torch.save(legacy, path)
    model = TRUNKS.build("bninception", pretrained=str(path))
    _assert_same_tensors(model, dict(src.state_dict()))  # counters: the model's own zeros


# ------------------------------------------------------------------------------ loading errors


def test_missing_file_is_a_one_line_error(tmp_path: Path) -> None:
    path = tmp_path / "nope.pth"
    with pytest.raises(ValueError) as exc:
        TRUNKS.build("bninception", pretrained=str(path))
    assert "does not exist" in _one_line_error_naming(exc, path)


def test_corrupted_file_is_a_one_line_error(tmp_path: Path) -> None:
    path = tmp_path / "corrupt.pth"
    path.write_bytes(b"\x80\x02this is not a torch file" * 10)
    with pytest.raises(ValueError) as exc:
        TRUNKS.build("resnet50", pretrained=str(path))
    assert "not a readable torch state dict" in _one_line_error_naming(exc, path)


def test_truncated_file_is_a_one_line_error(tmp_path: Path) -> None:
    good = tmp_path / "good.pth"
    torch.save(SmallCNN().state_dict(), good)
    path = tmp_path / "truncated.pth"
    path.write_bytes(good.read_bytes()[:500])
    with pytest.raises(ValueError) as exc:
        TRUNKS.build("bninception", pretrained=str(path))
    _one_line_error_naming(exc, path)


@pytest.mark.parametrize(
    "content",
    [[1, 2, 3], {}, {"state_dict": {"conv1_7x7_s2.weight": torch.zeros(1)}}],
    ids=["list", "empty", "nested"],
)
def test_non_state_dict_is_a_one_line_error(tmp_path: Path, content: object) -> None:
    path = tmp_path / "odd.pth"
    torch.save(content, path)
    with pytest.raises(ValueError) as exc:
        TRUNKS.build("bninception", pretrained=str(path))
    assert "not a state dict" in _one_line_error_naming(exc, path)


def test_mismatched_keys_are_a_one_line_error(tmp_path: Path) -> None:
    path = tmp_path / "small.pth"
    torch.save(SmallCNN().state_dict(), path)  # another architecture entirely
    with pytest.raises(ValueError) as exc:
        TRUNKS.build("bninception", pretrained=str(path))
    msg = _one_line_error_naming(exc, path)
    assert "missing keys" in msg and "unexpected keys" in msg
    assert "body.0.weight" in msg  # first unexpected names are shown
    assert "conv1_7x7_s2" in msg  # first missing names are shown


def test_mismatched_shapes_are_a_one_line_error(tmp_path: Path) -> None:
    sd = dict(BNInception().state_dict())
    sd["inception_3a_1x1.weight"] = torch.zeros(65, 192, 1, 1)
    path = tmp_path / "shape.pth"
    torch.save(sd, path)
    with pytest.raises(ValueError) as exc:
        TRUNKS.build("bninception", pretrained=str(path))
    msg = _one_line_error_naming(exc, path)
    assert "inception_3a_1x1.weight (65, 192, 1, 1) vs (64, 192, 1, 1)" in msg


def test_download_url_must_carry_the_hash(monkeypatch: pytest.MonkeyPatch) -> None:
    """Checked before any download: nothing touches the network here."""

    def no_download(*args: object, **kwargs: object) -> None:
        raise AssertionError("tests must never download")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", no_download)
    with pytest.raises(ValueError, match="sha-256 prefix"):
        load_weights(SmallCNN(), True, "http://example.invalid/weights.pth", "abcd1234")
    with pytest.raises(ValueError, match="sha-256 prefix"):
        load_weights(SmallCNN(), True, "http://example.invalid/w-0123abcd.pth", "abcd1234")


def test_bad_pretrained_value_and_false_is_a_no_op() -> None:
    model = SmallCNN()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    load_weights(model, False, "http://example.invalid/w-abcd.pth", "abcd")
    _assert_same_tensors(model, before)
    with pytest.raises(ValueError, match="pretrained must be"):
        load_weights(model, 1, "http://example.invalid/w-abcd.pth", "abcd")  # type: ignore[arg-type]


def test_weights_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MLRC_CACHE", str(tmp_path))
    assert weights_cache_dir() == tmp_path / "weights"
    monkeypatch.delenv("MLRC_CACHE")
    assert weights_cache_dir() == Path.home() / ".cache" / "mlrc" / "weights"


# ------------------------------------------------------------------------------------ ResNet-50


def test_resnet50_output_and_names() -> None:
    model = TRUNKS.build("resnet50").eval()
    with torch.no_grad():
        out = model(torch.randn(2, 3, 64, 64))
    assert out.shape == (2, 2048)
    assert model.output_size == 2048
    assert isinstance(model.fc, nn.Identity)
    assert model.input_spec == {
        "mean": [0.485, 0.456, 0.406],
        "std": [0.229, 0.224, 0.225],
        "input_range": 1,
        "bgr": False,
    }
    tv = torchvision.models.resnet50(weights=None).state_dict()
    assert list(model.state_dict()) == [k for k in tv if not k.startswith("fc.")]


def test_resnet50_local_round_trip(tmp_path: Path) -> None:
    src = torchvision.models.resnet50(weights=None)  # a torchvision checkpoint, fc head included
    _randomise(src, seed=5)
    path = tmp_path / "resnet50.pth"
    torch.save(src.state_dict(), path)
    model = TRUNKS.build("resnet50", pretrained=str(path))
    _assert_same_tensors(
        model, {k: v for k, v in src.state_dict().items() if not k.startswith("fc.")}
    )


# ------------------------------------------------------------------------------------ small CNN


@pytest.mark.parametrize("side", [16, 56, 64])
def test_small_cnn_output(side: int) -> None:
    model = TRUNKS.build("small_cnn").eval()
    with torch.no_grad():
        out = model(torch.randn(3, 3, side, side))
    assert out.shape == (3, 256)
    assert model.output_size == 256
    assert model.input_spec == {
        "mean": [0.5, 0.5, 0.5],
        "std": [0.5, 0.5, 0.5],
        "input_range": 1,
        "bgr": False,
    }


def test_small_cnn_layout() -> None:
    convs = [m for m in SmallCNN().modules() if isinstance(m, nn.Conv2d)]
    assert [c.out_channels for c in convs] == [32, 64, 128, 256]
    assert all(c.kernel_size == (3, 3) for c in convs)


@pytest.mark.parametrize("pretrained", [True, "weights.pth"])
def test_small_cnn_has_no_pretrained_weights(pretrained: bool | str) -> None:
    with pytest.raises(ValueError, match="small_cnn.*pretrained=False"):
        TRUNKS.build("small_cnn", pretrained=pretrained)


# ------------------------------------------------------------------------------ BN freezing


def test_freeze_batchnorm_keeps_running_stats_and_trains_affine() -> None:
    model = SmallCNN()
    model.train()
    assert freeze_batchnorm(model) == 4
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert model.training and all(not bn.training for bn in bns)
    assert all(bn.weight.requires_grad and bn.bias.requires_grad for bn in bns)
    before = [(bn.running_mean.clone(), bn.running_var.clone()) for bn in bns]
    tracked = [int(bn.num_batches_tracked) for bn in bns]
    out = model(torch.randn(4, 3, 32, 32) * 3 + 1)
    out.sum().backward()
    for bn, (mean, var), n in zip(bns, before, tracked, strict=True):
        assert torch.equal(bn.running_mean, mean)
        assert torch.equal(bn.running_var, var)
        assert int(bn.num_batches_tracked) == n
        assert bn.weight.grad is not None and bn.weight.grad.abs().sum() > 0
        assert bn.bias.grad is not None


def test_train_undoes_freezing() -> None:
    """Why freeze_batchnorm must follow every model.train()."""
    model = SmallCNN()
    freeze_batchnorm(model)
    model.train()
    assert all(m.training for m in model.modules() if isinstance(m, nn.BatchNorm2d))


# ------------------------------------------------------------------------------------ embedder


def test_embedder_is_a_single_linear() -> None:
    emb = Embedder(1024, 128)
    assert [type(m) for m in emb.children()] == [nn.Linear]
    assert emb.linear.in_features == 1024 and emb.linear.out_features == 128
    assert emb.output_size == 128
    x = -torch.rand(5, 1024)  # negative inputs: a ReLU or normalisation would show
    out = emb(x)
    assert out.shape == (5, 128)
    torch.testing.assert_close(out, x @ emb.linear.weight.T + emb.linear.bias)
