"""A checked `ExperimentSpec` turned into what the engine runs: `BuiltExperiment`. The trainer's module is imported
here, once; the controller, scheduler, executor and callbacks are made from their registries' names."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nasplat.controllers import CONTROLLERS, Controller, check_controller_options
from nasplat.controllers.base import Result, Searcher
from nasplat.core.rows import RESERVED, Status
from nasplat.engine.records import Budget
from nasplat.executors import EXECUTORS, check_step_timeout, step_timeout_in_force
from nasplat.executors.base import Executor
from nasplat.experiment.spec import ExperimentSpec
from nasplat.integrations import make_callbacks
from nasplat.schedulers import make_scheduler
from nasplat.space import Config, Space
from nasplat.space.data import stored_space
from nasplat.storage import ROWS_FILE, read_rows
from nasplat.storage.checkpoints import CheckpointPolicy
from nasplat.trainer import Trainer, check_trainer, resolve


@dataclass(frozen=True)
class BuiltExperiment:
    """Everything the engine needs, made from `spec`: the trainer class, the controller (a scheduler around it if
    one was asked for), the experiment's name, its budget, checkpoint policy, executor and listeners."""

    spec: ExperimentSpec
    trainer: type[Trainer]
    controller: Searcher
    name: str
    budget: Budget
    policy: CheckpointPolicy | None
    executor: Executor
    callbacks: list[Any]

    @property
    def seed(self) -> int:
        return self.spec.seed

    @property
    def max_failures(self) -> int:
        return self.spec.max_failures

    @property
    def max_failed_trials(self) -> int | None:
        return self.spec.max_failed_trials

    @property
    def ray_dashboard(self) -> bool:
        """Whether the executor declares that it runs on Ray (`Executor.ray_dashboard`), so that the Ray dashboard
        shows the experiment's gauges."""
        return self.executor.ray_dashboard

    @property
    def executor_name(self) -> str:
        """The executor as `meta.json` names it: its registry name, or the class name of a ready instance."""
        return self.spec.executor if isinstance(self.spec.executor, str) else type(self.executor).__name__


def earlier_results(folder: str, space: Space, metric: str) -> list[tuple[Config, Result]]:
    """The rows of an earlier experiment's folder (untrusted) as (config, result) for `Searcher.warm_start`: those
    with `metric`, a step and a config of `space`, in their order; failed rows are left out."""
    results = []
    for row in read_rows(Path(folder) / ROWS_FILE):
        config, step = row.get("config"), row.get("step")
        if row.get("status") == Status.FAILED or metric not in row or not isinstance(step, int) or step < 1:
            continue
        try:
            if not isinstance(config, dict):
                raise TypeError(f"config must be a dict, got {config!r}")
            space.validate(config)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"warm_start: a row of {folder} has a config outside this experiment's space: "
                             f"{exc}") from None
        results.append((config, Result({k: v for k, v in row.items() if k not in RESERVED}, step)))
    return results


def build(spec: ExperimentSpec) -> BuiltExperiment:
    """The experiment `spec` (checked by `ExperimentSpec.check`) made ready to run; nothing is started."""
    trainer = check_trainer(resolve(spec.trainer, what="trainer"))
    controller = make_controller(spec.controller, spec.space, metric=spec.metric, mode=spec.mode, seed=spec.seed,
                                 options=spec.controller_options, constraints=spec.constraints)
    space = getattr(controller, "space", None)
    if isinstance(space, Space):
        trainer.check_experiment(space, max_steps=spec.max_steps)  # a wrong setup refused before anything runs
    if spec.scheduler is not None:  # a scheduler wraps the controller and is the controller to the engine
        controller = make_scheduler(spec.scheduler, controller, max_steps=spec.max_steps)
    if spec.warm_start is not None:  # again on a resume, before the replay: the same controller either way
        controller.warm_start(earlier_results(spec.warm_start, controller.space, controller.metric))
    name = spec.name or f"{type(controller).__name__.lower()}-{time.strftime('%Y%m%d-%H%M%S')}"
    callbacks = _callbacks(spec.callbacks)
    executor = make_executor(spec.executor, concurrency=spec.concurrency, step_timeout_s=spec.step_timeout_s,
                             **spec.executor_options)  # a timeout it cannot enforce refused before any folder exists
    return BuiltExperiment(
        spec=spec, trainer=trainer, controller=controller, name=name,
        budget=Budget(max_trials=spec.max_trials, time_s=spec.time_budget_s, max_steps=spec.max_steps,
                      step_timeout_s=step_timeout_in_force(executor, spec.step_timeout_s)),
        policy=CheckpointPolicy.from_options(spec.checkpoint), executor=executor, callbacks=callbacks)


def make_controller(controller: str | type | Searcher, space: Any, *, metric: str | Sequence[str] | None,
                    mode: str | Sequence[str], seed: int, options: Mapping[str, Any] | None = None,
                    constraints: Any = None) -> Searcher:
    """A controller from an instance (as it is), or from a class or a name in `CONTROLLERS` called on the space (a
    `Space`, a mapping of domains, or its dotted path) with the metric, mode, seed, constraints and `options`
    (their names checked)."""
    if isinstance(controller, Searcher):  # a ready controller (or scheduler)
        if options:
            raise ValueError(f"controller options {dict(options)!r} given with a ready controller instance")
        return controller
    cls = CONTROLLERS.lookup(controller) if isinstance(controller, str) else controller
    if isinstance(cls, type) and issubclass(cls, Controller):
        options = check_controller_options(cls, options)
    if space is None or metric is None:
        raise ValueError(f"`space` and `metric` are needed to build a controller, got space={space!r}, {metric=!r}")
    extra = {"constraints": constraints} if constraints is not None else {}
    return cls(make_space(space), metric=metric, mode=mode, seed=seed, **extra, **dict(options or {}))


def make_space(space: Any) -> Space:
    """The search space: a `Space`, a mapping of domains, a dotted path to either, or a list of those merged in
    order (later keys win, every part's rules kept): `[search_spaces.nb201:space, {supernet: results/sn}]`."""
    parts = [stored_space(resolve(part, what="space")) for part in (space if isinstance(space, list) else [space])]
    spaces = [part if isinstance(part, Space) else Space(part) for part in parts]
    if len(spaces) == 1:
        return spaces[0]
    domains = {key: domain for part in spaces for key, domain in part.domains.items()}
    return Space(domains, forbidden={name: rule for part in spaces for name, rule in part.forbidden.items()})


def make_executor(executor: str | Executor, *, concurrency: int | None, step_timeout_s: float | None = None,
                  **options: Any) -> Executor:
    """A ready instance as it is (a `step_timeout_s` other than its own refused), or the executor of `EXECUTORS`
    called `executor` with `concurrency` trials at once (None: the executor's default, 1 in process, what the Ray
    cluster holds on `ray`), `step_timeout_s` (refused first by a class that cannot enforce it) and `options`."""
    if isinstance(executor, Executor):
        step_timeout_in_force(executor, step_timeout_s)
        return executor
    cls = EXECUTORS.lookup(executor)
    check_step_timeout(cls, step_timeout_s)
    timeout = {"step_timeout_s": step_timeout_s} if step_timeout_s is not None and "step_timeout_s" not in options \
        else {}  # where `options` has its own too, `step_timeout_in_force` compares them
    return cls(**({"concurrency": concurrency} if concurrency is not None else {}), **timeout, **options)


def _callbacks(specs: Sequence[Any]) -> list[Any]:
    """Listener objects as given; names and mappings (`"mlflow"`, `{"name": "mlflow", ...}`) built by the
    integrations' registry, so that an experiment file's callbacks stay plain data."""
    return [make_callbacks([c])[0] if isinstance(c, (str, Mapping)) else c for c in specs]
