"""One NAS-Bench-201 cell on MNIST-1D (or digits) trained standalone from scratch: the recipe a one-shot search's
chosen cell is retrained with (`nasplat retrain`), and the one `benchmarks/oneshot.py` builds its ground truth with."""

from __future__ import annotations

import math
from typing import Any

import torch

from nasplat.core.checks import check_int, check_real
from nasplat.oneshot.training import check_epoch_budget
from nasplat.space import Config, Space
from nasplat.trainer import WorkerContext
from search_spaces import nb201
from search_spaces.nb201_supernet import build_subnet
from trainers.classification import ClassificationTrainer
from trainers.supernet import signal_data


class NB201CellTrainer(ClassificationTrainer):
    """Trains the cell its config names (the six edges of `search_spaces.nb201`) as a standalone network: SGD with
    momentum 0.9 and Nesterov, cosine learning rate over `epochs`, one epoch a step, `done` after the last.

    Config keys beside the edges (all optional): `epochs` (10), `lr` (0.05), `weight_decay` (3e-4), `batch_size`
    (64), `channels` (16), `cells_per_stage` (1), `dataset` (`"mnist1d"`; `"digits"` as 8 signals of length 8),
    `train_size` (all). Reports `train_loss`, `valid_acc` / `valid_loss` (search on these), `test_acc` /
    `test_loss` (to report only), `epoch` and `params`. Deterministic for a given seed (one torch thread)."""

    dataset = "mnist1d"
    DEFAULT_EPOCHS = 10

    @classmethod
    def check_experiment(cls, space: Space, *, max_steps: int) -> None:
        """Refuse an `epochs` (default 10) beyond `max_steps`: the cosine schedule would be cut short."""
        check_epoch_budget(cls.__name__, space, max_steps, cls.DEFAULT_EPOCHS)

    def setup(self, config: Config, ctx: WorkerContext) -> None:
        torch.set_num_threads(1)
        self.config, self.ctx = config, ctx
        self.cell = {edge: config[edge] for edge in nb201.EDGES}
        nb201.space.validate(self.cell)
        self.dataset_name = config.get("dataset", self.dataset)
        self.data = signal_data(self.dataset_name)
        self.epochs = check_int("epochs", config.get("epochs", self.DEFAULT_EPOCHS), minimum=1)
        self.lr = check_real("lr", config.get("lr", 0.05), minimum=0, strict=True)
        self.batch_size = check_int("batch_size", config.get("batch_size", 64), minimum=1)
        self.epochs_per_step = 1
        available = len(self.data.y_train)
        n = check_int("train_size", config.get("train_size", available), minimum=1, maximum=available)
        self.x_train, self.y_train = ctx.shard(self.data.x_train[:n]), ctx.shard(self.data.y_train[:n])
        torch.manual_seed(ctx.seed)
        self.net = build_subnet(self.cell, self.data.in_channels, self.data.num_classes,
                                channels=check_int("channels", config.get("channels", 16), minimum=1),
                                cells_per_stage=check_int("cells_per_stage", config.get("cells_per_stage", 1),
                                                          minimum=1)).to(ctx.device)
        decay = check_real("weight_decay", config.get("weight_decay", 3e-4), minimum=0)
        optimizer = torch.optim.SGD(self.net.parameters(), lr=self.lr, momentum=0.9, nesterov=True,
                                    weight_decay=decay)
        self.model, self.optimizer = ctx.prepare(self.net, optimizer)
        self.epoch = 0

    def step(self) -> dict[str, Any]:
        for group in self.optimizer.param_groups:
            group["lr"] = 0.5 * self.lr * (1.0 + math.cos(math.pi * self.epoch / self.epochs))
        train_loss = self.train_epoch()
        return {"train_loss": train_loss, **self.evaluation_metrics(), "epoch": float(self.epoch),
                "params": float(sum(p.numel() for p in self.net.parameters())), "done": self.epoch >= self.epochs}

    def update_config(self, config: Config) -> None:
        """A new config is a new network: rebuilt (the `Trainer` default)."""
        super(ClassificationTrainer, self).update_config(config)
