"""Views of a dataset (some classes, one transform) and embedding them in order."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from mlrc.data.base import ImageDataset
from mlrc.data.transforms import batch_to_trunk_input
from mlrc.errors import raise_if_stopped
from mlrc.train.loaders import CheckedLoader, ignore_stop_signals
from mlrc.train.model import Model


class View(Dataset):
    """Samples of some classes, with a transform and labels remapped to 0..n−1 (for the loss)."""

    def __init__(self, ds: ImageDataset, classes: Sequence[int], transform: Callable) -> None:
        classes = np.asarray(sorted(classes))
        self.ds, self.transform = ds, transform
        self.indices = np.flatnonzero(np.isin(ds.labels, classes))
        self.labels = np.searchsorted(classes, ds.labels[self.indices])

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.transform(self.ds.load_image(int(self.indices[i]))), int(self.labels[i])


class IndexedView(Dataset):
    """(image, label, position in the view): lets memory-bank samplers update their rows."""

    def __init__(self, view: View) -> None:
        self.view = view

    def __len__(self) -> int:
        return len(self.view)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, int]:
        return (*self.view[i], i)


def embed(
    model: Model,
    dataset: Dataset | Iterable,
    batch_size: int,
    device: str,
    num_workers: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Embeddings (n × d float32, not normalised) and labels (n,) of ``dataset``, in order, as
    numpy arrays: :func:`embed_tensors`, copied to the host once at the end."""
    emb, labels = embed_tensors(model, dataset, batch_size, device, num_workers)
    return emb.cpu().numpy(), labels.numpy()


@torch.no_grad()
def embed_tensors(
    model: Model,
    dataset: Dataset | Iterable,
    batch_size: int,
    device: str,
    num_workers: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Embeddings (n × d float32 on ``device``, not normalised) and labels (n, int64, on the
    CPU as the loader gives them) of ``dataset``, in order. The embeddings stay on the device
    (no copy per batch), so the host does not wait for the model until the caller reads them.
    A ready loader (a ``DataLoader`` or :class:`~mlrc.train.loaders.FoldLoader`, with a
    ``pin_memory`` attribute) is used as given."""
    model.eval()
    out, labels = [], []
    loader = (
        CheckedLoader(
            dataset,
            batch_size=batch_size,
            num_workers=num_workers,
            worker_init_fn=ignore_stop_signals,
        )
        if isinstance(dataset, Dataset)
        else dataset  # a ready loader: a DataLoader or a FoldLoader
    )
    for x, y in loader:
        raise_if_stopped()  # a stop signal's safe point: each evaluation batch
        x = batch_to_trunk_input(x, model.trunk.input_spec, device, loader.pin_memory)
        out.append(model(x).float())
        labels.append(y)
    return torch.cat(out), torch.cat(labels)
