"""Image / signal classification with the CNNs of `search_spaces.cnn`: sklearn digits (8x8) or MNIST-1D (40).

One `step` is `epochs_per_step` epochs of SGD over this worker's shard of the training set, then an
evaluation on the validation set (held out of the training set, stratified, with a fixed seed) and on the test set.
Search on `valid_acc`: `test_acc` is reported only to be looked at, never to select architectures on. Both data
sets are built offline and deterministically, once per process (MNIST-1D's signals are also kept in a cache folder).
"""

from __future__ import annotations

import os
import random
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F

from nasplat.space import Config
from nasplat.storage.files import write_atomic
from nasplat.trainer import Trainer, WorkerContext
from search_spaces.cnn import architecture, build_model

DATASETS = ("digits", "mnist1d")
SPLIT_SEED = 0  # the train/validation/test split is fixed, independent of the trial seed
VALID_FRACTION = 0.2  # of the training set, held out for selection


@dataclass(frozen=True)
class Data:
    """Standardised tensors: x of shape (n, channels, *spatial), y of class indices. The validation set is a
    stratified share of the original training set; the test set is never used for search."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_valid: torch.Tensor
    y_valid: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int

    @property
    def in_channels(self) -> int:
        return self.x_train.shape[1]

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[2:])


_CACHE: dict[str, Data] = {}


def load_dataset(name: str) -> Data:
    """The data set `name` (one of `DATASETS`), built on first use and cached for this process."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; allowed: {list(DATASETS)}")
    if name not in _CACHE:
        _CACHE[name] = _load_digits() if name == "digits" else _load_mnist1d()
    return _CACHE[name]


def _load_digits() -> Data:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)  # 1,797 images of 8x8 pixels in [0, 16]
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=360, stratify=y, random_state=SPLIT_SEED)
    return _split_and_standardise(x_train, y_train, x_test, y_test, shape=(1, 8, 8))


def _load_mnist1d() -> Data:
    data = _mnist1d_arrays()
    return _split_and_standardise(data["x"], data["y"], data["x_test"], data["y_test"], shape=(1, 40))


def _mnist1d_arrays() -> dict[str, np.ndarray]:
    """MNIST-1D's 4,000 train / 1,000 test signals of length 40 (the package's default arguments, seed 42).

    Building them takes seconds, which every new worker process would pay, so they are kept in
    `$NASPLAT_CACHE` (default `~/.cache/nasplat`) under the package's version; without a writable cache they are
    built each time."""
    from importlib.metadata import version

    cache = Path(os.environ.get("NASPLAT_CACHE", "~/.cache/nasplat")).expanduser() / f"mnist1d-{version('mnist1d')}.npz"
    keys = ("x", "y", "x_test", "y_test")
    try:
        with np.load(cache) as saved:
            return {key: saved[key] for key in keys}
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):  # not there yet, or damaged: build it
        pass
    from mnist1d.data import get_dataset_args, make_dataset

    # make_dataset seeds the global `random` and `numpy.random` generators; leave them as they were.
    py_state, np_state = random.getstate(), np.random.get_state()
    try:
        data = make_dataset(get_dataset_args())
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
    arrays = {key: np.asarray(data[key]) for key in keys}
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(cache, lambda f: np.savez(f, allow_pickle=True, **arrays))  # numpy's default, named for mypy
    except OSError:
        pass  # a read-only home only costs the time to build the data again
    return arrays


def _split_and_standardise(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray,
                           shape: tuple[int, ...]) -> Data:
    """Hold a stratified validation share out of the training set, then standardise every split per feature with
    the statistics of what is left for training (constant features keep a scale of 1)."""
    from sklearn.model_selection import train_test_split

    x_train, x_valid, y_train, y_valid = train_test_split(x_train, y_train, test_size=VALID_FRACTION, stratify=y_train,
                                                          random_state=SPLIT_SEED)
    mean, std = x_train.mean(axis=0), x_train.std(axis=0)
    std = np.where(std > 1e-8, std, 1.0)

    def tensor(x: np.ndarray) -> torch.Tensor:
        return torch.as_tensor((x - mean) / std, dtype=torch.float32).reshape(len(x), *shape)

    def labels(y: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(y, dtype=torch.long)

    return Data(tensor(x_train), labels(y_train), tensor(x_valid), labels(y_valid), tensor(x_test), labels(y_test),
                int(max(y_train.max(), y_valid.max(), y_test.max())) + 1)


class ClassificationTrainer(Trainer):
    """Trains a `search_spaces.cnn` config with SGD (momentum, weight decay); one step = some epochs + evaluations.

    Config keys: the CNN space's (`depth`, `head`, `lr`, `momentum`, `batch_size`, `weight_decay`), and
    optionally `dataset` (`"digits"` or `"mnist1d"`, default `self.dataset`), `epochs_per_step` (default 1) and
    `train_size` (train on the first `train_size` signals of the shuffled training share; default all of it).
    Reports `train_loss`, `valid_loss`, `valid_acc` (the metric to search on), `test_loss`, `test_acc` (to report
    only) and `epoch` (epochs trained so far).
    """

    dataset: str = "digits"
    net: torch.nn.Module  # a `search_spaces.cnn` network here; a subclass may build another

    def setup(self, config: Config, ctx: WorkerContext) -> None:
        torch.set_num_threads(1)  # one trial = one worker on a one-CPU slot
        self.config, self.ctx = config, ctx
        self.dataset_name = config.get("dataset", self.dataset)
        self.data = load_dataset(self.dataset_name)
        self.epochs_per_step = _positive_int(config, "epochs_per_step", 1)
        self.batch_size = _positive_int(config, "batch_size", None)

        # This rank's shard, cut to the same length on every rank so that all ranks take the same number of steps.
        available = len(self.data.y_train)
        train_size = _positive_int(config, "train_size", available)
        if train_size > available:
            raise ValueError(f"config['train_size'] must be <= {available} (the training share of "
                             f"{self.dataset_name}), got {train_size}")
        n = train_size // ctx.world_size
        self.x_train = ctx.shard(self.data.x_train)[:n]
        self.y_train = ctx.shard(self.data.y_train)[:n]

        torch.manual_seed(ctx.seed)
        self.net = build_model(config, self.data.in_channels, self.data.num_classes, self.data.input_shape)
        self.net.to(ctx.device)
        optimizer = torch.optim.SGD(self.net.parameters(), lr=config["lr"], momentum=config["momentum"],
                                    weight_decay=config["weight_decay"])
        self.model, self.optimizer = ctx.prepare(self.net, optimizer)
        self.architecture = architecture(config)  # to tell in `update_config` whether a rebuild is needed
        self.epoch = 0

    # -- training ---------------------------------------------------------------------------------
    def step(self) -> dict[str, Any]:
        for _ in range(self.epochs_per_step):
            train_loss = self.train_epoch()
        return {"train_loss": train_loss, **self.evaluation_metrics(), "epoch": float(self.epoch),
                **inference_cost(self.net, self.data.x_test[:1].to(self.ctx.device))}

    def evaluation_metrics(self) -> dict[str, float]:
        """`valid_loss`, `valid_acc` (held out of the training set: search on these) and `test_loss`, `test_acc`."""
        valid_loss, valid_acc = self.evaluate("valid")
        test_loss, test_acc = self.evaluate("test")
        return {"valid_loss": valid_loss, "valid_acc": valid_acc, "test_loss": test_loss, "test_acc": test_acc}

    def train_epoch(self) -> float:
        """One pass over the shard in a fresh order (a function of the seed and the epoch); the mean loss."""
        generator = torch.Generator().manual_seed(_mix(self.ctx.seed, self.epoch))
        order = torch.randperm(len(self.y_train), generator=generator)
        device = self.ctx.device
        self.model.train()
        total, count = 0.0, 0
        for start in range(0, len(order), self.batch_size):
            index = order[start:start + self.batch_size]
            x, y = self.x_train[index].to(device), self.y_train[index].to(device)
            loss = F.cross_entropy(self.model(x), y)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            total += loss.item() * len(index)
            count += len(index)
        self.epoch += 1
        return total / max(count, 1)

    @torch.no_grad()
    def evaluate(self, split: Literal["valid", "test"] = "valid") -> tuple[float, float]:
        """(mean cross-entropy, accuracy) on the whole validation or test set."""
        if split not in ("valid", "test"):
            raise ValueError(f"split must be 'valid' or 'test', got {split!r}")
        self.model.eval()
        x, y = getattr(self.data, f"x_{split}"), getattr(self.data, f"y_{split}")
        x, y = x.to(self.ctx.device), y.to(self.ctx.device)
        logits = self.model(x)
        accuracy = (logits.argmax(dim=1) == y).float().mean().item()
        return F.cross_entropy(logits, y).item(), accuracy

    # -- state --------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Model weights (unwrapped), optimizer state and epoch count."""
        return {"model": self.net.state_dict(), "optimizer": self.optimizer.state_dict(), "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.net.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.epoch = int(state["epoch"])

    def inherit_state(self, state: dict[str, Any]) -> None:
        """A parent's weights where name and shape match this (mutated) network; the rest stays freshly
        initialised, the optimizer starts anew and the epoch count at 0. `inherited` is the share of tensors taken."""
        own = self.net.state_dict()
        fits = {k: v for k, v in state["model"].items() if k in own and own[k].shape == v.shape}
        self.net.load_state_dict(fits, strict=False)
        self.inherited = len(fits) / max(1, len(own))

    def update_config(self, config: Config) -> None:
        """Same architecture: set lr / momentum / weight decay / batch size in place. Otherwise rebuild."""
        # Compare with what `setup` built: an executor may have set `self.config = config` already.
        if architecture(config) != self.architecture or config.get("dataset", self.dataset) != self.dataset_name:
            super().update_config(config)
            return
        for group in self.optimizer.param_groups:
            group["lr"], group["momentum"] = config["lr"], config["momentum"]
            group["weight_decay"] = config["weight_decay"]
        self.batch_size = _positive_int(config, "batch_size", None)
        self.epochs_per_step = _positive_int(config, "epochs_per_step", 1)
        self.config = config


@torch.no_grad()
def inference_cost(net: torch.nn.Module, example: torch.Tensor, repeats: int = 10) -> dict[str, float]:
    """Cost metrics for searches with several objectives: `params` (trainable parameters) and `latency_ms`, the
    median wall time of a forward pass on `example` (one input) in eval mode, after two warm-up passes."""
    was_training = net.training
    net.eval()
    times = []
    for i in range(repeats + 2):
        start = time.perf_counter()
        net(example)
        if example.is_cuda:
            torch.cuda.synchronize(example.device)
        if i >= 2:
            times.append(time.perf_counter() - start)
    net.train(was_training)
    params = sum(p.numel() for p in net.parameters() if p.requires_grad)
    return {"params": float(params), "latency_ms": 1000.0 * float(np.median(times))}


def _positive_int(config: Config, key: str, default: int | None) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"config[{key!r}] must be an integer >= 1, got {value!r}")
    return int(value)


def _mix(seed: int, epoch: int) -> int:
    """A 63-bit seed from (trial seed, epoch)."""
    return int(np.random.SeedSequence([int(seed) % 2**63, epoch]).generate_state(2, dtype=np.uint64)[0] >> 1)
