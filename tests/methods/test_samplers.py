"""Batch samplers: registry, SPC-R's batches, the study key, a fold trained with each sampler."""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from conftest import train_tiny_fold

from mlrc.config import ConfigError, load_study
from mlrc.methods import samplers


def test_registry_has_the_label_samplers():
    assert {"m_per_class", "spc_random"} <= set(samplers.available())


def test_spc_random_batches():
    labels = np.repeat(np.arange(30), [2 + (c % 5) for c in range(30)])
    s = samplers.build("spc_random", labels=labels, batch_size=32, m=4, iterations=300, seed=0)
    n_classes = []
    for batch in s:
        assert len(batch) == 32
        y = labels[batch]
        assert y[-1] in set(y[:-1].tolist())  # the last item guarantees a positive pair
        n_classes.append(len(set(y.tolist())))
    assert len(set(n_classes)) > 3  # the number of classes per batch varies
    # the first b − 1 items are drawn class-uniformly: class frequencies ≈ 1/30 each
    counts = np.bincount(np.concatenate([labels[b[:-1]] for b in s]), minlength=30)
    assert counts.min() / counts.max() > 0.7


def test_state_round_trip_for_spc_random():
    labels = np.repeat(np.arange(10), 3)
    a = samplers.build("spc_random", labels=labels, batch_size=8, m=1, iterations=4, seed=1)
    list(a)
    state = a.state()
    rest = list(a)
    b = samplers.build("spc_random", labels=labels, batch_size=8, m=1, iterations=4, seed=7)
    b.set_state(state)
    assert list(b) == rest


def _study(tmp_path, sampler):
    path = tmp_path / "s.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "s",
                "dataset": {"name": "glyphs"},
                "loss": {"name": "contrastive"},
                "sampler": sampler,
            }
        )
    )
    return path


def test_study_key(tmp_path):
    assert load_study(_study(tmp_path, {"name": "spc_random"})).study.sampler.name == "spc_random"
    with pytest.raises(ConfigError, match="sampler.name: unknown sampler 'spc'"):
        load_study(_study(tmp_path, {"name": "spc"}))
    with pytest.raises(ConfigError, match="sampler.params.m: sampler 'spc_random' takes no"):
        load_study(_study(tmp_path, {"name": "spc_random", "params": {"m": 2}}))


@pytest.mark.parametrize("name", [n for n in samplers.available()])
def test_each_sampler_trains_a_fold(name, glyphs_ds, tmp_path):
    res = train_tiny_fold(glyphs_ds, tmp_path, sampler=name)
    assert res.status == "complete"
