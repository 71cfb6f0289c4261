"""Training a supernet one sampled path per batch.

`train_epoch` is one epoch of single-path training. `OneShotTrainer` is what the one-shot trials share (data,
supernet, the space of its paths). `SupernetTrainer` trains a supernet as a nasplat trial and judges a few fixed
paths by the weights they inherit (`nasplat.oneshot.evaluation.evaluate_path`): one epoch a step, checkpointable
and resumable, and able to run as an allreduce (DDP) gang (see its docstring).
"""

from __future__ import annotations

import math
import time
from abc import abstractmethod
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from nasplat.core.checks import check_choice, check_int, check_real
from nasplat.oneshot.evaluation import Splits, evaluate_path
from nasplat.oneshot.sampling import FairSampler, PathSampler, make_sampler, rng_for
from nasplat.oneshot.supernet import Supernet, check_same_decisions, drop_unused_grads, select
from nasplat.space import Config, Domain, Space
from nasplat.trainer import Trainer, WorkerContext


def train_epoch(supernet: Supernet, model: nn.Module, optimizer: torch.optim.Optimizer, sampler: PathSampler,
                x: torch.Tensor, y: torch.Tensor, *, batch_size: int, first_step: int, order: torch.Tensor,
                strict_fairness: bool = False) -> tuple[float, int]:
    """One epoch of single-path training over `x[order]`: batch b trains the path `sampler.path(step)`, its
    gradients on the unused candidates dropped before the optimizer steps (they get no decay nor momentum).

    `model` is what the forward runs through (`supernet` itself, or its DDP wrapper); `first_step` the number of
    paths trained before. `strict_fairness` (FairNAS's own rule, with a `FairSampler`): each batch trains all the
    paths of a group, gradients accumulated, then one optimizer step. Returns (mean loss, paths trained)."""
    device = next(supernet.parameters()).device
    per_batch = sampler.group_size if strict_fairness and isinstance(sampler, FairSampler) else 1
    model.train()
    step, total, count = first_step, 0.0, 0
    for start in range(0, len(order), batch_size):
        index = order[start:start + batch_size]
        xb, yb = x[index].to(device), y[index].to(device)
        optimizer.zero_grad(set_to_none=True)
        for _ in range(per_batch):
            select(supernet, sampler.path(step))
            loss = F.cross_entropy(model(xb), yb)
            (loss / per_batch).backward()
            total, count, step = total + loss.item() * len(index), count + len(index), step + 1
        if per_batch == 1:
            drop_unused_grads(supernet)
        optimizer.step()
    return total / max(count, 1), step - first_step


def check_epoch_budget(name: str, space: Space, max_steps: int, default: int | None) -> None:
    """Refuse (one line) a trainer that trains one epoch a step and whose `epochs` (the space's, its largest option,
    else `default`) is more than `max_steps`: the trial would be recorded completed before its schedule ended."""
    domain = space.domains.get("epochs", default)
    if isinstance(domain, Domain):
        options = getattr(domain, "options", None) or [getattr(domain, "high", None)]
    else:
        options = [domain]
    counts = [int(o) for o in options if isinstance(o, (int, float)) and not isinstance(o, bool)]
    if counts and max(counts) > max_steps:
        epochs = max(counts)
        raise ValueError(f"{name}: epochs={epochs} but max_steps={max_steps}: a trial trains one epoch a step and "
                         f"would be recorded completed after {max_steps} of its {epochs} epochs; set the budget's "
                         f"max_steps to {epochs}, or epochs to {max_steps}")


def shared_seed(ctx: WorkerContext, seed: int) -> int:
    """`seed` as rank 0 has it, on every rank: broadcast over the gang's torch process group when there is one
    (allreduce, gossip); on a gang without one (async), the trial id (the same on every rank)."""
    if ctx.world_size == 1:
        return int(seed)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        value = torch.tensor([int(seed) % 2**62], dtype=torch.int64, device=ctx.device)
        dist.broadcast(value, src=0)
        return int(value.item())
    return int(rng_for(ctx.trial_id).integers(2**62))


class OneShotTrainer(Trainer):
    """What the one-shot trials share: the data (this rank's shard of the training set), the supernet, the space
    of its paths. Subclasses give the data and the supernet (`load_data`, `build_supernet`), and may constrain the
    paths (`path_space`: a space with the supernet's decisions and rules of its own). Config keys read here:
    `batch_size` (64), `epochs` (None), `train_size` (train on the first `train_size` training samples; all).

    `CONFIG_KEYS` (each class its own, and `SETTINGS` of a mixin: the keys that build the network and its data)
    name the settings a trainer reads; a trainer that trains the whole supernet (`TRAINS_SUPERNET`) refuses,
    before the experiment runs, a space that varies any other key (a path's decisions: it trains every path) and
    an `epochs` (`DEFAULT_EPOCHS` where the space has none) beyond `max_steps`."""

    CONFIG_KEYS: ClassVar[tuple[str, ...]] = ("batch_size", "epochs", "train_size")
    SETTINGS: ClassVar[tuple[str, ...]] = ()
    TRAINS_SUPERNET: ClassVar[bool] = False
    DEFAULT_EPOCHS: ClassVar[int | None] = None

    @classmethod
    def known_keys(cls) -> list[str]:
        """Every config key this trainer reads: the `CONFIG_KEYS` and `SETTINGS` of its classes."""
        return sorted({key for klass in cls.__mro__ for name in ("CONFIG_KEYS", "SETTINGS")
                       for key in vars(klass).get(name, ())})

    @classmethod
    def check_experiment(cls, space: Space, *, max_steps: int) -> None:
        """A supernet trainer's checks (see the class docstring); others accept every space."""
        if not cls.TRAINS_SUPERNET:
            return
        check_epoch_budget(cls.__name__, space, max_steps, cls.DEFAULT_EPOCHS)
        known = cls.known_keys()
        foreign = [key for key, domain in space.domains.items() if isinstance(domain, Domain) and key not in known]
        if foreign:
            raise ValueError(f"{cls.__name__}: the space's decisions {foreign} are not settings of the supernet it "
                             f"trains (a supernet trainer trains every path, so a path's decisions have no place "
                             f"in its space; search paths with a path trainer over its weights); it reads {known}")

    @abstractmethod
    def load_data(self, config: Config) -> Splits:
        """The data set of the trial (`x_train`, `y_train`, `x_valid`, `y_valid`, optionally `x_test`, `y_test`)."""

    @abstractmethod
    def build_supernet(self, config: Config, data: Splits) -> Supernet:
        """A freshly initialised supernet for `data` (torch's generator is seeded before the call)."""

    def path_space(self, config: Config, supernet: Supernet) -> Space:
        """The paths a search may take; default: all of `supernet.space()`."""
        return supernet.space()

    def supernet_for(self, config: Config) -> Supernet:
        """The supernet this trial works on: a fresh one, torch seeded with the trial's seed before it is built."""
        torch.manual_seed(self.ctx.seed)
        return self.build_supernet(config, self.data).to(self.ctx.device)

    def setup_common(self, config: Config, ctx: WorkerContext) -> None:
        torch.set_num_threads(1)  # one trial = one worker on a one-CPU slot
        self.config, self.ctx = config, ctx
        self.data = self.load_data(config)
        available = len(self.data.y_train)
        train_size = check_int("train_size", config.get("train_size", available), minimum=1, maximum=available)
        n = train_size // ctx.world_size  # the same length on every rank: the same number of steps
        self.x_train, self.y_train = ctx.shard(self.data.x_train)[:n], ctx.shard(self.data.y_train)[:n]
        self.batch_size = check_int("batch_size", config.get("batch_size", 64), minimum=1)
        self.splits = ("valid", "test") if hasattr(self.data, "x_test") else ("valid",)
        self.net = self.supernet_for(config)
        self.space = check_same_decisions(self.path_space(config, self.net), self.net)
        self.epochs = check_int("epochs", config.get("epochs"), minimum=1, optional=True)  # None: constant lr
        self.epoch = 0

    def scheduled_lr(self, lr: float) -> float:
        """`lr` on a cosine schedule over `epochs` (constant without `epochs`)."""
        if self.epochs is None:
            return lr
        return 0.5 * lr * (1.0 + math.cos(math.pi * min(self.epoch, self.epochs) / self.epochs))

    def epoch_order(self, n: int) -> torch.Tensor:
        """This epoch's order of `n` training samples: a function of the rank's seed and the epoch."""
        return torch.randperm(n, generator=torch.Generator().manual_seed(int(rng_for(self.ctx.seed, self.epoch)
                                                                                 .integers(2**62))))


class SupernetTrainer(OneShotTrainer):
    """Trains a supernet with single-path sampling; one step = one epoch, then a few fixed paths evaluated.

    Config (all optional): `sampler` (`"spos"` uniform, default; `"fairnas"` fair), `strict_fairness` (False; True:
    FairNAS's same-batch groups, see `train_epoch`), `lr` (0.05), `momentum` (0.9), `weight_decay` (3e-4),
    `batch_size` (64), `epochs` (cosine schedule over that many epochs, and `done` after the last; default: constant
    lr, no end), `eval_paths` (5 fixed paths drawn from the space with the path seed), `bn_batches` (4), `path_seed`
    (default: the trial's seed, rank 0's broadcast to the gang). Reports `train_loss`, `valid_acc` / `valid_loss` /
    `test_acc` (means over the evaluated paths), `valid_acc_min`, `valid_acc_max`, `epoch`, `paths_trained`,
    `eval_ms` (milliseconds per path evaluation) and `train_s`.

    Data-parallel (`ctx.prepare`, the allreduce backend): every rank draws the same path at each step (same seed,
    same step count); each `ChoiceLayer` gives its unused candidates a zero gradient (`set_touch`) so that DDP's
    default `find_unused_parameters=False` reduces every parameter each step, and those zero gradients are dropped
    after the reduction (`drop_unused_grads`) so that the optimizer leaves the untrained candidates alone.
    `find_unused_parameters=True` works as well, at DDP's cost of a graph traversal per step."""

    CONFIG_KEYS = ("sampler", "strict_fairness", "lr", "momentum", "weight_decay", "eval_paths", "bn_batches",
                   "path_seed")
    TRAINS_SUPERNET = True

    def setup(self, config: Config, ctx: WorkerContext) -> None:
        self.setup_common(config, ctx)
        self.lr = check_real("lr", config.get("lr", 0.05), minimum=0, strict=True)
        momentum = check_real("momentum", config.get("momentum", 0.9), minimum=0, maximum=1)
        decay = check_real("weight_decay", config.get("weight_decay", 3e-4), minimum=0)
        self.sampler_name = check_choice("sampler", config.get("sampler", "spos"), ("spos", "fairnas"))
        self.strict_fairness = bool(config.get("strict_fairness", False))
        self.eval_count = check_int("eval_paths", config.get("eval_paths", 5), minimum=1)
        self.bn_batches = check_int("bn_batches", config.get("bn_batches", 4), minimum=0)
        self.net.set_touch(ctx.world_size > 1)
        optimizer = torch.optim.SGD(self.net.parameters(), lr=self.lr, momentum=momentum, weight_decay=decay)
        self.model, self.optimizer = ctx.prepare(self.net, optimizer)
        seed = config.get("path_seed")
        self.set_path_seed(shared_seed(ctx, ctx.seed) if seed is None else check_int("path_seed", seed))
        self.paths_trained = 0

    def set_path_seed(self, seed: int) -> None:
        """The seed of the training paths and of the fixed evaluation paths."""
        self.path_seed = seed
        self.sampler = make_sampler(self.sampler_name, self.space, seed)
        rng = rng_for(seed, 2**32)  # a stream apart from the training steps'
        self.eval_configs = [self.space.sample(rng) for _ in range(self.eval_count)]

    def step(self) -> dict[str, Any]:
        for group in self.optimizer.param_groups:
            group["lr"] = self.scheduled_lr(self.lr)
        start = time.perf_counter()
        loss, trained = train_epoch(self.net, self.model, self.optimizer, self.sampler, self.x_train, self.y_train,
                                    batch_size=self.batch_size, first_step=self.paths_trained,
                                    order=self.epoch_order(len(self.y_train)), strict_fairness=self.strict_fairness)
        train_s = time.perf_counter() - start
        self.paths_trained += trained
        self.epoch += 1
        start = time.perf_counter()
        scores = [evaluate_path(self.net, c, self.data, splits=self.splits, bn_batches=self.bn_batches)
                  for c in self.eval_configs]
        eval_ms = 1000 * (time.perf_counter() - start) / len(scores)
        valid = [s["valid_acc"] for s in scores]
        metrics: dict[str, Any] = {"train_loss": loss, **{k: float(np.mean([s[k] for s in scores])) for k in scores[0]
                                                          if k != "params"},
                                   "valid_acc_min": min(valid), "valid_acc_max": max(valid), "epoch": float(self.epoch),
                                   "paths_trained": float(self.paths_trained), "eval_ms": eval_ms, "train_s": train_s}
        if self.epochs is not None and self.epoch >= self.epochs:
            metrics["done"] = True
        return metrics

    def state_dict(self) -> dict[str, Any]:
        """Supernet weights (unwrapped), optimizer state, epoch, paths trained and the path seed."""
        return {"model": self.net.state_dict(), "optimizer": self.optimizer.state_dict(), "epoch": self.epoch,
                "paths_trained": self.paths_trained, "path_seed": self.path_seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.net.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.epoch, self.paths_trained = int(state["epoch"]), int(state["paths_trained"])
        self.set_path_seed(int(state["path_seed"]))
