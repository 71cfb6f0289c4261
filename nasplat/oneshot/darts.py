"""Gradient-based search over a supernet: DARTS (first order, Liu et al. 2019) and GDAS (Dong & Yang 2019).

Both keep a vector of architecture weights alpha per decision and alternate an alpha step on a batch held out of
weight training (Adam) with a weight step on a training batch (SGD), alpha's gradient taken at the current weights
(first order). DARTS runs every candidate, mixed by softmax(alpha); it is known to collapse onto parameter-free
operations (skip connections, pooling), which win the mixture early because they need no training. GDAS, the
remedy shipped here, samples one candidate per decision and forward with the Gumbel-max trick at a temperature tau
annealed from `tau_max` to `tau_min`: the forward runs the sampled candidate only (hard, one-hot weights) while
alpha gets the straight-through gradient of the softmax relaxation, so every candidate is trained alone on the
batches it is sampled for and a convolution is not out-competed by an untrained mixture. The derived architecture
is the argmax of alpha per decision, `none` excluded as DARTS does: a config of the supernet's space.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from nasplat.core.checks import check_choice, check_int, check_real
from nasplat.oneshot.evaluation import evaluate_path
from nasplat.oneshot.sampling import rng_for
from nasplat.oneshot.supernet import drop_unused_grads, keyed, mix
from nasplat.oneshot.training import OneShotTrainer, shared_seed
from nasplat.space import Config
from nasplat.trainer import WorkerContext

METHODS = ("darts", "gdas")


class ArchitectureWeights(nn.Module):
    """One vector alpha per decision key of a supernet (layers sharing a key share it), initialised at
    `init_scale * N(0, 1)` as DARTS does."""

    def __init__(self, supernet: nn.Module, *, init_scale: float = 1e-3) -> None:
        super().__init__()
        groups = keyed(supernet)
        self.keys = list(groups)
        self.options = {key: group[0].options for key, group in groups.items()}
        self.alphas = nn.ParameterList([nn.Parameter(init_scale * torch.randn(len(self.options[k])))
                                        for k in self.keys])

    def by_key(self) -> dict[str, torch.Tensor]:
        return dict(zip(self.keys, self.alphas))

    def softmax(self) -> dict[str, torch.Tensor]:
        """softmax(alpha) per key (DARTS's mixture weights)."""
        return {key: alpha.softmax(-1) for key, alpha in self.by_key().items()}

    def gumbel(self, tau: float, generator: torch.Generator) -> dict[str, torch.Tensor]:
        """GDAS's hard sample per key: one-hot at argmax((log softmax(alpha) + g) / tau), g ~ Gumbel(0, 1) drawn
        from `generator`, with the gradient of the softmax of the same logits (straight-through)."""
        out = {}
        for key, alpha in self.by_key().items():
            while True:
                gumbels = -torch.empty_like(alpha).exponential_(generator=generator).log()
                probs = ((alpha.log_softmax(-1) + gumbels) / tau).softmax(-1)
                if torch.isfinite(probs).all():
                    break
            one_hot = torch.zeros_like(probs).scatter_(-1, probs.detach().argmax(-1, keepdim=True), 1.0)
            out[key] = one_hot - probs.detach() + probs
        return out

    def derive(self, exclude: Sequence[Any] = ("none",)) -> Config:
        """The architecture alpha points to: per key the option of largest alpha, options in `exclude` left out
        (unless every option is excluded)."""
        config: Config = {}
        for key, alpha in self.by_key().items():
            options = self.options[key]
            allowed = [i for i, o in enumerate(options) if o not in exclude] or list(range(len(options)))
            config[key] = options[max(allowed, key=lambda i: float(alpha[i].detach()))]
        return config

    def entropy(self) -> float:
        """Mean entropy of softmax(alpha) over the keys (log of the option count at the start, 0 when decided)."""
        values = [-(p * p.clamp_min(1e-12).log()).sum().item() for p in self.softmax().values()]
        return sum(values) / max(len(values), 1)


def tau_at(epoch: int, epochs: int, tau_max: float, tau_min: float) -> float:
    """GDAS's temperature, linear from `tau_max` at epoch 0 to `tau_min` at the last epoch."""
    return tau_max - (tau_max - tau_min) * min(epoch, max(epochs - 1, 0)) / max(epochs - 1, 1)


def _reduce_mean(tensors: list[torch.Tensor], ctx: WorkerContext) -> None:
    """Average `tensors` (alpha's gradients, which DDP does not reduce) over the gang's process group, if any."""
    if ctx.world_size == 1:
        return
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        for t in tensors:
            dist.all_reduce(t)
            t.div_(ctx.world_size)


class DartsTrainer(OneShotTrainer):
    """Gradient-based search as a trial: one step = one epoch of alternating alpha and weight steps, then the
    derived architecture evaluated with its inherited weights (batch norm recalibrated, `evaluate_path`).

    Config (all optional): `method` (`"gdas"`, default, or `"darts"`), `lr` (0.025, cosine over `epochs`),
    `momentum` (0.9), `weight_decay` (3e-4), `batch_size` (64), `arch_lr` (`ARCH_LR`), `arch_weight_decay` (1e-3),
    `tau_max` (10), `tau_min` (0.1), `epochs` (20: the schedules' length, `done` after the last), `arch_data`
    (`"split"`: alpha learns on the second half of the training share, weights on the first, as DARTS splits
    CIFAR's training set; `"valid"`: alpha learns on the validation split, which then no longer judges it),
    `warmup_epochs` (`epochs // 4`: weights only, alpha frozen, so that the convolutions have learnt something
    before they compete with the parameter-free operations; a heuristic of PC-DARTS and DrNAS, which helps DARTS
    and GDAS alike), `grad_clip` (5), `path_seed` (the Gumbel draws of step s are seeded by (path_seed, s): the
    same on every rank; default the trial's seed, rank 0's broadcast to the gang).

    Reports `train_loss`, `arch_loss` (after the warm-up), `valid_acc`/`valid_loss` (and `test_*`) and `params` of
    the derived architecture, `arch` (the derived config as JSON), `parameter_free` (how many of its decisions chose
    a candidate without parameters), `alpha_entropy`, `tau`, `epoch`; the step of the last epoch adds `done: True`.
    On a DDP gang alpha's gradients are averaged over the ranks by this trainer (DDP reduces only the model's)."""

    ARCH_LR = 3e-4
    """The default `arch_lr`: the papers' (DARTS, GDAS), tuned for ~100k alpha steps; far fewer steps need more."""
    CONFIG_KEYS = ("method", "lr", "momentum", "weight_decay", "arch_lr", "arch_weight_decay", "tau_max", "tau_min",
                   "warmup_epochs", "arch_data", "grad_clip", "path_seed")
    TRAINS_SUPERNET = True
    DEFAULT_EPOCHS = 20
    epochs: int  # always set here (the base's is optional): the temperature and `done` count on it

    def setup(self, config: Config, ctx: WorkerContext) -> None:
        self.setup_common(config, ctx)
        self.epochs = check_int("epochs", config.get("epochs", self.DEFAULT_EPOCHS), minimum=1)
        self.method = check_choice("method", config.get("method", "gdas"), METHODS)
        self.lr = check_real("lr", config.get("lr", 0.025), minimum=0, strict=True)
        momentum = check_real("momentum", config.get("momentum", 0.9), minimum=0, maximum=1)
        decay = check_real("weight_decay", config.get("weight_decay", 3e-4), minimum=0)
        self.tau_max = check_real("tau_max", config.get("tau_max", 10.0), minimum=0, strict=True)
        self.tau_min = check_real("tau_min", config.get("tau_min", 0.1), minimum=0, strict=True)
        self.grad_clip = check_real("grad_clip", config.get("grad_clip", 5.0), minimum=0, strict=True)
        self.warmup = check_int("warmup_epochs", config.get("warmup_epochs", self.epochs // 4), minimum=0,
                                maximum=self.epochs - 1)
        arch_data = check_choice("arch_data", config.get("arch_data", "split"), ("split", "valid"))
        if arch_data == "split":
            half = len(self.y_train) // 2
            self.x_arch, self.y_arch = self.x_train[half:], self.y_train[half:]
            self.x_train, self.y_train = self.x_train[:half], self.y_train[:half]
        else:
            self.x_arch, self.y_arch = self.data.x_valid, self.data.y_valid
        self.alpha = ArchitectureWeights(self.net).to(ctx.device)
        self.net.set_touch(ctx.world_size > 1)  # GDAS runs one candidate per decision: DDP needs every gradient
        optimizer = torch.optim.SGD(self.net.parameters(), lr=self.lr, momentum=momentum, weight_decay=decay)
        self.model, self.optimizer = ctx.prepare(self.net, optimizer)
        self.arch_optimizer = torch.optim.Adam(self.alpha.parameters(),
                                               lr=check_real("arch_lr", config.get("arch_lr", self.ARCH_LR),
                                                             minimum=0),
                                               betas=(0.5, 0.999),
                                               weight_decay=check_real("arch_weight_decay",
                                                                       config.get("arch_weight_decay", 1e-3),
                                                                       minimum=0))
        seed = config.get("path_seed")
        self.path_seed = shared_seed(ctx, ctx.seed) if seed is None else check_int("path_seed", seed)
        self.steps = 0

    @property
    def tau(self) -> float:
        """The Gumbel temperature of this epoch: `tau_max` until the warm-up ends, then annealed to `tau_min`."""
        return tau_at(max(self.epoch - self.warmup, 0), self.epochs - self.warmup, self.tau_max, self.tau_min)

    def _put_weights(self, *, detach: bool, phase: int) -> None:
        """Mix the supernet by alpha: softmax (DARTS) or a Gumbel hard sample seeded by (seed, step, phase) (GDAS;
        phase 0: the alpha step, 1: the weight step)."""
        if self.method == "darts":
            weights = self.alpha.softmax()
        else:
            generator = torch.Generator(device=self.ctx.device)
            generator.manual_seed(int(rng_for(self.path_seed, self.steps, phase).integers(2**62)))
            weights = self.alpha.gumbel(self.tau, generator)
        mix(self.net, {k: w.detach() if detach else w for k, w in weights.items()}, hard=self.method == "gdas")

    def search_step(self, x: torch.Tensor, y: torch.Tensor, x_arch: torch.Tensor, y_arch: torch.Tensor
                    ) -> tuple[float, float]:
        """One alpha step on (`x_arch`, `y_arch`) (none during the warm-up: NaN arch loss), then one weight step on
        (`x`, `y`); returns (weight loss, arch loss)."""
        self.model.train()
        arch_loss = torch.tensor(float("nan"))
        if self.epoch >= self.warmup:
            self._put_weights(detach=False, phase=0)
            self.arch_optimizer.zero_grad(set_to_none=True)
            arch_loss = F.cross_entropy(self.model(x_arch), y_arch)
            arch_loss.backward()
            _reduce_mean([a.grad for a in self.alpha.alphas if a.grad is not None], self.ctx)
            self.arch_optimizer.step()
        self._put_weights(detach=True, phase=1)  # GDAS: a fresh sample for the weight step
        self.optimizer.zero_grad(set_to_none=True)  # also drops what the alpha step left on the weights
        loss = F.cross_entropy(self.model(x), y)
        loss.backward()
        drop_unused_grads(self.net)
        nn.utils.clip_grad_norm_(self.net.parameters(), self.grad_clip)
        self.optimizer.step()
        self.steps += 1
        return loss.item(), arch_loss.item()

    def step(self) -> dict[str, Any]:
        device = self.ctx.device
        for group in self.optimizer.param_groups:
            group["lr"] = self.scheduled_lr(self.lr)
        tau = self.tau
        order = self.epoch_order(len(self.y_train))
        arch_order = torch.randperm(len(self.y_arch), generator=torch.Generator().manual_seed(self.steps))
        losses, arch_losses = [], []
        for b, start in enumerate(range(0, len(order), self.batch_size)):
            index = order[start:start + self.batch_size]
            a_start = (b * self.batch_size) % max(len(arch_order) - self.batch_size + 1, 1)
            a_index = arch_order[a_start:a_start + self.batch_size]
            loss, arch_loss = self.search_step(self.x_train[index].to(device), self.y_train[index].to(device),
                                               self.x_arch[a_index].to(device), self.y_arch[a_index].to(device))
            losses.append(loss)
            arch_losses.append(arch_loss)
        self.epoch += 1
        derived = self.alpha.derive()
        scores = evaluate_path(self.net, derived, self.data, splits=self.splits)
        free = sum(1 for key, group in keyed(self.net).items() if _parameter_free(group[0], derived[key]))
        metrics: dict[str, Any] = {"train_loss": sum(losses) / len(losses), **scores,
                                   "arch": json.dumps(derived), "parameter_free": float(free),
                                   "alpha_entropy": self.alpha.entropy(), "tau": tau, "epoch": float(self.epoch)}
        if self.epoch > self.warmup:
            metrics["arch_loss"] = sum(arch_losses) / len(arch_losses)
        if self.epoch >= self.epochs:
            metrics["done"] = True
        return metrics

    def derived(self) -> Config:
        """The architecture found so far (argmax of alpha, `none` excluded)."""
        return self.alpha.derive()

    def state_dict(self) -> dict[str, Any]:
        """Supernet weights (unwrapped), alpha, both optimizers' states, epoch, steps and the path seed."""
        return {"model": self.net.state_dict(), "alpha": self.alpha.state_dict(),
                "optimizer": self.optimizer.state_dict(), "arch_optimizer": self.arch_optimizer.state_dict(),
                "epoch": self.epoch, "steps": self.steps, "path_seed": self.path_seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.net.load_state_dict(state["model"])
        self.alpha.load_state_dict(state["alpha"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.arch_optimizer.load_state_dict(state["arch_optimizer"])
        self.epoch, self.steps, self.path_seed = int(state["epoch"]), int(state["steps"]), int(state["path_seed"])


def _parameter_free(decision: Any, option: Any) -> bool:
    """Whether the candidate `option` of a decision has no parameters (an input choice never has any)."""
    candidate = getattr(decision, "candidate", None)
    if candidate is None:
        return True
    return not any(True for _ in candidate(decision.options.index(option)).parameters())


def alpha_table(weights: ArchitectureWeights) -> Mapping[str, dict[str, float]]:
    """softmax(alpha) as `{key: {option: probability}}` (to log or to plot)."""
    return {key: {str(o): float(p) for o, p in zip(weights.options[key], probs.detach())}
            for key, probs in weights.softmax().items()}

