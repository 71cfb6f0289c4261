"""A macro CNN search space for small inputs (8x8 digits, 40-sample MNIST-1D signals) and its model builder.

A config picks a depth of 1-3 conv blocks; each block's width, kernel, activation and pooling exist only
up to that depth (a `Choice` of dicts: conditional parameters). The same config builds a `Conv2d` model
for images and a `Conv1d` model for sequences: `build_model` reads the dimensionality from `input_shape`.

    config = space.sample(np.random.default_rng(0))
    model = build_model(config, in_channels=1, num_classes=10, input_shape=(8, 8))
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from nasplat.space import Choice, Float, Space

CHANNELS = [8, 16, 32, 64]
KERNELS = [3, 5]
ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh}
HEAD_WIDTHS = [0, 32, 64, 128]  # 0: a linear classifier straight on the flattened features
MAX_DEPTH = 3

ARCHITECTURE_KEYS = ("depth", "head")  # what `build_model` reads; the rest of a config is optimisation


def layer_space() -> dict[str, Any]:
    """The decisions of one conv block."""
    return {
        "channels": Choice(CHANNELS),
        "kernel": Choice(KERNELS),
        "activation": Choice(list(ACTIVATIONS)),
        "pool": Choice([False, True]),
    }


def depth_options(max_depth: int = MAX_DEPTH) -> list[dict[str, Any]]:
    """One option per depth n: {"n": n, "layer0": {...}, ..., "layer{n-1}": {...}}."""
    return [{"n": n, **{f"layer{i}": layer_space() for i in range(n)}} for n in range(1, max_depth + 1)]


space = Space({
    "depth": Choice(depth_options()),
    "head": Choice(HEAD_WIDTHS),
    "lr": Float(1e-3, 3e-1, log=True),
    "momentum": Float(0.5, 0.99),
    "batch_size": Choice([32, 64, 128]),
    "weight_decay": Float(1e-6, 1e-3, log=True),
})
"""The search space for `trainers.classification:ClassificationTrainer` on sklearn's digits."""

space_1d = Space({**space.domains, "dataset": "mnist1d"})
"""The same space on MNIST-1D: the constant `dataset` key tells the trainer to build `Conv1d` models."""

PBT_ARCHITECTURE: dict[str, Any] = {
    "n": 2,
    "layer0": {"channels": 32, "kernel": 3, "activation": "relu", "pool": False},
    "layer1": {"channels": 32, "kernel": 3, "activation": "relu", "pool": True},
}

pbt_space = Space({
    "depth": PBT_ARCHITECTURE,  # a fixed sub-space: PBT's perturbations never touch the architecture
    "head": 64,
    "lr": Float(1e-3, 3e-1, log=True),
    "momentum": Float(0.5, 0.99),
    "batch_size": 64,
    "weight_decay": 1e-4,
})
"""Learning rate and momentum over one fixed architecture, for population based training."""


def architecture(config: Mapping[str, Any]) -> dict[str, Any]:
    """The part of `config` that determines the model (two configs with equal architectures share weights)."""
    missing = [key for key in ARCHITECTURE_KEYS if key not in config]
    if missing:
        raise ValueError(f"config lacks the architecture keys {missing}; need {list(ARCHITECTURE_KEYS)}, "
                         f"got keys {sorted(config)}")
    return {key: config[key] for key in ARCHITECTURE_KEYS}


class ConvBlock(nn.Module):
    """conv (size-preserving padding) -> batch norm -> activation -> optional 2x max-pool."""

    def __init__(self, dims: int, in_channels: int, out_channels: int, kernel: int, activation: str,
                 pool: bool) -> None:
        super().__init__()
        conv, norm, maxpool = (nn.Conv1d, nn.BatchNorm1d, nn.MaxPool1d) if dims == 1 else \
            (nn.Conv2d, nn.BatchNorm2d, nn.MaxPool2d)
        self.conv = conv(in_channels, out_channels, kernel, padding=kernel // 2, bias=False)
        self.norm = norm(out_channels)
        self.act = ACTIVATIONS[activation]()
        self.pool = maxpool(2) if pool else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.act(self.norm(self.conv(x))))


class CNN(nn.Module):
    """A stack of `ConvBlock`s, flattened into a classifier head (one hidden layer or none)."""

    def __init__(self, blocks: list[ConvBlock], features: int, head: int, num_classes: int) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*blocks)
        if head:
            self.head = nn.Sequential(nn.Flatten(), nn.Linear(features, head), nn.ReLU(), nn.Linear(head, num_classes))
        else:
            self.head = nn.Sequential(nn.Flatten(), nn.Linear(features, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x))


def build_model(config: Mapping[str, Any], in_channels: int, num_classes: int, input_shape: Sequence[int]) -> CNN:
    """The CNN described by `config` for inputs of shape (batch, in_channels, *input_shape).

    `input_shape` is the spatial shape: (height, width) builds `Conv2d` blocks, (length,) builds `Conv1d`
    blocks. A block's pooling is skipped once the feature map is down to a size below 2.
    """
    input_shape = tuple(int(s) for s in input_shape)
    if len(input_shape) not in (1, 2) or min(input_shape, default=0) < 1:
        raise ValueError(f"`input_shape` must be (length,) or (height, width) with positive sizes, "
                         f"got {input_shape=}")
    depth, head = architecture(config)["depth"], config["head"]
    n = depth.get("n") if isinstance(depth, Mapping) else None
    if not isinstance(n, int) or not 1 <= n <= MAX_DEPTH:
        raise ValueError(f"'depth' must be a dict with 'n' in [1, {MAX_DEPTH}] and layer0..layer{{n-1}}, got {depth!r}")
    if head not in HEAD_WIDTHS:
        raise ValueError(f"'head' must be one of {HEAD_WIDTHS}, got {head!r}")

    blocks, channels, size = [], in_channels, list(input_shape)
    for i in range(n):
        layer = depth.get(f"layer{i}")
        if not isinstance(layer, Mapping):
            raise ValueError(f"'depth.layer{i}' is missing for depth n={n}; got keys {sorted(depth)}")
        if layer["activation"] not in ACTIVATIONS:
            raise ValueError(f"'depth.layer{i}.activation' must be one of {list(ACTIVATIONS)}, "
                             f"got {layer['activation']!r}")
        pool = bool(layer["pool"]) and min(size) >= 2
        blocks.append(ConvBlock(len(input_shape), channels, int(layer["channels"]), int(layer["kernel"]),
                                layer["activation"], pool))
        channels = int(layer["channels"])
        size = [s // 2 for s in size] if pool else size
    return CNN(blocks, channels * math.prod(size), int(head), num_classes)
