"""An epoch's training losses, summed on the device where they are computed and read back once
(:class:`LossTally`): the host does not wait for the device within an epoch."""

from __future__ import annotations

import torch

__all__ = ["LossTally", "first_nonfinite"]


class LossTally:
    """An epoch's training losses, summed where they are computed, read back only on demand.

    ``add`` queues device work only (no host sync): the loss, converted exactly to float64, is
    added to a float64 sum in order — the same roundings as summing ``loss.item()`` in Python,
    so the epoch mean is bit for bit what a Python float sum gives — and the 1-based iteration
    of the first non-finite loss is kept with ``torch.where`` (0 while every loss is finite).
    ``read`` copies both to the host in one transfer.
    """

    def __init__(self) -> None:
        self.sum: torch.Tensor | None = None  # float64 scalar, on the losses' device
        self.first_nonfinite: torch.Tensor | None = None  # int64 scalar, 0: none yet
        self.n = 0  # losses added

    def add(self, loss: torch.Tensor, it: int) -> None:
        """Add the loss of iteration ``it`` (a scalar tensor, not read)."""
        value = loss.detach()
        if self.sum is None:
            self.sum = torch.zeros((), dtype=torch.float64, device=value.device)
            self.first_nonfinite = torch.zeros((), dtype=torch.int64, device=value.device)
        fresh = ~torch.isfinite(value) & (self.first_nonfinite == 0)
        self.first_nonfinite = torch.where(fresh, it, self.first_nonfinite)
        self.sum += value.double()
        self.n += 1

    def read(self) -> tuple[float, int | None]:
        """(mean loss so far, first non-finite iteration or None): one device → host copy."""
        if self.sum is None:
            return 0.0, None
        total, bad = torch.stack([self.sum, self.first_nonfinite.double()]).tolist()
        return total / max(self.n, 1), (int(bad) if bad else None)


def first_nonfinite(tally: LossTally) -> int | None:
    """The tally's first non-finite iteration, or ``None`` (also when it cannot be read)."""
    try:
        return tally.read()[1] if tally.n else None
    except Exception:  # noqa: BLE001 — the caller re-raises the error that brought it here
        return None
