"""The Trainer API users implement, and the WorkerContext each worker of a trial sees.

A trial's life on every executor (`nasplat.executors.host.TrialHost` makes these calls, for `local`, `processes`,
`simulated` and each rank of a Ray gang alike): a fresh instance (`TrainerClass()`, no arguments) gets `config`
and `ctx` attributes and `setup(config, ctx)`; then, where the trial starts from a state, `load_state_dict` (or
`inherit_state`); then `step()` once per unit of training, each next step only after the engine has taken in
the previous one's report and the controller let the trial go on. Between two steps nasplat may call `state_dict`
(a checkpoint, a snapshot for a later exploit, a donor's state, a kept final state) or, for a PBT exploit,
`load_state_dict` then `update_config`. Calls on one trainer never overlap.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from nasplat.space import Config


@dataclass
class WorkerContext:
    """Where a trainer runs: its rank in the trial's gang, the device, a per-rank seed.

    Made by the executor for each attempt of a trial and passed to `Trainer.setup` (also kept as `trainer.ctx`).
    `trial_id`: the trial's number in the experiment. `rank`, `world_size`: this worker's place in the trial's gang
    (0 and 1 except on `executor: ray` with `workers > 1`). `seed`: the attempt's seed, derived from the experiment's
    `seed`, the trial and the attempt (a retry gets a new one); rank 0 has the trial's seed, every other rank an
    independent one. `device`: `"cpu"`, or the rank's GPU (`"cuda:0"`) on a gang with `gpus_per_trial > 0`.
    `extras`: free for the trainer's own use; nasplat puts nothing there.

    With one worker `prepare` returns its arguments unchanged; the distributed core hands multi-worker
    trials a context (`nasplat.distributed.context.DistributedContext`) whose `prepare` wires the chosen backend
    (allreduce, async, gossip) in.
    """

    trial_id: int = 0
    rank: int = 0
    world_size: int = 1
    seed: int = 0
    device: str = "cpu"
    extras: dict[str, Any] = field(default_factory=dict)

    def shard(self, dataset: Any) -> Any:
        """This rank's share of `dataset`: every `world_size`-th item starting at `rank`.

        When: called by the trainer, usually in `setup`, on the training data (each rank trains on its share).
        Arguments: `dataset`, anything that slices with a step (`dataset[start::step]`: a list, a numpy array, a
        tensor).
        Returns: `dataset` itself with one worker; else `dataset[rank::world_size]`.
        """
        if self.world_size == 1:
            return dataset
        return dataset[self.rank::self.world_size]

    def prepare(self, model: Any, optimizer: Any = None) -> tuple[Any, Any]:
        """Wire the trial's backend into `model`/`optimizer`; a no-op for one worker.

        When: called by the trainer in `setup`, once the model is built (and on `ctx.device`) and its optimizer
        made; again after a rebuild (the default `update_config` calls `setup`).
        Arguments: `model`, a torch module; `optimizer`, its torch optimizer (the `async` and `gossip` backends
        need one).
        Returns: `(model, optimizer)` to train with from now on: the arguments unchanged with one worker; on a
        multi-worker gang, `allreduce` wraps the model in `DistributedDataParallel`, `async` replaces the
        optimizer by one that steps through the parameter servers, `gossip` hooks the optimizer's steps.
        """
        return model, optimizer


class Trainer(ABC):
    """One trial's training loop, driven step by step by the engine.

    `setup` builds the model from `config`; `step` trains a unit (an epoch, some batches, one evaluation)
    and returns metrics; `state_dict`/`load_state_dict` move the state (checkpoints, PBT exploit, retries, resume).
    Every load copies the incoming tensors into the ones `state_dict` returns now (where shape and dtype match)
    before it calls `load_state_dict`, so returning the live tensors, as `Module.state_dict` does, saves a copy.
    Only `setup` and `step` are required; without `state_dict`/`load_state_dict` a checkpoint of the trial fails
    (recorded as failed; the trial goes on), and PBT exploits, `inherit_weights` and pausing cannot work.
    """

    config: Config
    ctx: WorkerContext

    RETRAIN_TRAINER: ClassVar[str | None] = None
    """The standalone trainer (a dotted path `module:Class`) that `nasplat retrain` trains a chosen architecture
    with from scratch (a search trainer's path, a supernet's cell); None: `nasplat retrain` needs `--trainer`."""
    deterministic: ClassVar[bool] = False
    """Whether a trial's reports are a function of its config alone (not of its seed, its process, or anything
    else): a path judged by shared weights, a table lookup, a zero-cost proxy at a fixed init. Then a new trial
    whose config equals that of a trial already completed in this experiment (same `max_steps`) is answered from
    that trial's rows instead of run again: its rows are recorded with `cached_from: <that trial's id>` and cost
    no executor time (see `nasplat.engine.answers`)."""

    @abstractmethod
    def setup(self, config: Config, ctx: WorkerContext) -> None:
        """Build the trial's model, optimizer and data from `config`.

        When: once per attempt of a trial, on a fresh instance, before its first step: for a new trial, a retry
        after a failed attempt, a trial continued by `nasplat resume`, a paused trial promoted again (ASHA's
        promote type); also where the `processes` executor moves a waiting trial to an idle worker. On `ray`,
        on every rank of the trial's gang (actors are reused: the previous trial's trainer is dropped first); on
        `local` and `simulated`, in the driver's process; on `processes`, in a worker process. Where the attempt
        starts from a state (a checkpoint, an exploit's donor, its own kept state), `load_state_dict` follows;
        a child with a parent's weights (evolution's `inherit_weights`) gets `inherit_state` instead. The default
        `update_config` and `inherit_state` call `setup` again on the same instance to rebuild.
        Arguments: `config`, the trial's configuration from the space (one value per decision, nested as the space
        is), also `self.config`; `ctx`, where this worker runs (`WorkerContext`), also `self.ctx`.
        Returns: None. An exception fails the attempt (retried `max_failures` times), never the experiment.
        """

    @abstractmethod
    def step(self) -> dict[str, Any]:
        """Train one unit (an epoch, some batches, one evaluation) and report it.

        When: right after `setup` (and the load, if any), then each time the engine has taken in the previous
        step's report and the controller (or its scheduler) let the trial go on, up to the budget's `max_steps` (a PBT
        member that copied a donor counts from the donor's progress). On a gang every rank steps; rank 0's
        report speaks for the trial. On `simulated` the step runs at once and its result is released when the
        simulated clock reaches its end.
        Arguments: none.
        Returns: a mapping of metric names (strings) to values: real numbers (Python, numpy scalars, 0-d or
        one-element arrays and tensors, all recorded as int or float), strings, booleans or None; one row of
        `results.jsonl` per step. Every objective (`metric`, each of several, the metric of each constraint)
        must be present and a finite number. Keys that bookkeeping owns (`nasplat.core.rows.RESERVED`: `trial_id`,
        `step`, `status`, `config`, ...) are refused. Two keys mean something: `done: True` ends the trial as
        completed after this step; `time_cost` is the step's simulated seconds on the `simulated` executor
        (required there, a finite number > 0; the key is `executor_options={"cost_key": ...}`). A report that
        breaks these rules fails the trial without a retry; an exception fails the attempt (retried
        `max_failures` times, from the trial's latest checkpoint or exploited state where it has one, else from
        the start).
        """

    def state_dict(self) -> dict[str, Any]:
        """The trainer's whole state (model, optimizer, schedulers, counters): what `load_state_dict` restores.

        When: between steps, never during one, whenever nasplat needs the state: a checkpoint (due under the
        `checkpoint` policy: every `every` steps, at a perturbation step, at the trial's end; and, with `storage`,
        always when the trial is paused); a snapshot a later exploit will copy (`Controller.snapshot_due`, PBT);
        an exploit's donor state; the final state kept for a child (`inherit_weights`) or for a paused trial's
        promotion; on `simulated`, before every step (the state as of each moment of the simulated clock); on
        `processes`, to move a waiting trial to another worker; and right before every `load_state_dict`, as the
        tensors to copy into.
        Arguments: none.
        Returns: a nested structure (dicts, lists, tuples) of torch tensors, numpy arrays and plain values
        (`torch.save` writes it to a checkpoint's `state.pt`, read back as data with `weights_only=True`: another
        Python object in it makes its checkpoints unreadable without `--trust-pickle`). Live tensors are fine: nasplat copies or serialises
        the state before the trainer steps again. The default raises NotImplementedError: a checkpoint then
        fails (recorded as failed; the trial goes on), and exploits, `inherit_weights` and pausing need a real one.
        """
        raise NotImplementedError(f"{type(self).__name__} does not implement state_dict(); PBT exploit needs it")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the trainer's state by `state`, whole.

        When: after `setup`, where an attempt starts from a state: a retry, a resumed trial or a promoted paused
        trial (from its latest checkpoint or in-memory state, whichever is further), a trial moved between
        `processes` workers; and for a PBT exploit, on a running trial, followed by `update_config` with the new
        config. On a gang, on every rank. The default `inherit_state` and `update_config` call it too.
        Arguments: `state`, as some `state_dict` of this trainer class returned it (this trial's earlier state, a
        donor's, or one read back from a checkpoint), with its tensors already copied into those of the current
        `state_dict()` where shape and dtype match (the others are fresh tensors, yours to keep).
        Returns: None. An exception fails the attempt, like one from `setup`.
        """
        raise NotImplementedError(f"{type(self).__name__} does not implement load_state_dict(); PBT exploit needs it")

    def inherit_state(self, state: dict[str, Any]) -> None:
        """Start from a parent trial's final state (regularized evolution with `inherit_weights`).

        When: after `setup`, instead of `load_state_dict`, for a new trial whose controller named a parent
        (`TrialSpec.inherit_from`) whose final state was kept when it ended.
        Arguments: `state`, the parent's final `state_dict`. A child is a mutation, so it may not fit.
        Returns: None. The default loads it whole and, if that fails, keeps the fresh initialisation (calling
        `setup` again: nothing half-loaded). Override to take what fits (`trainers.classification` copies the
        matching tensors)."""
        try:
            self.load_state_dict(state)
        except (RuntimeError, KeyError, ValueError, TypeError):
            start(self, self.config, self.ctx)  # nothing half-loaded

    @classmethod
    def check_experiment(cls, space: Any, *, max_steps: int) -> None:
        """Refuse a setup this trainer cannot run as asked, before anything runs.

        When: once, in the driver, when an experiment with this trainer is built (`nasplat run`, `nasplat.run`,
        `nasplat resume`), before its folder is created or any trial starts.
        Arguments: `space`, the search space the trials' configs come from (a `Space`); `max_steps`, the steps a
        trial may run. Returns: None; a `ValueError` (one line naming what does not match) refuses the
        experiment. The default accepts everything."""

    def update_config(self, config: Config) -> None:
        """Put `config` in effect after an exploit.

        When: on a running trial the controller exploited (PBT): right after `load_state_dict` loaded the donor's
        state, before the trial's next step; on a gang, on every rank.
        Arguments: `config`, the new (perturbed) configuration, already set as `self.config`.
        Returns: None. The default rebuilds through `setup` and reloads the state, then puts back the
        hyperparameters (lr, momentum, ...) of every optimizer attribute as `setup` just set them, since the loaded
        optimizer state would restore the old ones. Override to change only what differs."""
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
