"""The host-sync census (issue #39): every registered loss, miner and strategy, one training step
on the CPU under a ``TorchDispatchMode`` that counts the ATen operations which make the host wait
for a GPU (tests/train/sync_census.py). mlrc's own code has none in the step; the libraries'
are counted by operation and origin, and docs/guide/performance.md's table says how many."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
import torch
from sync_census import SyncCensus, components, step_census

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "guide" / "performance.md"
COMPONENTS = components()
NOT_A_LIBRARY = {"mlrc", "test", "other", "unknown"}


# mlrc's own host syncs still in the step (issue #39: to remove; the guide's table says where).
# A component listed here fails once it has none: then take it off the list.
MLRC_SYNCS = {
    "loss `class_wise_multi_similarity`": "torch.unique and boolean masks in mean_field.py",
    "loss `mean_field_class_wise_multi_similarity`": "torch.unique, boolean masks (mean_field.py)",
    "loss `mean_field_contrastive`": "torch.unique, .item(), a boolean mask (mean_field.py)",
    "strategy `das`": ".item(), torch.unique, boolean masks (das.py)",
    "strategy `metrix`": ".item(), boolean masks, nonzero (metrix.py)",
    "strategy `rho_distance`": "nonzero and .item() per class (rho_distance.py)",
}


def documented() -> dict[str, tuple[int, int]]:
    """component label → (host syncs per step, of mlrc's own), as the guide's table says."""
    pattern = r"^\| ((?:loss|miner|strategy) `[^`]+`) \| (\d+) \| (\d+) \|"
    rows = re.finditer(pattern, DOC.read_text(), re.M)
    return {m.group(1): (int(m.group(2)), int(m.group(3))) for m in rows}


@pytest.mark.parametrize(("label", "loss", "spec"), COMPONENTS, ids=[c[0] for c in COMPONENTS])
def test_a_step_s_host_syncs_are_the_guide_s_and_none_is_mlrc_s_own(
    label, loss, spec, glyphs_ds, tmp_path
):
    census = step_census(glyphs_ds, tmp_path, loss, **spec)
    assert not {who for _, who, _ in census.counts} & (NOT_A_LIBRARY - {"mlrc"}), census.summary()
    docs = documented()
    assert label in docs, f"{DOC.name}'s census lacks {label} (python tests/train/sync_census.py)"
    own = sum(census.by_origin("mlrc").values())
    assert docs[label] == (sum(census.counts.values()), own), census.summary()
    if label in MLRC_SYNCS:
        assert own, f"{label} has no host sync of mlrc's own any more: take it off MLRC_SYNCS"
        pytest.xfail(f"mlrc's own host syncs: {MLRC_SYNCS[label]}")
    assert not own, f"mlrc syncs the host in the step: {census.summary()}"


def test_the_census_covers_every_registered_loss_miner_and_strategy():
    from mlrc.methods import losses, miners, strategies

    labels = {c[0] for c in COMPONENTS}
    for kind, names in (("loss", losses), ("miner", miners), ("strategy", strategies)):
        for name in names.available():
            if not name.startswith(("test_", "bench_")):
                assert f"{kind} `{name}`" in labels


def test_the_census_catches_each_kind_of_sync_and_names_who_called_it():
    """Each sync-making call counted once, by name, with this file as the origin; the same
    operations without a sync (long indices, output_size, three-argument where) not at all;
    a library's call named after the library."""
    from pytorch_metric_learning.utils import loss_and_miner_utils as lmu

    x = torch.tensor([0.5, -1.0, 2.0, 2.0])
    mask, labels = x > 0, torch.tensor([0, 0, 1, 1])
    with SyncCensus() as census:
        here = census
        torch.nonzero(x)
        torch.where(mask)
        _ = x[mask]
        x.masked_select(mask)
        x.sum().item()
        torch.unique(x)
        torch.tensor([1, 2]).repeat_interleave(torch.tensor([1, 2]))
        torch.bincount(labels)
        # no sync: long indices, a known output size, the three-argument where, reductions
        _ = x[torch.tensor([0, 2])]
        torch.tensor([1, 2]).repeat_interleave(torch.tensor([1, 2]), output_size=3)
        torch.where(mask, x, -x).sum()
        lmu.get_all_pairs_indices(labels)
    mine = Counter()
    for (op, who, _where), n in here.counts.items():
        mine[op] += n if who == "test" else 0
    assert mine == {
        "nonzero": 2,
        "index (boolean mask)": 1,
        "masked_select": 1,
        "_local_scalar_dense": 1,
        "_unique2": 1,
        "repeat_interleave (no output_size)": 1,
        "bincount": 1,
    }
    assert all(where.startswith("tests/train/test_sync_census.py:") for (_, who, where) in
               here.counts if who == "test")  # fmt: skip
    theirs = here.by_origin("pytorch_metric_learning")
    assert theirs and all(op == "nonzero" for op, _, _ in theirs), here.summary()
