"""The NAS-Bench-201 cell: 6 edges of a 4-node DAG, each one of 5 operations (15,625 cells).

Conversion to and from the benchmark's arch string, and a PyTorch network builder for small images
(stem conv, three stages of stacked cells with residual reduction blocks between them, global pooling).
"""

from __future__ import annotations

import torch
from torch import nn

from nasplat.space import Choice, Config, Space

OPS = ("none", "skip_connect", "nor_conv_1x1", "nor_conv_3x3", "avg_pool_3x3")
# Edge "i<-j": node i takes input node j. Node 1 <- 0; node 2 <- 0, 1; node 3 <- 0, 1, 2.
EDGES = ("1<-0", "2<-0", "2<-1", "3<-0", "3<-1", "3<-2")

space = Space({edge: Choice(list(OPS)) for edge in EDGES})
"""All 15,625 cells, as the benchmark's published search protocol samples them."""

CUT_OFF = "no path from input to output"


def cut_off(config: Config) -> bool:
    """Whether every path from the input (node 0) to the output (node 3) goes through a 'none' edge:
    such a cell outputs zeros whatever its weights."""
    reached = {0}
    for target in (1, 2, 3):
        if any(config[f"{target}<-{src}"] != "none" and src in reached for src in range(target)):
            reached.add(target)
    return 3 not in reached


connected_space = Space(space.domains, forbidden={CUT_OFF: cut_off})
"""The cells with a path from input to output (opt-in: not the benchmark's protocol)."""


def space_for(dataset: str, *, connected: bool = False) -> Space:
    """The cell space with the dataset fixed as a constant (read by `trainers.nb201_table.NB201Table`);
    `connected=True` forbids the cut-off cells."""
    return Space({**space.domains, "dataset": dataset}, forbidden={CUT_OFF: cut_off} if connected else None)


def to_arch_str(config: Config) -> str:
    """`{"1<-0": "nor_conv_3x3", ...}` -> `|nor_conv_3x3~0|+|...~0|...~1|+|...|`."""
    space.validate(config)
    nodes = []
    for target in (1, 2, 3):
        nodes.append("|" + "|".join(f"{config[f'{target}<-{src}']}~{src}" for src in range(target)) + "|")
    return "+".join(nodes)


def from_arch_str(arch: str) -> Config:
    """Inverse of `to_arch_str`; a malformed string raises `ValueError` naming it."""
    nodes = arch.split("+")
    if len(nodes) != 3:
        raise ValueError(f"an NAS-Bench-201 arch string has 3 nodes separated by '+', got {arch!r}")
    config: Config = {}
    for target, node in enumerate(nodes, start=1):
        parts = [p for p in node.strip("|").split("|") if p]
        if len(parts) != target:
            raise ValueError(f"node {target} of {arch!r} must have {target} inputs, got {parts!r}")
        for part in parts:
            op, _, src = part.partition("~")
            if op not in OPS or not src.isdigit() or int(src) >= target:
                raise ValueError(f"bad edge {part!r} in {arch!r}: expected 'op~k' with op in {OPS} and k < {target}")
            config[f"{target}<-{src}"] = op
    return {edge: config[edge] for edge in EDGES}


def _op(name: str, channels: int) -> nn.Module:
    if name == "none":
        return _Zero()
    if name == "skip_connect":
        return nn.Identity()
    if name == "avg_pool_3x3":
        return nn.AvgPool2d(3, stride=1, padding=1)
    kernel = 1 if name == "nor_conv_1x1" else 3
    return nn.Sequential(nn.ReLU(), nn.Conv2d(channels, channels, kernel, padding=kernel // 2, bias=False),
                         nn.BatchNorm2d(channels))


class _Zero(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 0.0


class Cell(nn.Module):
    """One NAS-Bench-201 cell: node i is the sum of its incoming edges' operations."""

    def __init__(self, config: Config, channels: int) -> None:
        super().__init__()
        self.edges = nn.ModuleDict({edge.replace("<-", "_"): _op(config[edge], channels) for edge in EDGES})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        nodes = [x]
        for target in (1, 2, 3):
            nodes.append(sum(self.edges[f"{target}_{src}"](nodes[src]) for src in range(target)))
        return nodes[3]


class Reduction(nn.Module):
    """A residual block that halves the resolution and doubles the channels."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.ReLU(), nn.Conv2d(c_in, c_out, 3, stride=2, padding=1, bias=False),
                                  nn.BatchNorm2d(c_out), nn.ReLU(), nn.Conv2d(c_out, c_out, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(c_out))
        self.shortcut = nn.Sequential(nn.AvgPool2d(2, stride=2), nn.Conv2d(c_in, c_out, 1, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) + self.shortcut(x)


def build_network(config: Config, *, in_channels: int = 3, num_classes: int = 10, channels: int = 16,
                  cells_per_stage: int = 5) -> nn.Module:
    """The benchmark's macro skeleton (C=16, N=5 by default) around the cell `config`."""
    layers: list[nn.Module] = [nn.Conv2d(in_channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels)]
    c = channels
    for stage in range(3):
        if stage > 0:
            layers.append(Reduction(c, 2 * c))
            c *= 2
        layers.extend(Cell(config, c) for _ in range(cells_per_stage))
    layers += [nn.BatchNorm2d(c), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, num_classes)]
    return nn.Sequential(*layers)
