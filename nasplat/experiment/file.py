"""Experiment files: YAML with the space, trainer, controller, budget, resources and storage of a search.

Everything is checked here, before any module is imported or folder created; each mistake is one line naming
the file, the key, the value received and what is allowed. Numbers must be YAML numbers: a quoted `"10"` is
refused (see `nasplat.core.checks`), and so is `true` where an integer is expected. Floats follow YAML 1.2, so
`1e3` is the number 1000.0 here as inside a constraint string (PyYAML alone, on YAML 1.1, reads it as a string).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from nasplat.controllers import CONTROLLERS
from nasplat.core.checks import EXPERIMENT_MODES, check_choice
from nasplat.executors import DEFAULT_EXECUTOR, EXECUTORS
from nasplat.experiment.spec import ExperimentSpec
from nasplat.schedulers import check_scheduler

TOP_KEYS = ("name", "trainer", "space", "metric", "mode", "constraints", "controller", "budget", "resources",
            "executor", "storage", "seed", "max_failures", "max_failed_trials", "checkpoint", "callbacks",
            "scheduler", "warm_start")
REQUIRED = ("trainer", "space", "metric", "controller", "budget")
BUDGET_KEYS = ("max_trials", "time_budget_s", "max_steps", "step_timeout_s")
RESOURCE_KEYS = ("concurrency", "cpus_per_trial", "gpus_per_trial", "workers", "backend", "strategy", "backend_options")
RAY_ONLY = ("cpus_per_trial", "gpus_per_trial", "workers", "backend", "strategy", "backend_options")


class ExperimentLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's floats: `1e3`, `2E-1` and `.5` are numbers, as everywhere else."""


ExperimentLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def read_experiment_file(path: str | Path) -> dict[Any, Any]:
    """The mapping an experiment file holds, unchecked; a file that is missing, not UTF-8, not YAML or not a
    mapping is one line naming the file (and the line of a YAML error)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"experiment file {path} does not exist" if not path.exists()
                                else f"experiment file {path} is not a file")
    try:
        with open(path, encoding="utf-8") as f:
            spec = yaml.load(f, Loader=ExperimentLoader)
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not a UTF-8 text file ({exc.reason} at byte {exc.start})") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: {_yaml_error(exc)}") from None
    if not isinstance(spec, Mapping):
        raise ValueError(f"{path}: an experiment file must be a YAML mapping of {list(TOP_KEYS)}, got {spec!r}")
    return dict(spec)


def read_experiment(path: str | Path, **overrides: Any) -> ExperimentSpec:
    """The experiment in the file `path`, checked, with `overrides` (those not None) in place of its keys."""
    spec = {**read_experiment_file(path), **{k: v for k, v in overrides.items() if v is not None}}
    return experiment_spec(spec, source=str(path))


def load_experiment(path: str | Path, **overrides: Any) -> dict[str, Any]:
    """Read `path` and return keyword arguments for `nasplat.run`; a mistake names the key and what is allowed."""
    return read_experiment(path, **overrides).to_dict()


def experiment_kwargs(spec: Mapping[str, Any], *, source: str = "experiment") -> dict[str, Any]:
    """Validate an experiment mapping and translate it into `nasplat.run` keyword arguments."""
    return experiment_spec(spec, source=source).to_dict()


def experiment_spec(spec: Mapping[str, Any], *, source: str = "experiment") -> ExperimentSpec:
    """An experiment mapping (as in YAML) checked into an `ExperimentSpec`; each mistake is one line that starts
    with `source` and names the key, the value received and what is allowed."""
    try:
        return _translate(spec, source).check()
    except ValueError as exc:
        message = str(exc)
        raise ValueError(message if message.startswith(source) else f"{source}: {message}") from None


def _translate(spec: Mapping[str, Any], source: str) -> ExperimentSpec:
    """The YAML layout (sections `budget` and `resources`, a controller's options beside its name) checked and
    flattened into a spec; plain values are left to `ExperimentSpec.check`."""
    if "pipeline" in spec:
        raise ValueError(f"{source}: a pipeline file (it has `pipeline:`): run it with `nasplat run`, or "
                         "nasplat.experiment.pipeline.run_pipeline in Python")
    _check_keys(spec, TOP_KEYS, source)
    missing = [k for k in REQUIRED if k not in spec]
    if missing:
        raise ValueError(f"{source}: missing required keys {missing}; an experiment needs {list(REQUIRED)}")
    trainer = spec["trainer"]
    if not (isinstance(trainer, str) and trainer):
        raise ValueError(f"`trainer` must be a dotted path 'package.module:attribute', got trainer={trainer!r}")
    _check_space(spec["space"])
    controller = spec["controller"]
    if isinstance(controller, str):
        controller = {"name": controller}
    if not isinstance(controller, Mapping) or "name" not in controller:
        raise ValueError(f"{source}: 'controller' must be a name or a mapping with 'name' and options, "
                         f"got {controller!r}")
    check_choice("controller", controller["name"], sorted(CONTROLLERS))
    budget = spec["budget"]
    _check_keys(budget, BUDGET_KEYS, f"{source}: budget")
    resources = spec.get("resources") or {}
    _check_keys(resources, RESOURCE_KEYS, f"{source}: resources")
    executor = check_choice("executor", spec.get("executor", DEFAULT_EXECUTOR), list(EXECUTORS))
    ray_options = {k: resources[k] for k in RAY_ONLY if k in resources}
    if executor != "ray" and ray_options:
        default = "" if "executor" in spec else " (the default: add `executor: ray`)"
        raise ValueError(f"{source}: resources {sorted(ray_options)} need executor 'ray', "
                         f"got executor={executor!r}{default}")
    mode = spec.get("mode", "max")
    if isinstance(mode, str):
        check_choice("mode", mode, EXPERIMENT_MODES)
    if spec.get("scheduler") is not None:
        with _section("scheduler"):
            check_scheduler(spec["scheduler"])
    return ExperimentSpec(
        trainer=spec["trainer"], space=spec["space"], metric=spec["metric"], mode=mode,
        constraints=spec.get("constraints"),
        controller=controller["name"], controller_options={k: v for k, v in controller.items() if k != "name"},
        executor=executor, concurrency=resources.get("concurrency", 1 if executor != "ray" else None),
        max_trials=budget.get("max_trials"), time_budget_s=budget.get("time_budget_s"),
        step_timeout_s=budget.get("step_timeout_s"),
        max_steps=budget.get("max_steps", 1), seed=spec.get("seed", 0), max_failures=spec.get("max_failures", 0),
        max_failed_trials=spec.get("max_failed_trials", 10), checkpoint=spec.get("checkpoint"),
        name=spec.get("name"), storage=spec.get("storage"),
        executor_options=ray_options if executor == "ray" else {},
        callbacks=spec.get("callbacks") or [],  # names or mappings: built by `build`, the spec stays plain data
        scheduler=spec.get("scheduler"),  # a name, or a mapping of a name and options
        warm_start=spec.get("warm_start"))


def _check_space(space: Any) -> None:
    """A space in YAML: a dotted path, a mapping of constants and sub-spaces, or a list of those merged in order."""
    parts = space if isinstance(space, list) and space else [space]
    for part in parts:
        if not (isinstance(part, str) and part) and not isinstance(part, Mapping):
            raise ValueError(f"`space` must be a dotted path 'package.module:attribute', a mapping, or a list of "
                             f"those (merged in order), got space={space!r}")


@contextmanager
def _section(key: str) -> Iterator[None]:
    """Name the section `key` in front of a mistake found inside it (`scheduler: ...`), as for `budget:`."""
    try:
        yield
    except ValueError as exc:
        raise ValueError(f"{key}: {exc}") from None


def _check_keys(section: Any, allowed: tuple[str, ...], where: str) -> None:
    if not isinstance(section, Mapping):
        raise ValueError(f"{where} must be a mapping with keys from {list(allowed)}, got {section!r}")
    unknown = [k for k in section if k not in allowed]
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; allowed: {list(allowed)}")


def _yaml_error(exc: yaml.YAMLError) -> str:
    """A YAML parse error on one line: where (line and column, 1-based) and what."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    what = " ".join(str(part) for part in (getattr(exc, "context", None), getattr(exc, "problem", None)) if part)
    return f"invalid YAML at {where}{what or ' '.join(str(exc).split())}"
