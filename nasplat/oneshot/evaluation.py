"""Judging a path of a supernet by the weights it inherits.

`evaluate_path` extracts a path, recalibrates its batch-norm statistics on a few training batches
(`recalibrate_bn`) and measures it (`measure`): milliseconds on CPU, the supernet's tensors never written, so a
shared read-only supernet serves any number of searches. `Splits` is the shape of the data it reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from nasplat.core.checks import check_int
from nasplat.oneshot.supernet import extract
from nasplat.space import Config


class Splits(Protocol):
    """Data as `trainers.classification.Data` holds it: tensors `x_*` (n, channels, ...) and `y_*` (class indices),
    read only (a frozen dataclass fits)."""

    @property
    def x_train(self) -> torch.Tensor: ...
    @property
    def y_train(self) -> torch.Tensor: ...
    @property
    def x_valid(self) -> torch.Tensor: ...
    @property
    def y_valid(self) -> torch.Tensor: ...


BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


@torch.no_grad()
def recalibrate_bn(model: nn.Module, x: torch.Tensor, *, batch_size: int = 256) -> None:
    """Replace the running statistics of every batch norm of `model` by the exact mean and variance over `x` (forward
    in train mode, without gradients, in batches of `batch_size`); the model's mode and momenta are restored."""
    norms = [m for m in model.modules() if isinstance(m, BATCH_NORMS) and m.track_running_stats]
    momenta = [m.momentum for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # cumulative average: the statistics of all batches seen, equally weighted
    was_training = model.training
    model.train()
    try:
        for start in range(0, len(x), batch_size):
            model(x[start:start + batch_size])
    finally:
        model.train(was_training)
        for m, momentum in zip(norms, momenta):
            m.momentum = momentum


@torch.no_grad()
def measure(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, batch_size: int = 1024) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) of `model` in eval mode on `x`, `y`."""
    was_training = model.training
    model.eval()
    logits = torch.cat([model(x[s:s + batch_size]) for s in range(0, len(x), batch_size)])
    model.train(was_training)
    return F.cross_entropy(logits, y).item(), (logits.argmax(dim=1) == y).float().mean().item()


def evaluate_path(supernet: nn.Module, config: Config, data: Splits, *, splits: Sequence[str] = ("valid",),
                  bn_batches: int = 4, batch_size: int = 256) -> dict[str, float]:
    """The path `config` with the supernet's weights: `{split}_acc` and `{split}_loss` for each of `splits`
    (`"valid"`, `"test"`: attributes `x_{split}`, `y_{split}` of `data`) and `params` (the path's parameter count).

    The path is extracted (a copy of its weights only: the supernet is not written), its batch-norm statistics are
    recomputed on the first `bn_batches * batch_size` training samples (0: keep the supernet's running statistics),
    then it is measured in eval mode. Deterministic: the same config and weights give the same numbers."""
    check_int("bn_batches", bn_batches, minimum=0)
    check_int("batch_size", batch_size, minimum=1)
    device = next(supernet.parameters()).device
    subnet = extract(supernet, config)
    if bn_batches:
        recalibrate_bn(subnet, data.x_train[:bn_batches * batch_size].to(device), batch_size=batch_size)
    out: dict[str, float] = {}
    for split in splits:
        x, y = getattr(data, f"x_{split}").to(device), getattr(data, f"y_{split}").to(device)
        out[f"{split}_loss"], out[f"{split}_acc"] = measure(subnet, x, y)
    out["params"] = float(sum(p.numel() for p in subnet.parameters()))
    return out
