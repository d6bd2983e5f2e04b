"""Whether a loss takes a miner's tuples is declared on registration (``takes_tuples=…``) and read
from there; a plug-in that declares nothing is probed (built with 2 classes, ``indices_tuple`` in
its ``forward``), as every loss was before declarations existed."""

from __future__ import annotations

import inspect

import pytest
import yaml
from pytorch_metric_learning import losses as L
from torch import Tensor, nn

from mlrc.config import ConfigError, load_study
from mlrc.methods import losses

BUILT_IN = [n for n in losses.available() if losses.LOSSES.source(n) == "mlrc"]


def test_there_are_built_in_losses_of_both_kinds():
    declared = {losses.info(n).takes_tuples for n in BUILT_IN}
    assert len(BUILT_IN) >= 20 and declared == {True, False}


@pytest.mark.parametrize("name", BUILT_IN)
def test_every_built_in_loss_declares_what_its_forward_takes(name):
    """The declaration is the probe's answer, the probe being today's independent reference:
    the built loss's ``forward`` signature."""
    declared = losses.info(name).takes_tuples
    assert declared is not None, f"{name} does not declare takes_tuples"
    built = losses.build(name, num_classes=2, embedding_size=2)
    assert declared == ("indices_tuple" in inspect.signature(built.forward).parameters)
    assert declared == losses.probe_takes_tuples(name) == losses.takes_tuples(name)


class _NoTuples(nn.Module):
    def forward(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        return embeddings.sum() * 0


def _factory(cls: type[nn.Module]):
    def factory(*, num_classes: int, embedding_size: int, margin: float = 0.1) -> nn.Module:
        return cls()

    return factory


@pytest.fixture
def throwaway_losses():
    """Four throwaway losses: a PML loss (whose forward takes tuples) declared False and left
    undeclared, and a loss without tuples declared True and left undeclared."""
    made = {
        "test_pml_declared_false": (L.ContrastiveLoss, False),
        "test_pml_undeclared": (L.ContrastiveLoss, None),
        "test_plain_declared_true": (_NoTuples, True),
        "test_plain_undeclared": (_NoTuples, None),
    }
    for name, (cls, declared) in made.items():
        losses.register(name, batch="pair", takes_tuples=declared)(_factory(cls))
    yield made
    for name in made:
        losses.LOSSES.unregister(name)


def _with_miner(tmp_path, loss: str):
    doc = {
        "name": "s",
        "dataset": {"name": "glyphs"},
        "loss": {"name": loss, "search": {"margin": {"low": 0.1, "high": 0.5}}},
        "miner": {"name": "multi_similarity"},
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_the_declaration_wins_over_the_forward_and_an_undeclared_loss_is_probed(
    tmp_path, throwaway_losses
):
    assert losses.takes_tuples("test_pml_declared_false") is False  # its forward says True
    assert losses.takes_tuples("test_plain_declared_true") is True  # its forward says False
    assert losses.takes_tuples("test_pml_undeclared") is True  # probed
    assert losses.takes_tuples("test_plain_undeclared") is False  # probed


@pytest.mark.parametrize(
    ("loss", "refused"),
    [
        ("test_pml_declared_false", True),
        ("test_plain_declared_true", False),
        ("test_pml_undeclared", False),
        ("test_plain_undeclared", True),
    ],
)
def test_a_study_with_a_miner_follows_the_declaration(tmp_path, throwaway_losses, loss, refused):
    path = _with_miner(tmp_path, loss)
    if refused:
        with pytest.raises(ConfigError, match=f"miner: loss '{loss}' does not use a miner's pairs"):
            load_study(path)
    else:
        assert "miner.epsilon" in load_study(path).space
