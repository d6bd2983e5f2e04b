"""timm backbones as trunks (``trunk: timm:<model>``) and the ``modern`` preset.

Nothing downloads: random timm weights are saved to files and loaded back, and every network
entry point (torch.hub's downloader, timm's Hugging Face Hub access) raises."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import timm
import torch
from conftest import train_tiny_fold
from safetensors.torch import save_file

from mlrc.config import ConfigError, StudyConfig, load_preset, resolve
from mlrc.models import TRUNKS
from mlrc.models.freezing import freeze_batchnorm, freeze_layernorm
from mlrc.models.timm_trunks import TimmTrunk, build_timm_trunk, timm_defaults
from mlrc.models.weights import load_timm_weights
from mlrc.registry import RegistryError
from mlrc.train.model import build_model

# tiny models: a CNN with BatchNorm, a ViT (fixed 224 px input), a ConvNeXt (LayerNorm2d)
MODELS = {"resnet18": 64, "vit_tiny_patch16_224": 224, "convnext_atto": 64}


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("tests must never download")

    monkeypatch.setattr(torch.hub, "download_url_to_file", forbidden)
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", forbidden)
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", forbidden)
    monkeypatch.setenv("MLRC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def saved_random_weights(name: str, tmp_path: Path, seed: int = 1) -> tuple[torch.nn.Module, Path]:
    """A timm model with random weights (classifier included) and its .safetensors file."""
    torch.manual_seed(seed)
    ref = timm.create_model(name, pretrained=False).eval()
    path = tmp_path / f"{name}.safetensors"
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(path))
    return ref, path


def timm_features(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model.forward_head(model.forward_features(x), pre_logits=True)


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("fmt", ["safetensors", "pth"])
def test_output_equals_timms_own_features(name: str, fmt: str, tmp_path: Path) -> None:
    ref, path = saved_random_weights(name, tmp_path)
    if fmt == "pth":
        path = tmp_path / f"{name}.pth"
        torch.save(ref.state_dict(), path)
    trunk = TRUNKS.get(f"timm:{name}")(pretrained={"file": str(path), "sha256": sha256(path)})
    assert isinstance(trunk, TimmTrunk)
    trunk.eval()
    size = MODELS[name]
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got, want = trunk(x), timm_features(ref, x)
    assert got.shape == (2, trunk.output_size)
    assert trunk.output_size == ref.num_features
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)


def test_plain_path_and_sha256_prefix(tmp_path: Path) -> None:
    ref, path = saved_random_weights("resnet18", tmp_path)
    a = build_timm_trunk("resnet18", pretrained=str(path)).eval()
    b = build_timm_trunk("resnet18", pretrained={"file": path, "sha256": sha256(path)[:8]}).eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(a(x), b(x))
        assert torch.allclose(a(x), timm_features(ref, x), atol=1e-5)


def test_wrong_sha256_is_one_line_naming_the_file(tmp_path: Path) -> None:
    _, path = saved_random_weights("resnet18", tmp_path)
    with pytest.raises(ValueError) as err:
        build_timm_trunk("resnet18", pretrained={"file": str(path), "sha256": "0" * 64})
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg and "SHA-256" in msg


def test_weights_of_another_model_are_refused(tmp_path: Path) -> None:
    _, path = saved_random_weights("resnet18", tmp_path)
    with pytest.raises(ValueError, match=r"do not fit timm model 'convnext_atto'") as err:
        build_timm_trunk("convnext_atto", pretrained=str(path))
    assert "\n" not in str(err.value)


def test_url_weights_come_from_the_cache_without_network(tmp_path: Path) -> None:
    """A URL is fetched once into $MLRC_CACHE/weights/timm; here the cache already holds the
    file (the downloader raises), so it is only checked and loaded."""
    ref, path = saved_random_weights("resnet18", tmp_path)
    url = "https://example.org/weights/resnet18.safetensors"
    key = hashlib.sha256(url.encode()).hexdigest()[:12]
    cached = tmp_path / "cache" / "weights" / "timm" / f"{key}-resnet18.safetensors"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(path.read_bytes())
    trunk = build_timm_trunk("resnet18", pretrained={"url": url, "sha256": sha256(path)}).eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        assert torch.allclose(trunk(x), timm_features(ref, x), atol=1e-5)
    with pytest.raises(ValueError, match="SHA-256"):
        build_timm_trunk("resnet18", pretrained={"url": url, "sha256": "f" * 64})


def test_an_uncached_url_would_download(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="could not get weights .*tests must never download"):
        build_timm_trunk(
            "resnet18", pretrained={"url": "https://example.org/w.safetensors", "sha256": "a" * 64}
        )


def test_unknown_model_is_one_line_with_suggestions() -> None:
    with pytest.raises(RegistryError) as err:
        TRUNKS.get("timm:resnet_18")
    assert str(err.value).startswith("unknown timm model 'resnet_18'; did you mean timm:resnet18")
    with pytest.raises(ConfigError) as cerr:
        load_preset("cpu", {"trunk": "timm:convnxt_tiny"})
    msg = str(cerr.value)
    assert "\n" not in msg and "unknown timm model 'convnxt_tiny'" in msg
    assert "timm:convnext_tiny" in msg
    with pytest.raises(ConfigError, match="unknown pretrained tag"):
        load_preset("cpu", {"trunk": "timm:resnet18.nope"})


@pytest.mark.parametrize("name", sorted(MODELS))
def test_input_spec_is_timms_pretrained_cfg(name: str) -> None:
    cfg = timm.get_pretrained_cfg(name)
    trunk = build_timm_trunk(name)
    assert trunk.input_spec == {
        "mean": list(cfg.mean),
        "std": list(cfg.std),
        "input_range": 1,
        "bgr": False,
    }
    own = timm_defaults(name)
    assert own["crop"] == cfg.input_size[-1]
    assert own["resize"] == int(cfg.input_size[-1] / cfg.crop_pct)


def test_preset_takes_the_models_input_size_unless_it_sets_one() -> None:
    none = {"resize": None, "crop": None}
    p = load_preset("cpu", {"trunk": "timm:vit_tiny_patch16_224", "image": none})
    assert (p.image.resize, p.image.crop) == (248, 224)  # crop_pct 0.9
    p = load_preset("cpu", {"trunk": "timm:resnet18"})  # the preset's own 36/32
    assert (p.image.resize, p.image.crop) == (36, 32)
    p = load_preset("cpu", {"trunk": "timm:resnet18", "image": none})
    assert (p.image.resize, p.image.crop) == (235, 224)  # crop_pct 0.95
    with pytest.raises(ConfigError, match="takes 224 px inputs only"):  # a ViT's fixed size
        load_preset("cpu", {"trunk": "timm:vit_tiny_patch16_224"})
    with pytest.raises(ConfigError, match="resize and crop are required for trunk 'tiny_cnn'"):
        load_preset("cpu", {"image": none})


def test_preset_normalize_overrides_the_trunks(tmp_path: Path) -> None:
    base = {"trunk": "timm:resnet18"}
    own = build_model(load_preset("cpu", base)).trunk.input_spec
    assert own["mean"] == [0.485, 0.456, 0.406]
    over = {**base, "normalize": {"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]}}
    spec = build_model(load_preset("cpu", over)).trunk.input_spec
    assert spec == {"mean": [0.5] * 3, "std": [0.25] * 3, "input_range": 1, "bgr": False}


def test_freeze_batchnorm_keeps_statistics() -> None:
    trunk = build_timm_trunk("resnet18")
    bns = [m for m in trunk.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    before = [(m.running_mean.clone(), m.running_var.clone()) for m in bns]
    trunk.train()
    assert freeze_batchnorm(trunk) == len(bns) > 0
    trunk(torch.randn(4, 3, 64, 64)).sum().backward()
    for m, (mean, var) in zip(bns, before, strict=True):
        assert torch.equal(m.running_mean, mean) and torch.equal(m.running_var, var)
    assert all(m.weight.grad is not None for m in bns)  # affine weights still train


def test_freeze_layernorm_stops_their_training() -> None:
    trunk = build_timm_trunk("convnext_atto")
    n = freeze_layernorm(trunk)
    lns = [m for m in trunk.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert n == len(lns) > 0
    assert not any(p.requires_grad for m in lns for p in m.parameters())
    model = build_model(
        load_preset("cpu", {"trunk": "timm:convnext_atto", "freeze_layernorm": True})
    )
    frozen = [
        p for m in model.modules() if isinstance(m, torch.nn.LayerNorm) for p in m.parameters()
    ]
    assert frozen and not any(p.requires_grad for p in frozen)


def test_pretrained_mapping_is_for_timm_trunks_only(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is for timm: trunks"):
        load_preset("cpu", {"pretrained": {"file": "w.pth", "sha256": "a" * 64}})
    with pytest.raises(ConfigError, match="a url needs its sha256"):
        load_preset("cpu", {"trunk": "timm:resnet18", "pretrained": {"url": "https://x/w"}})


def test_tiny_fold_trains_with_a_timm_trunk(glyphs_ds, tmp_path: Path) -> None:
    res = train_tiny_fold(
        glyphs_ds,
        tmp_path,
        iterations=1,
        preset_overrides={
            "trunk": "timm:resnet18",
            "freeze_batchnorm": True,
            "optimizer": {"name": "adamw", "lr": 1e-4, "weight_decay": 0.01, "momentum": 0.0},
        },
    )
    assert res.history and all(h.map_at_r >= 0 for h in res.history)


def test_modern_preset_resolves_and_builds_without_weights() -> None:
    p = load_preset("modern")
    assert p.trunk == "timm:vit_small_patch16_224.dino"
    assert (p.image.resize, p.image.crop) == (248, 224)
    assert p.optimizer.name == "adamw" and p.embedding_size == 384
    doc = {
        "name": "s",
        "dataset": {"name": "glyphs"},
        "preset": "modern",
        "loss": {"name": "contrastive"},
        "overrides": {"pretrained": False, "embedding_size": 128},
    }
    r = resolve(StudyConfig.model_validate(doc), "s")
    model = build_model(r.preset)
    assert model.trunk.output_size == 384 and model.embedder.output_size == 128
    assert model.trunk.input_spec["mean"] == [0.485, 0.456, 0.406]
    fp = r.fingerprint()
    assert fp["preset"]["optimizer"]["name"] == "adamw"


def test_existing_presets_fingerprints_unchanged() -> None:
    """The new preset fields are left out of a fingerprint while at their defaults."""
    for preset in ("cpu", "reference"):
        doc = {
            "name": "s",
            "dataset": {"name": "glyphs"},
            "preset": preset,
            "loss": {"name": "contrastive"},
        }
        fp = resolve(StudyConfig.model_validate(doc), "s").fingerprint()["preset"]
        assert "freeze_layernorm" not in fp and "normalize" not in fp
        assert "name" not in fp["optimizer"]
        assert isinstance(fp["image"]["resize"], int)


def test_pretrained_true_needs_the_cache_or_the_network(tmp_path: Path) -> None:
    """``pretrained: true`` resolves to the tag's Hub file; with no network it fails in one line."""
    model = timm.create_model("resnet18", pretrained=False, num_classes=0)
    with pytest.raises(
        ValueError, match=r"could not get weights https://huggingface.co/timm/resnet18"
    ):
        load_timm_weights(model, True, "resnet18")
