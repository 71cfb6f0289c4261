"""The NAS-Bench-201 cell as a supernet for 1-D signals (MNIST-1D): 6 edges x 5 operations, 1-D convolutions.

Every cell of the network has the same 6 `ChoiceLayer`s, keyed by the edges of `search_spaces.nb201` (`"1<-0"`, ...)
with its operations as options, so `NB201Supernet().space()` has exactly the decisions of `search_spaces.nb201.space`
and every config of it (or of `connected_space`) is a path. The macro net is the benchmark's, made small: a stem
convolution, `stages` stages of `cells_per_stage` cells with a residual reduction (half the length, twice the
channels) between two stages, batch norm, ReLU, global average pooling and a linear head.
"""

from __future__ import annotations

import torch
from torch import nn

from nasplat.oneshot import ChoiceLayer, Supernet
from nasplat.space import Config
from search_spaces.nb201 import EDGES, OPS


class Zero(nn.Module):
    """The `none` operation: zeros of the input's shape (the edge is cut)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 0.0


def operation(name: str, channels: int) -> nn.Module:
    """One of `OPS` on `channels` channels, length kept: convolutions are ReLU-Conv1d-BN, the pool has stride 1."""
    if name == "none":
        return Zero()
    if name == "skip_connect":
        return nn.Identity()
    if name == "avg_pool_3x3":
        return nn.AvgPool1d(3, stride=1, padding=1, count_include_pad=False)
    if name in ("nor_conv_1x1", "nor_conv_3x3"):
        kernel = 1 if name == "nor_conv_1x1" else 3
        return nn.Sequential(nn.ReLU(), nn.Conv1d(channels, channels, kernel, padding=kernel // 2, bias=False),
                             nn.BatchNorm1d(channels))
    raise ValueError(f"unknown operation {name!r}; allowed: {list(OPS)}")


class Cell(nn.Module):
    """One NAS-Bench-201 cell whose every edge is a `ChoiceLayer` over `OPS`: node i sums its incoming edges."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.edges = nn.ModuleDict({edge.replace("<-", "_"): ChoiceLayer(edge, {op: operation(op, channels)
                                                                                for op in OPS}) for edge in EDGES})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        nodes = [x]
        for target in (1, 2, 3):
            node = self.edges[f"{target}_0"](nodes[0])
            for src in range(1, target):
                node = node + self.edges[f"{target}_{src}"](nodes[src])
            nodes.append(node)
        return nodes[3]


class Reduction(nn.Module):
    """The benchmark's residual reduction block in 1-D: halves the length, changes the channels."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.ReLU(), nn.Conv1d(c_in, c_out, 3, stride=2, padding=1, bias=False),
                                  nn.BatchNorm1d(c_out), nn.ReLU(), nn.Conv1d(c_out, c_out, 3, padding=1, bias=False),
                                  nn.BatchNorm1d(c_out))
        self.shortcut = nn.Sequential(nn.AvgPool1d(2, stride=2, ceil_mode=True), nn.Conv1d(c_in, c_out, 1, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) + self.shortcut(x)


class NB201Supernet(Supernet):
    """The NAS-Bench-201 supernet for signals of shape (in_channels, length): its space is `search_spaces.nb201`'s.

    The defaults (16 channels, 3 stages of one cell) train an epoch of MNIST-1D's 3,200 training signals in about a
    second on one CPU core; the benchmark's own skeleton is `channels=16, cells_per_stage=5`."""

    def __init__(self, in_channels: int = 1, num_classes: int = 10, *, channels: int = 16, cells_per_stage: int = 1,
                 stages: int = 3) -> None:
        super().__init__()
        if channels < 1 or cells_per_stage < 1 or stages < 1:
            raise ValueError(f"channels, cells_per_stage and stages must be >= 1, got {channels}, {cells_per_stage}, "
                             f"{stages}")
        layers: list[nn.Module] = [nn.Conv1d(in_channels, channels, 3, padding=1, bias=False),
                                   nn.BatchNorm1d(channels)]
        c = channels
        for stage in range(stages):
            if stage > 0:
                layers.append(Reduction(c, 2 * c))
                c *= 2
            layers.extend(Cell(c) for _ in range(cells_per_stage))
        self.body = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.BatchNorm1d(c), nn.ReLU(), nn.AdaptiveAvgPool1d(1), nn.Flatten(),
                                  nn.Linear(c, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def build_subnet(config: Config, in_channels: int = 1, num_classes: int = 10, **kwargs: int) -> nn.Module:
    """A freshly initialised standalone network of the cell `config` (for training from scratch): the path of a new
    supernet, extracted. `kwargs` as `NB201Supernet` takes them."""
    return NB201Supernet(in_channels, num_classes, **kwargs).extract(config)
