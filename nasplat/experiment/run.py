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
from nasplat.storage import META_FILE, ExperimentFolder, is_uri, read_spec
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
    """Run a search: `controller` proposes configs of `space`, `executor` trains them with `trainer`.

    `concurrency` trials run at once (default: 1 in process, as many as the Ray cluster's CPUs hold on
    `ray`). Each trial runs up to `max_steps` steps of `trainer` (a PBT member that copied a donor's earlier state
    trains on until its lineage has trained that many); the search asks for new trials until `max_trials`
    trials were started and/or `time_budget_s` seconds passed on the executor's clock. A trial that raises is
    retried `max_failures` times; once more than `max_failed_trials` trials failed (None: no limit) the run stops
    and raises `ExperimentFailed` with the first errors; a run in which every trial failed (under that limit)
    returns its result, whose `counts()` say so (`nasplat run` then exits with status 1). Several objectives:
    `metric=[...]`, `mode=[...]` (one each) and `constraints=["params <= 1.0", ...]`.

    `step_timeout_s` (default None: no limit) is the longest one step of a trial may run (a launch's `setup` and
    first step count as its first step; time waiting for resources does not); a step that runs longer is killed
    and fails its attempt ("step timed out after N s"), retried like any failure. Only executors that can stop a
    running step enforce it (`ray`, `processes`); on others it is refused. `time_budget_s` also bounds the wait
    for running steps: once it has passed, they get `step_timeout_s` more seconds (unset: 10% of `time_budget_s`,
    at least 10 s), then the trials still running are stopped and left for `nasplat.resume` to continue (not on
    `simulated`, whose steps take no wall time).

    With `storage` (a folder, or a URI such as `s3://bucket/prefix` that `pyarrow.fs` opens), every step is appended
    to `<storage>/<name>/results.jsonl` and the folder is kept so that `nasplat.resume(folder)` finishes a killed
    run; `checkpoint` (a `CheckpointPolicy`, a mapping of its fields, or True for its defaults) also writes trainer
    states there, so that resumed and retried trials continue from their latest checkpoint. Each of `callbacks` has
    `on_row(engine, row)` called with every recorded row (and `on_start(engine)`, `on_end(engine)` if it has them).
    Everything is checked before the folder is created.

    `scheduler` stops or pauses trials early around the controller: `"asha"`, `"hyperband"`, `"median"`, a mapping
    `{"name": "asha", "type": "promote", ...}` of a name and its options (`nasplat.schedulers`), or a ready
    `Scheduler` wrapping `controller`. `warm_start` (an earlier experiment's folder): its rows reach the
    controller's `warm_start` before the first trial (`mobster` learns from them).

    `executor="simulated"` runs every step at once in this process on a simulated clock with
    `concurrency` virtual workers: each step must report a numeric `time_cost` metric (its simulated
    seconds; the key is `executor_options={"cost_key": ...}`), finishes that many seconds after it started,
    and results arrive in order of finishing time, so asynchrony is modelled exactly and deterministically.
    `time_budget_s` then counts simulated seconds: trials start while the clock is below it, and a trial
    started just before the end still finishes. This is how tabular and surrogate objectives are searched
    (NAS-Bench-201 in `benchmarks/nb201.py`; a table of your own in `examples/tabular.py`).

    `executor="local"` (the default, as in experiment files) steps the trials in this process, one at a time; `executor="processes"` in worker processes
    forked from this one (`executor_options={"processes": n, "threads": k}`; default one per core, the cores'
    torch threads shared out), which start in milliseconds with what this process has loaded; `executor="ray"` in
    Ray actors, on this machine or a cluster.
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


def resume(location: str | Path, *, progress: bool = False) -> ExperimentResult:
    """Finish the experiment at `location` (a folder or URI): the controller is rebuilt by replaying the recorded
    rows, running trials continue from their latest checkpoint; no recorded row is lost or duplicated."""
    from nasplat.engine.replay import resume_engine

    folder = ExperimentFolder(location)
    rows, journal = folder.open_existing()
    try:
        engine = _engine(_build(read_spec(folder.path)), folder, progress)
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
    meta = dict(name=built.name, metric=list(ctrl.metrics) if several else ctrl.metric,
                mode=list(ctrl.modes) if several else ctrl.mode, controller=type(ctrl).__name__,
                location=folder.location, executor=built.executor_name,
                **({"constraints": [str(c) for c in ctrl.constraints]} if ctrl.constraints else {}))
    if isinstance(ctrl, Scheduler):  # the wrapped controller, and the rungs for the report
        meta.update(controller=type(ctrl.controller).__name__, schedule=ctrl.describe())
    folder.create({META_FILE: json.dumps(meta, indent=2).encode(), **built.spec.named(built.name).files()})
    return folder


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
