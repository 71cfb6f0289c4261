"""The Python entry points: `nasplat.run(...)` and `nasplat.resume(folder)`."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import cloudpickle

from nasplat.controllers import CONTROLLERS, Controller
from nasplat.engine import Budget, Engine, write_meta
from nasplat.executors.base import Executor
from nasplat.executors.local import LocalExecutor, SimulatedExecutor
from nasplat.results import ROWS_FILE, SPEC_FILE, STATE_FILE, ExperimentResult, load_pickle, write_atomic
from nasplat.space import Space
from nasplat.trainer import resolve

EXECUTORS = ("local", "simulated", "ray")


def make_controller(controller: str | type | Controller, space: Any, *, metric: str | None, mode: str, seed: int,
                    options: Mapping[str, Any] | None = None) -> Controller:
    """A controller from an instance, a class, or a name in `CONTROLLERS` plus keyword options."""
    if isinstance(controller, Controller):
        if options:
            raise ValueError(f"controller options {dict(options)!r} given with a ready controller instance")
        return controller
    if isinstance(controller, str):
        if controller not in CONTROLLERS:
            raise ValueError(f"unknown controller {controller!r}; allowed: {sorted(CONTROLLERS)}")
        controller = CONTROLLERS[controller]
    if space is None or metric is None:
        raise ValueError(f"`space` and `metric` are needed to build a controller, got space={space!r}, {metric=!r}")
    space = resolve(space, what="space")
    return controller(space if isinstance(space, Space) else Space(space), metric=metric, mode=mode, seed=seed,
                      **dict(options or {}))


def make_executor(executor: str | Executor, *, concurrency: int | None, **options: Any) -> Executor:
    """An executor by name (`local`, `simulated`, `ray`) or a ready instance."""
    if isinstance(executor, Executor):
        return executor
    if executor == "local":
        return LocalExecutor(concurrency or 1, **options)
    if executor == "simulated":
        return SimulatedExecutor(concurrency or 1, **options)
    if executor == "ray":
        from nasplat.executors.ray_executor import RayExecutor
        return RayExecutor(concurrency, **options)
    raise ValueError(f"unknown executor {executor!r}; allowed: {list(EXECUTORS)} or an Executor instance")


def run(*, trainer: type | str, controller: str | type | Controller = "random", space: Any = None,
        metric: str | None = None, mode: Literal["max", "min"] = "max", executor: str | Executor = "local",
        concurrency: int | None = None, max_trials: int | None = None, time_budget_s: float | None = None,
        max_steps: int = 1,
        max_failures: int = 0, seed: int = 0, name: str | None = None,
        storage: str | Path | None = None, progress: bool = False, controller_options: Mapping[str, Any] | None = None,
        executor_options: Mapping[str, Any] | None = None, checkpoint_interval_s: float = 1.0,
        callbacks: Sequence[Any] = ()) -> ExperimentResult:
    """Run a search: `controller` proposes configs of `space`, `executor` trains them with `trainer`.

    `concurrency` trials run at once (default: 1 in process, as many as the Ray cluster's CPUs hold on
    `ray`). Each trial runs up to `max_steps` steps of `trainer`; the search asks for new trials until `max_trials`
    trials were started and/or `time_budget_s` seconds passed on the executor's clock. With `storage`,
    every step is appended to `<storage>/<name>/results.jsonl` and the state is checkpointed so that
    `nasplat.resume(folder)` can finish a killed run. Each of `callbacks` has `on_row(engine, row)` called
    with every recorded row.

    `executor="simulated"` runs every step at once in this process on a simulated clock with
    `concurrency` virtual workers: each step must report a numeric `time_cost` metric (its simulated
    seconds; the key is `executor_options={"cost_key": ...}`), finishes that many seconds after it started,
    and results arrive in order of finishing time, so asynchrony is modelled exactly and deterministically.
    `time_budget_s` then counts simulated seconds: trials start while the clock is below it, and a trial
    started just before the end still finishes. This is how tabular and surrogate objectives are searched
    (NAS-Bench-201 in `benchmarks/nb201.py`; a table of your own in `examples/tabular.py`).
    """
    trainer_cls = resolve(trainer, what="trainer")
    if not isinstance(trainer_cls, type):
        raise TypeError(f"`trainer` must be a Trainer class (or its dotted path), got {trainer_cls!r}")
    ctrl = make_controller(controller, space, metric=metric, mode=mode, seed=seed, options=controller_options)
    name = name or f"{type(ctrl).__name__.lower()}-{time.strftime('%Y%m%d-%H%M%S')}"
    settings = dict(trainer=trainer_cls, controller=ctrl, executor=executor, concurrency=concurrency,
                    budget=Budget(max_trials, time_budget_s, max_steps), max_failures=max_failures,
                    seed=seed, name=name, progress=progress,
                    executor_options=dict(executor_options or {}), checkpoint_interval_s=checkpoint_interval_s,
                    callbacks=list(callbacks))
    folder = None
    if storage is not None:
        folder = Path(storage) / name
        if (folder / ROWS_FILE).exists():
            raise FileExistsError(f"{folder} already holds an experiment; continue it with `nasplat resume {folder}` "
                                  "or choose another `name`")
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(folder / SPEC_FILE, cloudpickle.dumps(settings))
        write_meta(folder, name=name, metric=ctrl.metric, mode=ctrl.mode, controller=type(ctrl).__name__,
                   executor=executor if isinstance(executor, str) else type(executor).__name__)
    return _engine(settings, folder).run()


def resume(folder: str | Path, *, progress: bool | None = None) -> ExperimentResult:
    """Finish the experiment in `folder` from its last checkpoint; completed rows are kept, none duplicated."""
    folder = Path(folder)
    if not (folder / SPEC_FILE).exists():
        raise FileNotFoundError(f"{folder} is not a nasplat experiment folder (no {SPEC_FILE})")
    settings = load_pickle(folder / SPEC_FILE)
    if progress is not None:
        settings["progress"] = progress
    engine = _engine(settings, folder)
    if (folder / STATE_FILE).exists():
        engine.load_state_dict(load_pickle(folder / STATE_FILE))
    return engine.run()


def _engine(settings: dict[str, Any], folder: Path | None) -> Engine:
    executor = make_executor(settings["executor"], concurrency=settings["concurrency"], **settings["executor_options"])
    engine = Engine(controller=settings["controller"], executor=executor, trainer=settings["trainer"],
                  budget=settings["budget"], name=settings["name"], seed=settings["seed"],
                  max_failures=settings["max_failures"], storage=folder,
                  progress=settings["progress"], checkpoint_interval_s=settings["checkpoint_interval_s"])
    engine.listeners.extend(settings["callbacks"])
    if settings["executor"] == "ray":
        from nasplat.monitoring import RayMetrics
        engine.listeners.append(RayMetrics(settings["name"]))
    return engine
