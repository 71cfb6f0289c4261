"""The Python entry points: `nasplat.run(...)` and `nasplat.resume(folder)`; `run_spec` runs a checked
`ExperimentSpec` (what the command line reads from YAML) through `build` and the engine."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from nasplat.controllers import Searcher
from nasplat.engine import Engine
from nasplat.engine.result import ExperimentResult
from nasplat.executors import DEFAULT_EXECUTOR
from nasplat.executors.base import Executor
from nasplat.experiment.build import BuiltExperiment, build, make_controller, make_executor
from nasplat.experiment.spec import ExperimentSpec
from nasplat.integrations import default_listeners
from nasplat.schedulers import Scheduler
from nasplat.space import Space
from nasplat.space.data import NotData, space_to_data
from nasplat.storage import META_FILE, ROWS_FILE, SPACE_FILE, ExperimentFolder, is_uri, read_spec
from nasplat.storage.checkpoints import CheckpointPolicy

__all__ = ["default_storage", "make_controller", "make_executor", "resume", "run", "run_spec", "storage_location"]


def run(*, trainer: type | str, controller: str | type | Searcher = "random", space: Any = None,
        metric: str | Sequence[str] | None = None, mode: str | Sequence[str] = "max", constraints: Any = None,
        executor: str | Executor = DEFAULT_EXECUTOR,
        concurrency: int | None = None, max_trials: int | None = None, time_budget_s: float | None = None,
        step_timeout_s: float | None = None, max_steps: int = 1, max_failures: int = 0,
        max_failed_trials: int | None = 10, seed: int = 0, name: str | None = None, storage: str | Path | None = None,
        checkpoint: CheckpointPolicy | Mapping[str, Any] | bool | None = None, progress: bool = False,
        controller_options: Mapping[str, Any] | None = None, executor_options: Mapping[str, Any] | None = None,
        callbacks: Sequence[Any] = (), scheduler: str | Mapping[str, Any] | Scheduler | None = None,
        warm_start: str | Path | None = None) -> ExperimentResult:
    """Run a search: `controller` proposes configs of `space`, `executor` trains them with `trainer`; returns the
    `ExperimentResult`. Everything is checked, in one line per mistake, before anything is created.

    - `trainer`, `space`: the `Trainer` class and the space (a `Space`, a dict of domains, or dotted paths to them).
    - `controller` (a name, a class or an instance) and its `controller_options`; `metric` and `mode` ("max" or
      "min"), lists of them for several objectives, with `constraints` such as `["params <= 1.0"]` (README,
      "Several objectives"); `seed` makes the search repeatable.
    - `executor`: "local" (default, in process), "processes", "ray" or "simulated" (a simulated clock: steps report
      `time_cost`), or an instance; `executor_options`; `concurrency` trials at once (README, "How it fits together").
    - Budget: new trials until `max_trials` were started and/or `time_budget_s` passed on the executor's clock; up to
      `max_steps` steps a trial; `step_timeout_s` per step (`ray`, `processes`); `max_failures` retries a trial;
      more than `max_failed_trials` failed trials raise `ExperimentFailed` (README, "Budget, step timeouts and runs
      that cannot succeed").
    - `scheduler`: "asha", "hyperband", "median", `{"name": ..., options}` or a `Scheduler` (README, "Stop bad trials
      early"); `warm_start`: an earlier experiment's folder whose rows reach the controller first (`mobster` learns
      from them).
    - `storage` (a folder or a `pyarrow.fs` URI) and `name`: where the rows go, for `nasplat.resume`; `checkpoint`: a
      `CheckpointPolicy`, its fields, or True (README, "Storage, resume and checkpoints").
    - `callbacks`: listeners with `on_row(engine, row)` (and `on_start`, `on_end`), or their names ("Use the tools
      you already watch"); `progress` prints a progress line.
    """
    spec = ExperimentSpec(
        trainer=trainer, controller=controller, space=space, metric=metric, mode=mode, constraints=constraints,
        executor=executor, concurrency=concurrency, max_trials=max_trials, time_budget_s=time_budget_s,
        step_timeout_s=step_timeout_s, max_steps=max_steps, max_failures=max_failures,
        max_failed_trials=max_failed_trials, seed=seed, name=name,
        storage=None if storage is None else str(storage), checkpoint=checkpoint,
        controller_options=dict(controller_options or {}), executor_options=dict(executor_options or {}),
        callbacks=callbacks if isinstance(callbacks, (str, Mapping)) else list(callbacks),
        scheduler=dict(scheduler) if isinstance(scheduler, Mapping) else scheduler,
        warm_start=None if warm_start is None else str(warm_start))
    return run_spec(spec.check(), progress=progress)


def run_spec(spec: ExperimentSpec, *, progress: bool = False,
             announce: Callable[[str], None] | None = None) -> ExperimentResult:
    """Run `spec` (checked: `ExperimentSpec.check`): build it, create its folder when it has `storage` (then call
    `announce` with the folder's location, before the first trial starts) and run the engine to the end."""
    built = build(spec)
    folder = None
    if spec.storage is not None:
        folder = _create_folder(built, spec.storage)
        if announce is not None:
            announce(folder.location)
    return _engine(built, folder, progress).run()


def resume(location: str | Path, *, progress: bool = False, allow_pickle: bool = False) -> ExperimentResult:
    """Finish the experiment at `location` (a folder or URI): the controller is rebuilt by replaying the recorded
    rows, running trials continue from their latest checkpoint; no recorded row is lost or duplicated.

    An experiment stored as a pickle (`experiment.pkl`: live objects were handed to `nasplat.run`) runs code from
    the folder when loaded: it is refused unless `allow_pickle=True`, before the folder is locked or changed."""
    from nasplat.engine.replay import resume_engine

    folder = ExperimentFolder(location)
    if folder.remote is not None and not (folder.path / ROWS_FILE).exists():
        folder.uploaded = folder.remote.download(folder.path)
    spec = read_spec(folder.path, allow_pickle=allow_pickle)  # refused before the lock is taken
    rows, journal = folder.open_existing()
    try:
        engine = _engine(_build(spec), folder, progress)
        line = resume_engine(engine, rows, journal)
    except BaseException:
        folder.close()
        raise
    if progress:
        print(f"[nasplat {engine.name}] {line}", file=sys.stderr, flush=True)
    return engine.run()


def storage_location(storage: str, name: str) -> str:
    """Where the experiment `name` lives under `storage`. A relative folder inside a Ray job's uploaded working
    directory (which Ray deletes) is placed under `$NASPLAT_RESULTS` (default `~/nasplat_results`) instead."""
    if is_uri(storage):
        return f"{storage.rstrip('/')}/{name}"
    base = Path(storage).expanduser()
    if not base.is_absolute() and _in_ray_job():
        base = _results_home() / base
    return str(base.resolve() / name)


def default_storage() -> str:
    """The storage of a `nasplat run` whose file names none: `$NASPLAT_RESULTS` if set, else `nasplat_results` in
    the current folder (`~/nasplat_results` inside a Ray job's working directory, which Ray deletes)."""
    if os.environ.get("NASPLAT_RESULTS"):
        return os.environ["NASPLAT_RESULTS"]
    return str(_results_home()) if _in_ray_job() else "nasplat_results"


def _in_ray_job() -> bool:
    return "runtime_resources" in Path.cwd().parts


def _results_home() -> Path:
    return Path(os.environ.get("NASPLAT_RESULTS") or Path.home() / "nasplat_results")


def _create_folder(built: BuiltExperiment, storage: str) -> ExperimentFolder:
    """The experiment's new folder under `storage`, holding `meta.json` and the spec (with the name it got)."""
    folder = ExperimentFolder(storage_location(storage, built.name))
    ctrl = built.controller
    several = len(ctrl.metrics) > 1  # lists for several objectives, as ExperimentResult.load reads them
    meta: dict[str, Any] = dict(name=built.name, metric=list(ctrl.metrics) if several else ctrl.metric,
                                mode=list(ctrl.modes) if several else ctrl.mode, controller=type(ctrl).__name__,
                                location=folder.location, executor=built.executor_name,
                                **({"constraints": [str(c) for c in ctrl.constraints]} if ctrl.constraints else {}))
    if isinstance(ctrl, Scheduler):  # the wrapped controller, and the rungs for the report
        meta.update(controller=type(ctrl.controller).__name__, schedule=ctrl.describe())
    folder.create({META_FILE: json.dumps(meta, indent=2).encode(), **built.spec.named(built.name).files(),
                   **_space_file(ctrl)})
    return folder


def _space_file(controller: Searcher) -> dict[str, bytes]:
    """`space.json` for the folder: the search space as plain data, which `report`, `status` and `serve` read
    instead of the spec; none when the space holds something that is not data (a domain class of the user's)."""
    space = getattr(controller.controller if isinstance(controller, Scheduler) else controller, "space", None)
    if not isinstance(space, Space):
        return {}
    try:
        return {SPACE_FILE: json.dumps(space_to_data(space), indent=1).encode()}
    except NotData:
        return {}


def _build(spec: ExperimentSpec | Mapping[str, Any]) -> BuiltExperiment:
    """`build` of a spec, or of its stored dict form (`read_spec`), checked first."""
    return build((spec if isinstance(spec, ExperimentSpec) else ExperimentSpec.from_dict(spec)).check())


def _engine(built: BuiltExperiment, folder: ExperimentFolder | None, progress: bool) -> Engine:
    """The engine that runs `built`, recording into `folder`, with the callbacks and the default listeners."""
    engine = Engine(controller=built.controller, executor=built.executor, trainer=built.trainer,
                    budget=built.budget, name=built.name, seed=built.seed, max_failures=built.max_failures,
                    max_failed_trials=built.max_failed_trials, folder=folder, checkpoint=built.policy,
                    progress=progress)
    engine.listeners.extend(built.callbacks)
    engine.listeners.extend(default_listeners(folder.path if folder is not None else None, built.callbacks,
                                              ray_dashboard=built.ray_dashboard, name=built.name))
    return engine
