"""Experiment files: YAML with the space, trainer, controller, budget, resources and storage of a search."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from nasplat.pareto import parse_constraints, parse_objectives

TOP_KEYS = ("name", "trainer", "space", "metric", "mode", "constraints", "controller", "budget", "resources",
            "executor", "storage", "seed", "max_failures", "max_failed_trials", "checkpoint", "callbacks")
REQUIRED = ("trainer", "space", "metric", "controller", "budget")
BUDGET_KEYS = ("max_trials", "time_budget_s", "max_steps")
RESOURCE_KEYS = ("concurrency", "cpus_per_trial", "gpus_per_trial", "workers", "backend", "strategy", "backend_options")
RAY_ONLY = ("cpus_per_trial", "gpus_per_trial", "workers", "backend", "strategy", "backend_options")


def load_experiment(path: str | Path, **overrides: Any) -> dict[str, Any]:
    """Read `path` and return keyword arguments for `nasplat.run`; a mistake names the key and what is allowed."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"experiment file {path} does not exist")
    with open(path, encoding="utf-8") as f:
        spec = yaml.safe_load(f)
    if not isinstance(spec, Mapping):
        raise ValueError(f"{path}: an experiment file must be a YAML mapping of {list(TOP_KEYS)}, got {spec!r}")
    spec = {**spec, **{k: v for k, v in overrides.items() if v is not None}}
    return experiment_kwargs(spec, source=str(path))


def experiment_kwargs(spec: Mapping[str, Any], *, source: str = "experiment") -> dict[str, Any]:
    """Validate an experiment mapping and translate it into `nasplat.run` keyword arguments."""
    _check_keys(spec, TOP_KEYS, source)
    missing = [k for k in REQUIRED if k not in spec]
    if missing:
        raise ValueError(f"{source}: missing required keys {missing}; an experiment needs {list(REQUIRED)}")
    controller = spec["controller"]
    if isinstance(controller, str):
        controller = {"name": controller}
    if not isinstance(controller, Mapping) or "name" not in controller:
        raise ValueError(f"{source}: 'controller' must be a name or a mapping with 'name' and options, "
                         f"got {controller!r}")
    budget = spec["budget"]
    _check_keys(budget, BUDGET_KEYS, f"{source}: budget")
    resources = spec.get("resources") or {}
    _check_keys(resources, RESOURCE_KEYS, f"{source}: resources")
    executor = spec.get("executor", "ray")
    ray_options = {k: resources[k] for k in RAY_ONLY if k in resources}
    if executor != "ray" and ray_options:
        raise ValueError(f"{source}: resources {sorted(ray_options)} need executor 'ray', got executor={executor!r}")
    mode = spec.get("mode", "max")
    if isinstance(mode, str) and mode not in ("max", "min"):
        raise ValueError(f"{source}: 'mode' must be 'max' or 'min', got {mode!r}")
    try:  # one metric and mode, or lists of them (several objectives), and metric thresholds
        parse_objectives(spec["metric"], mode)
        parse_constraints(spec.get("constraints"))
    except ValueError as error:
        raise ValueError(f"{source}: {error}") from None
    options = {k: v for k, v in controller.items() if k != "name"}
    kwargs: dict[str, Any] = dict(
        trainer=spec["trainer"], space=spec["space"], metric=spec["metric"], mode=mode,
        constraints=spec.get("constraints"),
        controller=controller["name"], controller_options=options, executor=executor,
        max_trials=budget.get("max_trials"), time_budget_s=budget.get("time_budget_s"),
        max_steps=budget.get("max_steps", 1), seed=spec.get("seed", 0), max_failures=spec.get("max_failures", 0),
        max_failed_trials=spec.get("max_failed_trials", 10), checkpoint=spec.get("checkpoint"),
        name=spec.get("name"), storage=spec.get("storage"),
        concurrency=resources.get("concurrency", 1 if executor != "ray" else None),
    )
    if executor == "ray":
        kwargs["executor_options"] = ray_options
    if spec.get("callbacks"):  # names or mappings, built (and checked) by `nasplat.run`: the spec stays plain data
        kwargs["callbacks"] = spec["callbacks"]
    return kwargs


def _check_keys(section: Any, allowed: tuple[str, ...], where: str) -> None:
    if not isinstance(section, Mapping):
        raise ValueError(f"{where} must be a mapping with keys from {list(allowed)}, got {section!r}")
    unknown = [k for k in section if k not in allowed]
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; allowed: {list(allowed)}")
