"""The Trainer API users implement, and the WorkerContext each worker of a trial sees."""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from nasplat.space import Config


@dataclass
class WorkerContext:
    """Where a trainer runs: its rank in the trial's gang, the device, a per-rank seed.

    With one worker `prepare` returns its arguments unchanged; the distributed core hands multi-worker
    trials a context whose `prepare` wires the chosen backend (allreduce, async, gossip) in.
    """

    trial_id: int = 0
    rank: int = 0
    world_size: int = 1
    seed: int = 0
    device: str = "cpu"
    extras: dict[str, Any] = field(default_factory=dict)

    def shard(self, dataset: Any) -> Any:
        """This rank's share of `dataset`: every `world_size`-th item starting at `rank`."""
        if self.world_size == 1:
            return dataset
        return dataset[self.rank::self.world_size]

    def prepare(self, model: Any, optimizer: Any = None) -> tuple[Any, Any]:
        """Wire the trial's backend into `model`/`optimizer`; a no-op for one worker."""
        return model, optimizer


class Trainer(ABC):
    """One trial's training loop, driven step by step by the engine.

    `setup` builds the model from `config`; `step` trains a unit (an epoch, some batches, one evaluation)
    and returns metrics; `state_dict`/`load_state_dict` move the state (PBT exploit, retries). On Ray, an exploit
    copies the donor's tensors into the ones `state_dict` returns (where shape and dtype match) before it calls
    `load_state_dict`, so returning the live tensors, as `Module.state_dict` does, saves a copy.
    """

    config: Config
    ctx: WorkerContext

    @abstractmethod
    def setup(self, config: Config, ctx: WorkerContext) -> None: ...

    @abstractmethod
    def step(self) -> dict[str, Any]: ...

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError(f"{type(self).__name__} does not implement state_dict(); PBT exploit needs it")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not implement load_state_dict(); PBT exploit needs it")

    def inherit_state(self, state: dict[str, Any]) -> None:
        """Start from a parent trial's final state (regularized evolution with `inherit_weights`). A child is a
        mutation, so the state may not fit: the default loads it whole and, if that fails, keeps the fresh
        initialisation. Override to take what fits (`trainers.classification` copies the matching tensors)."""
        try:
            self.load_state_dict(state)
        except (RuntimeError, KeyError, ValueError, TypeError):
            start(self, self.config, self.ctx)  # nothing half-loaded

    def update_config(self, config: Config) -> None:
        """Put `config` in effect after an exploit. The default rebuilds through `setup` and reloads the state,
        then puts back the hyperparameters (lr, momentum, ...) of every optimizer attribute as `setup` just set
        them, since the loaded optimizer state would restore the old ones. Override to change only what differs."""
        state = self.state_dict()
        start(self, config, self.ctx)
        fresh = [(optimizer, [hyperparameters(g) for g in optimizer.param_groups]) for optimizer in _optimizers(self)]
        self.load_state_dict(state)
        for optimizer, groups in fresh:
            for group, values in zip(optimizer.param_groups, groups):
                group.update(values)


def _optimizers(trainer: Trainer) -> list[Any]:
    """The trainer's attributes that look like torch optimizers (they have `param_groups`)."""
    return [value for value in vars(trainer).values() if isinstance(getattr(value, "param_groups", None), list)]


def hyperparameters(group: dict[str, Any]) -> dict[str, Any]:
    """An optimizer param group's hyperparameters: everything but its `params`."""
    return {key: value for key, value in group.items() if key != "params"}


def start(trainer: Trainer, config: Config, ctx: WorkerContext) -> Trainer:
    """Attach `config` and `ctx` to `trainer`, then call its `setup`."""
    trainer.config, trainer.ctx = config, ctx
    trainer.setup(config, ctx)
    return trainer


def resolve(target: Any, *, what: str) -> Any:
    """An object given directly or by dotted path (`package.module:attribute`)."""
    if not isinstance(target, str):
        return target
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"{what} must be an object or a dotted path 'package.module:attribute', got {target!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{what} {target!r}: cannot import module {module_name!r} ({exc})") from exc
    except Exception as exc:  # the module's own code raised while importing: user code, named as such
        raise ValueError(f"{what} {target!r}: importing module {module_name!r} raised "
                         f"{type(exc).__name__}: {_one_line(exc)}") from exc
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ValueError(f"{what} {target!r}: module {module_name!r} has no attribute {attribute!r}") from None


def check_trainer(trainer: Any) -> type[Trainer]:
    """`trainer` itself if it is a subclass of `Trainer`; otherwise a TypeError that says what was given."""
    if not (isinstance(trainer, type) and issubclass(trainer, Trainer)):
        raise TypeError(f"`trainer` must be a subclass of nasplat.Trainer (or its dotted path 'module:Class'), "
                        f"got {_describe(trainer)}")
    return trainer


def _describe(value: Any) -> str:
    """`the class m.C`, `the function m.f`, `an instance of m.C`: what was given, by its qualified name."""
    def qualified(obj: Any) -> str:
        return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__name__)}"
    if isinstance(value, type):
        return f"the class {qualified(value)}"
    if callable(value) and hasattr(value, "__qualname__"):
        return f"the {type(value).__name__} {qualified(value)}"
    return f"an instance of {qualified(type(value))}: {value!r}"[:200]


def _one_line(exc: BaseException) -> str:
    """An exception's message on one line."""
    return " ".join(str(exc).split()) or "(no message)"
