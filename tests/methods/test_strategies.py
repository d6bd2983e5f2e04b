"""Training strategies: the registry, ρ-regularisation's tuples, config checks, a short training."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import yaml
from conftest import train_tiny_fold

from mlrc.config import ConfigError, load_study
from mlrc.methods import strategies
from mlrc.methods.strategies.rho_distance import distance_weights


def test_registry():
    assert "rho_distance" in strategies.available()
    assert strategies.params("rho_distance") == {"p_switch": 0.2, "lower_cutoff": 0.5}
    assert type(strategies.build(None)) is strategies.Strategy
    with pytest.raises(TypeError, match="takes no parameter 'alpha'"):
        strategies.build("rho_distance", alpha=1)


def tuples(p_switch, seed=0):
    torch.manual_seed(seed)
    y = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 3])  # class 3 has one sample: never an anchor
    emb = torch.randn(len(y), 16)
    a, p, n = strategies.build("rho_distance", p_switch=p_switch).mine(emb, y)
    return y, a, p, n


def test_normal_tuples_have_a_same_class_positive_and_an_other_class_negative():
    y, a, p, n = tuples(0.0)
    assert sorted(a.tolist()) == [0, 1, 2, 3, 4, 5, 6, 7]
    assert (y[p] == y[a]).all() and (p != a).all() and (y[n] != y[a]).all()


def test_switched_tuples_push_a_same_class_sample():
    y, a, p, n = tuples(1.0)
    assert (p == a).all() and (y[n] == y[a]).all() and (n != a).all()


def test_p_switch_is_the_switch_frequency():
    switched = total = 0
    for seed in range(200):
        _, a, p, _ = tuples(0.3, seed)
        switched += int((p == a).sum())
        total += len(a)
    assert abs(switched / total - 0.3) < 0.03  # 1,600 Bernoulli draws: sd ≈ 0.011


def test_distance_weights_are_inverse_sphere_density_with_cutoff():
    dim = 16
    d = torch.tensor([0.2, 0.5, 0.9, 1.4, 1.9], dtype=torch.float64)
    w = distance_weights(d, dim)

    def inv_q(t):  # Wu et al.: q(d) ∝ d^{n−2} (1 − d²/4)^{(n−3)/2}
        t = max(t, 0.5)
        return 1.0 / (t ** (dim - 2) * (1 - t * t / 4) ** ((dim - 3) / 2))

    ref = [inv_q(float(t)) for t in d]
    for got, want in zip(w.tolist(), ref, strict=True):
        assert got == pytest.approx(want / max(ref), rel=1e-9)
    assert w[0] == w[1]  # clamped at the lower cutoff 0.5
    assert math.isclose(float(w.max()), 1.0)


def _study(tmp_path: Path, loss: str, **extra) -> Path:
    doc = {
        "name": "s",
        "dataset": {"name": "glyphs"},
        "loss": {"name": loss},
        "strategy": {"name": "rho_distance"},
        **extra,
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_config_adds_the_strategy_space_and_checks_the_loss(tmp_path):
    r = load_study(_study(tmp_path, "contrastive"))
    assert set(r.space) == {"pos_margin", "neg_margin", "strategy.p_switch"}
    with pytest.raises(ConfigError, match="needs a tuple loss; loss 'mean_field_contrastive'"):
        load_study(_study(tmp_path, "mean_field_contrastive"))
    with pytest.raises(ConfigError, match="mines its own tuples: remove miner"):
        load_study(_study(tmp_path, "contrastive", miner={"name": "multi_similarity"}))
    with pytest.raises(ConfigError, match="strategy.name: unknown strategy 'rho'"):
        load_study(_study(tmp_path, "contrastive", strategy={"name": "rho"}))


@pytest.mark.parametrize("loss", ["contrastive", "multi_similarity", "proxy_anchor"])
def test_metrix_is_accepted_with_the_losses_it_supports(tmp_path, loss):
    r = load_study(_study(tmp_path, loss, strategy={"name": "metrix"}))
    assert any(k.startswith("strategy.") for k in {**r.space, **r.fixed})


def test_metrix_with_another_loss_is_refused_before_training(tmp_path):
    with pytest.raises(
        ConfigError,
        match="'metrix' works with the losses contrastive, multi_similarity, proxy_anchor; "
        "not 'triplet'",
    ):
        load_study(_study(tmp_path, "triplet", strategy={"name": "metrix"}))


@pytest.mark.parametrize("loss", ["contrastive", "triplet", "margin", "snr"])
def test_rho_distance_trains_tuple_losses_on_omniglot(loss, tmp_path, omniglot_ds):
    res = train_tiny_fold(
        omniglot_ds, tmp_path, loss, strategy="rho_distance", strategy_params={"p_switch": 0.4}
    )
    assert res.status == "complete"
