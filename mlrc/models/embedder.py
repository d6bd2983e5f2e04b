"""The embedding head that follows a trunk: one linear layer."""

from __future__ import annotations

from torch import Tensor, nn

__all__ = ["Embedder"]


class Embedder(nn.Module):
    """The embedding head: one ``nn.Linear(in_features, embedding_size)``, no ReLU, no norm.

    Any L2 normalisation belongs to the loss/distance, not here.
    """

    def __init__(self, in_features: int, embedding_size: int) -> None:
        super().__init__()
        self.in_features = in_features
        self.output_size = embedding_size
        self.linear = nn.Linear(in_features, embedding_size)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear(x)
