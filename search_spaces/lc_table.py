"""The discrete CNN space of the MNIST-1D learning-curve table (`benchmarks/data/mnist1d_cnn_curves.parquet`).

A grid over `search_spaces.cnn`'s space on MNIST-1D: depth, width (every block alike), a wide log grid of learning
rates, batch size and weight decay; kernel 5, ReLU, pooling, a hidden head of 64 units and momentum 0.9 are fixed. Every one
of its `len(configs())` configurations was trained `EPOCHS` epochs by `benchmarks/lc_table_build.py`;
`trainers.lc_table:LCTable` replays them.

    from search_spaces.lc_table import space
    config = space.sample(np.random.default_rng(0))   # e.g. {"depth": 2, "channels": 64, ..., "lr": 0.01, ...}
"""

from __future__ import annotations

import itertools
from typing import Any

from nasplat.space import Choice, Config, Space

EPOCHS = 27  # epochs each configuration of the table was trained
TRAIN_SIZE = 1000  # training signals (of MNIST-1D's 3,200 in the training share), as in benchmarks/multifidelity.py
SEED = 0  # the trial seed of every configuration (same initialisation and data order for equal architectures)

GRID: dict[str, list[Any]] = {
    "depth": [1, 2, 3],
    "channels": [16, 64],
    "lr": [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.3],
    "batch_size": [32, 128],
    "weight_decay": [1e-5, 1e-3],
}
"""Each decision's options, in order (the table's columns of the same names)."""

FIXED: dict[str, Any] = {"kernel": 5, "activation": "relu", "pool": True, "head": 64, "momentum": 0.9}
"""What every configuration of the table shares."""

space = Space({key: Choice(options) for key, options in GRID.items()})
"""The table's space: every configuration of it is in the table."""


def configs() -> list[Config]:
    """Every configuration of `space`, in grid order."""
    return [dict(zip(GRID, values)) for values in itertools.product(*GRID.values())]


def cnn_config(config: Config) -> Config:
    """The `trainers.classification:ClassificationTrainer` config on MNIST-1D that `config` stands for."""
    block = {"channels": config["channels"], "kernel": FIXED["kernel"], "activation": FIXED["activation"],
             "pool": FIXED["pool"]}
    depth = {"n": config["depth"], **{f"layer{i}": dict(block) for i in range(config["depth"])}}
    return {"depth": depth, "head": FIXED["head"], "lr": config["lr"], "momentum": FIXED["momentum"],
            "batch_size": config["batch_size"], "weight_decay": config["weight_decay"], "dataset": "mnist1d",
            "train_size": TRAIN_SIZE}
