"""One-shot trials on the NAS-Bench-201 supernet for signals (`search_spaces.nb201_supernet`) with MNIST-1D or digits.

- `NB201SupernetTrainer`: trains the supernet with SPOS or FairNAS sampling (`nasplat.oneshot.SupernetTrainer`);
- `NB201DartsTrainer`: DARTS / GDAS over the same supernet (`nasplat.oneshot.DartsTrainer`);
- `NB201PathTrainer`: one path judged by a trained supernet's shared weights (`nasplat.oneshot.PathTrainer`): the
  supernet named in its config (`supernet: <the supernet experiment's folder>`), or made into a trial class with
  `nasplat.oneshot.search_trainer(NB201PathTrainer, weights, config)`;
- `NB201ProxyTrainer`: one untrained path scored by zero-cost proxies (`nasplat.oneshot.ProxyTrainer`).

Extra config keys of each (all optional): `dataset` (`"mnist1d"`, default, or `"digits"`, whose 8x8 images are read
as 8 channels of length 8), `channels` (16), `cells_per_stage` (1), `connected` (False; True: paths are the cells
of `search_spaces.nb201.connected_space`, the cut-off cells never trained or evaluated). Data come from
`trainers.classification.load_dataset` (the validation split held out of training; test only to report).
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

from nasplat.core.checks import check_int
from nasplat.oneshot import DartsTrainer, PathTrainer, ProxyTrainer, Supernet, SupernetTrainer
from nasplat.oneshot.evaluation import Splits
from nasplat.space import Config, Space
from search_spaces import nb201
from search_spaces.nb201_supernet import NB201Supernet
from trainers.classification import Data, load_dataset


def signal_data(name: str) -> Data:
    """`load_dataset(name)` shaped as 1-D signals (n, channels, length): digits' rows become 8 channels."""
    data = load_dataset(name)
    if data.x_train.dim() == 3:
        return data
    return replace(data, **{f"x_{s}": getattr(data, f"x_{s}").squeeze(1) for s in ("train", "valid", "test")})


class _NB201:
    """The data, the supernet and the path space these trainers share (a mixin before the trainer class), and the
    standalone recipe a chosen cell is retrained with (`nasplat retrain`)."""

    RETRAIN_TRAINER: ClassVar[str | None] = "trainers.nb201_cell:NB201CellTrainer"
    SETTINGS: ClassVar[tuple[str, ...]] = ("dataset", "channels", "cells_per_stage", "connected")
    """The keys that build the network and its data: a search's retrain is built with them (`nasplat retrain`)."""

    def load_data(self, config: Config) -> Splits:
        return signal_data(config.get("dataset", "mnist1d"))

    def build_supernet(self, config: Config, data: Splits) -> Supernet:
        assert isinstance(data, Data)
        return NB201Supernet(data.in_channels, data.num_classes,
                             channels=check_int("channels", config.get("channels", 16), minimum=1),
                             cells_per_stage=check_int("cells_per_stage", config.get("cells_per_stage", 1), minimum=1))

    def path_space(self, config: Config, supernet: Supernet) -> Space:
        return nb201.connected_space if config.get("connected", False) else nb201.space


class NB201SupernetTrainer(_NB201, SupernetTrainer):
    """SPOS / FairNAS training of the NAS-Bench-201 supernet on MNIST-1D (see `nasplat.oneshot.SupernetTrainer`)."""


class NB201DartsTrainer(_NB201, DartsTrainer):
    """DARTS / GDAS over the NAS-Bench-201 supernet on MNIST-1D (see `nasplat.oneshot.DartsTrainer`).

    `arch_lr` defaults to 3e-2: an epoch of MNIST-1D is 25 alpha steps, so a search of tens of epochs makes a few
    hundred, where the papers' 3e-4 (for ~100k steps on CIFAR) leaves alpha where it started."""

    ARCH_LR = 3e-2


class NB201PathTrainer(_NB201, PathTrainer):
    """A path of the NAS-Bench-201 supernet judged by shared trained weights (see `nasplat.oneshot.PathTrainer`)."""


class NB201ProxyTrainer(_NB201, ProxyTrainer):
    """A path of the NAS-Bench-201 supernet scored untrained by zero-cost proxies (`nasplat.oneshot.ProxyTrainer`)."""
