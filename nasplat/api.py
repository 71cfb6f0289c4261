"""The Python entry points: `nasplat.run(...)` and `nasplat.resume(folder)`."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import cloudpickle

from nasplat.checkpoint import CheckpointPolicy
from nasplat.controllers import CONTROLLERS, Controller, check_controller_options
from nasplat.engine import Engine
from nasplat.trials import Budget
from nasplat.executors.base import Executor
from nasplat.executors.local import LocalExecutor
from nasplat.executors.processes import ProcessExecutor
from nasplat.executors.simulated import SimulatedExecutor
from nasplat.results import ExperimentResult
from nasplat.schedulers import Scheduler, make_scheduler
from nasplat.space import Space
from nasplat.storage import META_FILE, SPEC_JSON, SPEC_PICKLE, ExperimentFolder, is_uri
from nasplat.trainer import check_trainer, resolve
from nasplat.validation import check_name, check_run_options

EXECUTORS = ("local", "processes", "simulated", "ray")


def make_controller(controller: str | type | Controller, space: Any, *, metric: str | Sequence[str] | None,
                    mode: str | Sequence[str], seed: int, options: Mapping[str, Any] | None = None,
                    constraints: Any = None) -> Controller:
    """A controller from an instance, a class, or a name in `CONTROLLERS` plus keyword options."""
    if isinstance(controller, Controller):
        if options:
            raise ValueError(f"controller options {dict(options)!r} given with a ready controller instance")
        return controller
    if isinstance(controller, str):
        if controller not in CONTROLLERS:
            raise ValueError(f"unknown controller {controller!r}; allowed: {sorted(CONTROLLERS)}")
        controller = CONTROLLERS[controller]
    if isinstance(controller, type) and issubclass(controller, Controller):
        options = check_controller_options(controller, options)
    if space is None or metric is None:
        raise ValueError(f"`space` and `metric` are needed to build a controller, got space={space!r}, {metric=!r}")
    space = resolve(space, what="space")
    extra = {"constraints": constraints} if constraints is not None else {}
    return controller(space if isinstance(space, Space) else Space(space), metric=metric, mode=mode, seed=seed,
                      **extra, **dict(options or {}))


def make_executor(executor: str | Executor, *, concurrency: int | None, **options: Any) -> Executor:
    """An executor by name (`local`, `processes`, `simulated`, `ray`) or a ready instance."""
    if isinstance(executor, Executor):
        return executor
    if executor == "local":
        return LocalExecutor(concurrency or 1, **options)
    if executor == "processes":
        return ProcessExecutor(concurrency or 1, **options)
    if executor == "simulated":
        return SimulatedExecutor(concurrency or 1, **options)
    if executor == "ray":
        from nasplat.executors.ray_executor import RayExecutor
        return RayExecutor(concurrency, **options)
    raise ValueError(f"unknown executor {executor!r}; allowed: {list(EXECUTORS)} or an Executor instance")


def run(*, trainer: type | str, controller: str | type | Controller = "random", space: Any = None,
        metric: str | Sequence[str] | None = None, mode: str | Sequence[str] = "max", constraints: Any = None,
        executor: str | Executor = "local",
        concurrency: int | None = None, max_trials: int | None = None, time_budget_s: float | None = None,
        max_steps: int = 1, max_failures: int = 0, max_failed_trials: int | None = 10, seed: int = 0,
        name: str | None = None, storage: str | Path | None = None,
        checkpoint: CheckpointPolicy | Mapping[str, Any] | bool | None = None, progress: bool = False,
        controller_options: Mapping[str, Any] | None = None, executor_options: Mapping[str, Any] | None = None,
        callbacks: Sequence[Any] = (), scheduler: str | Mapping[str, Any] | Scheduler | None = None
        ) -> ExperimentResult:
    """Run a search: `controller` proposes configs of `space`, `executor` trains them with `trainer`.

    `concurrency` trials run at once (default: 1 in process, as many as the Ray cluster's CPUs hold on
    `ray`). Each trial runs up to `max_steps` steps of `trainer` (a PBT member that copied a donor's earlier state
    trains on until its lineage has trained that many); the search asks for new trials until `max_trials`
    trials were started and/or `time_budget_s` seconds passed on the executor's clock. A trial that raises is
    retried `max_failures` times; once more than `max_failed_trials` trials failed (None: no limit) the run stops
    and raises `ExperimentFailed` with the first errors. Several objectives: `metric=[...]`, `mode=[...]` (one
    each) and `constraints=["params <= 1.0", ...]`.

    With `storage` (a folder, or a URI such as `s3://bucket/prefix` that `pyarrow.fs` opens), every step is appended
    to `<storage>/<name>/results.jsonl` and the folder is kept so that `nasplat.resume(folder)` finishes a killed
    run; `checkpoint` (a `CheckpointPolicy`, a mapping of its fields, or True for its defaults) also writes trainer
    states there, so that resumed and retried trials continue from their latest checkpoint. Each of `callbacks` has
    `on_row(engine, row)` called with every recorded row (and `on_start(engine)`, `on_end(engine)` if it has them).
    Everything is checked before the folder is created.

    `scheduler` stops or pauses trials early around the controller: `"asha"`, `"hyperband"`, `"median"`, a mapping
    `{"name": "asha", "type": "promote", ...}` of a name and its options (`nasplat.schedulers`), or a ready
    `Scheduler` wrapping `controller`.

    `executor="simulated"` runs every step at once in this process on a simulated clock with
    `concurrency` virtual workers: each step must report a numeric `time_cost` metric (its simulated
    seconds; the key is `executor_options={"cost_key": ...}`), finishes that many seconds after it started,
    and results arrive in order of finishing time, so asynchrony is modelled exactly and deterministically.
    `time_budget_s` then counts simulated seconds: trials start while the clock is below it, and a trial
    started just before the end still finishes. This is how tabular and surrogate objectives are searched
    (NAS-Bench-201 in `benchmarks/nb201.py`; a table of your own in `examples/tabular.py`).

    `executor="local"` steps the trials in this process, one at a time; `executor="processes"` in worker processes
    forked from this one (`executor_options={"processes": n, "threads": k}`; default one per core, the cores'
    torch threads shared out), which start in milliseconds with what this process has loaded; `executor="ray"` in
    Ray actors, on this machine or a cluster.
    """
    spec = dict(trainer=trainer, controller=controller, space=space, metric=metric, mode=mode,
                constraints=constraints, executor=executor,
                concurrency=concurrency, max_trials=max_trials, time_budget_s=time_budget_s, max_steps=max_steps,
                max_failures=max_failures, max_failed_trials=max_failed_trials, seed=seed, name=name,
                storage=None if storage is None else str(storage), checkpoint=checkpoint,
                controller_options=dict(controller_options or {}), executor_options=dict(executor_options or {}),
                callbacks=callbacks if isinstance(callbacks, (str, Mapping)) else list(callbacks))
    spec["scheduler"] = dict(scheduler) if isinstance(scheduler, Mapping) else scheduler
    built = _build(spec)
    folder = None
    if storage is not None:
        folder = ExperimentFolder(storage_location(str(storage), built["name"]))
        spec["name"] = built["name"]
        ctrl = built["controller"]
        several = len(ctrl.metrics) > 1  # lists for several objectives, as ExperimentResult.load reads them
        meta = dict(name=built["name"], metric=list(ctrl.metrics) if several else ctrl.metric,
                    mode=list(ctrl.modes) if several else ctrl.mode,
                    controller=type(ctrl).__name__, location=folder.location,
                    executor=executor if isinstance(executor, str) else type(executor).__name__,
                    **({"constraints": [str(c) for c in ctrl.constraints]} if ctrl.constraints else {}))
        if isinstance(ctrl, Scheduler):  # the wrapped controller, and the rungs for the report
            meta.update(controller=type(ctrl.controller).__name__, schedule=ctrl.describe())
        files = {META_FILE: json.dumps(meta, indent=2).encode()}
        plain = _plain_json(spec)
        files.update({SPEC_JSON: plain.encode()} if plain is not None else {SPEC_PICKLE: _pickled(spec)})
        folder.create(files)
    return _engine(built, folder, progress).run()


def resume(location: str | Path, *, progress: bool = False) -> ExperimentResult:
    """Finish the experiment at `location` (a folder or URI): the controller is rebuilt by replaying the recorded
    rows, running trials continue from their latest checkpoint; no recorded row is lost or duplicated."""
    from nasplat.replay import resume_engine

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


def read_spec(path: Path) -> dict[str, Any]:
    """The experiment as `nasplat.run` got it: plain JSON, or (for live objects handed to the Python API) a pickle,
    which runs code when loaded: resume only folders you trust."""
    if (path / SPEC_JSON).exists():
        try:
            return json.loads((path / SPEC_JSON).read_text(encoding="utf-8"))
        except ValueError as exc:
            raise ValueError(f"{path / SPEC_JSON}: cannot read it as JSON ({exc})") from None
    if (path / SPEC_PICKLE).exists():
        try:
            return cloudpickle.loads((path / SPEC_PICKLE).read_bytes())
        except Exception as exc:
            raise ValueError(f"{path / SPEC_PICKLE}: cannot load it ({type(exc).__name__}: {exc})") from None
    raise FileNotFoundError(f"{path} is not a nasplat experiment folder (no {SPEC_JSON} or {SPEC_PICKLE})")


def storage_location(storage: str, name: str) -> str:
    """Where the experiment `name` lives under `storage`. A relative folder inside a Ray job's uploaded working
    directory (which Ray deletes) is placed under `$NASPLAT_RESULTS` (default `~/nasplat_results`) instead."""
    if is_uri(storage):
        return f"{storage.rstrip('/')}/{name}"
    base = Path(storage).expanduser()
    if not base.is_absolute() and "runtime_resources" in Path.cwd().parts:
        base = Path(os.environ.get("NASPLAT_RESULTS", Path.home() / "nasplat_results")) / base
    return str(base.resolve() / name)


def _build(spec: dict[str, Any]) -> dict[str, Any]:
    """Everything the engine needs, checked: trainer, controller, budget, executor, checkpoint policy, name."""
    check_run_options(**{key: spec[key] for key in ("metric", "mode", "max_trials", "time_budget_s", "max_steps",
                                                     "concurrency", "max_failures", "max_failed_trials", "seed",
                                                     "name", "executor_options")})
    trainer = check_trainer(resolve(spec["trainer"], what="trainer"))
    controller = make_controller(spec["controller"], spec["space"], metric=spec["metric"], mode=spec["mode"],
                                 seed=spec["seed"], options=spec["controller_options"],
                                 constraints=spec.get("constraints"))
    if spec.get("scheduler") is not None:  # a scheduler wraps the controller and is the controller to the engine
        controller = make_scheduler(spec["scheduler"], controller, max_steps=spec["max_steps"])
    name = spec["name"] or f"{type(controller).__name__.lower()}-{time.strftime('%Y%m%d-%H%M%S')}"
    check_name(name)
    if spec["storage"] is not None and not isinstance(spec["storage"], str):
        raise ValueError(f"`storage` must be a folder or a URI, got {spec['storage']!r}")
    budget = Budget(spec["max_trials"], spec["time_budget_s"], spec["max_steps"])
    policy = CheckpointPolicy.from_options(spec["checkpoint"])
    if policy is not None and spec["storage"] is None:
        raise ValueError("`checkpoint` needs `storage`: checkpoints are written into the experiment's storage")
    executor = make_executor(spec["executor"], concurrency=spec["concurrency"], **spec["executor_options"])
    return dict(trainer=trainer, controller=controller, name=name, budget=budget, policy=policy, executor=executor,
                seed=spec["seed"], max_failures=spec["max_failures"], max_failed_trials=spec["max_failed_trials"],
                callbacks=_callbacks(spec["callbacks"]), ray=spec["executor"] == "ray")


def _callbacks(specs: Sequence[Any]) -> list[Any]:
    """Listener objects as given; names and mappings (`"mlflow"`, `{"name": "mlflow", ...}`) built by the
    integrations' registry, so that an experiment file's callbacks stay plain data."""
    from nasplat.integrations import make_callbacks

    if isinstance(specs, (str, Mapping)) or not isinstance(specs, Sequence):
        raise ValueError(f"`callbacks` must be a list of listeners, names or mappings, got {specs!r}")
    return [make_callbacks([c])[0] if isinstance(c, (str, Mapping)) else c for c in specs]


def _engine(built: dict[str, Any], folder: ExperimentFolder | None, progress: bool) -> Engine:
    engine = Engine(controller=built["controller"], executor=built["executor"], trainer=built["trainer"],
                    budget=built["budget"], name=built["name"], seed=built["seed"], max_failures=built["max_failures"],
                    max_failed_trials=built["max_failed_trials"], folder=folder, checkpoint=built["policy"],
                    progress=progress)
    engine.listeners.extend(built["callbacks"])
    from nasplat.integrations import default_listeners  # TensorBoard event files where tensorboard is installed
    engine.listeners.extend(default_listeners(folder.path if folder is not None else None, built["callbacks"]))
    if built["ray"]:
        from nasplat.monitoring import RayMetrics
        engine.listeners.append(RayMetrics(built["name"]))
    return engine


def _pickled(spec: dict[str, Any]) -> bytes:
    """`spec` pickled for storage; objects that cannot be pickled are named before anything is written."""
    try:
        return cloudpickle.dumps(spec)
    except Exception as exc:
        raise ValueError(f"the experiment cannot be saved to `storage`: {type(exc).__name__}: {exc}; give the trainer, "
                         "space and controller by dotted path and name, or objects that pickle") from None


def _plain_json(spec: dict[str, Any]) -> str | None:
    """`spec` as JSON if it is plain data (names, dotted paths, numbers), else None."""
    try:
        text = json.dumps(spec, indent=2, allow_nan=False)
    except (TypeError, ValueError):
        return None
    return text if json.loads(text) == spec else None
