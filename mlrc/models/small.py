"""Small CPU trunks for tests and the ``cpu`` preset: ``small_cnn`` (256-D) and ``tiny_cnn``
(128-D), random init only. Input and output conventions: :mod:`mlrc.models.base`."""

from __future__ import annotations

from torch import Tensor, nn

from mlrc.models.base import TRUNKS, InputSpec, Trunk, copy_spec

__all__ = ["SmallCNN", "small_cnn", "tiny_cnn"]


class SmallCNN(Trunk):
    """4 × (Conv3x3 → BN → ReLU → MaxPool2), widths 32/64/128/256, global average pool: 256-D.

    Random init only. Any input of at least 16 × 16 px; RGB 0–1, mean 0.5, std 0.5.
    """

    output_size = 256
    input_spec: InputSpec = {
        "mean": [0.5, 0.5, 0.5],
        "std": [0.5, 0.5, 0.5],
        "input_range": 1,
        "bgr": False,
    }
    widths: tuple[int, ...] = (32, 64, 128, 256)

    def __init__(self, widths: tuple[int, ...] | None = None) -> None:
        super().__init__()
        self.widths = tuple(widths or self.widths)
        self.output_size = self.widths[-1]
        self.input_spec = copy_spec(SmallCNN.input_spec)
        layers: list[nn.Module] = []
        cin = 3
        for w in self.widths:
            layers += [
                nn.Conv2d(cin, w, kernel_size=3, padding=1, bias=False),
                nn.BatchNorm2d(w),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(2),
            ]
            cin = w
        self.body = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x: Tensor) -> Tensor:
        return self.pool(self.body(x)).flatten(1)


@TRUNKS.register("small_cnn")
def small_cnn(*, pretrained: bool | str = False) -> Trunk:
    """The CPU preset's trunk, 256-D, random init; any ``pretrained`` but False is an error."""
    if pretrained is not False:
        raise ValueError(
            f"trunk 'small_cnn' has no pretrained weights (got pretrained={pretrained!r}); "
            "use pretrained=False"
        )
    return SmallCNN()


@TRUNKS.register("tiny_cnn")
def tiny_cnn(*, pretrained: bool | str = False) -> Trunk:
    """``small_cnn`` at half width (16/32/64/128 → 128-D): the ``cpu`` preset's trunk."""
    if pretrained is not False:
        raise ValueError(
            f"trunk 'tiny_cnn' has no pretrained weights (got pretrained={pretrained!r}); "
            "use pretrained=False"
        )
    return SmallCNN(widths=(16, 32, 64, 128))
