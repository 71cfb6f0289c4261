"""The tools people already watch: TensorBoard, MLflow, Optuna's dashboard and importance.

Each integration is an engine listener (`on_start(engine)`, `on_row(engine, row)`, `on_end(engine)`) or a
function over an `ExperimentResult`. Their packages are optional extras (`pip install nasplat[mlflow]`, ...),
imported only when an integration is used; a missing one raises a one-line `ImportError` naming the extra.
`CALLBACKS` maps the names an experiment file may list under `callbacks:` to their listener classes.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from nasplat.core.registry import Registry
from nasplat.integrations.extras import MissingExtra, installed, require

# name in `callbacks:` -> the listener class (imported when first used)
CALLBACKS: Registry[type] = Registry("callback", {
    "mlflow": "nasplat.integrations.mlflow:MLflowLogger",
    "tensorboard": "nasplat.integrations.tensorboard:TensorBoardLogger",
})

_LAZY = {"MLflowLogger": "nasplat.integrations.mlflow", "TensorBoardLogger": "nasplat.integrations.tensorboard",
         "to_optuna": "nasplat.integrations.optuna", "param_importances": "nasplat.integrations.optuna"}

__all__ = ["CALLBACKS", "MLflowLogger", "MissingExtra", "TensorBoardLogger", "default_listeners", "make_callbacks",
           "param_importances", "require", "to_optuna"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def make_callbacks(specs: Sequence[str | Mapping[str, Any]], *, source: str = "experiment") -> list[Any]:
    """Listeners from `callbacks:` entries: a name in `CALLBACKS`, or a mapping with `name` and its options."""
    if isinstance(specs, (str, Mapping)) or not isinstance(specs, Sequence):
        raise ValueError(f"{source}: 'callbacks' must be a list of names or mappings, got {specs!r}")
    listeners = []
    for spec in specs:
        try:
            name, options = CALLBACKS.split(spec)
        except ValueError as exc:
            raise ValueError(f"{source}: {exc}") from None
        try:
            listeners.append(CALLBACKS[name](**options))
        except TypeError as exc:
            raise ValueError(f"{source}: callback {name!r} got options {options!r}: {exc}") from exc
    return listeners


def default_listeners(folder: Path | None, callbacks: Sequence[Any], *, ray_dashboard: bool = False,
                      name: str = "experiment") -> list[Any]:
    """The listeners every run gets unasked: TensorBoard event files in the experiment folder (when the writer's
    package `tensorboard` is installed, no TensorBoard listener was given explicitly and `$NASPLAT_TENSORBOARD` is
    not `0`), and with `ray_dashboard` (the executor runs on Ray: `Executor.ray_dashboard`) the Ray dashboard's
    gauges of experiment `name`."""
    listeners: list[Any] = []
    if ray_dashboard:
        from nasplat.integrations.ray_dashboard import RayMetrics
        listeners.append(RayMetrics(name))
    if folder is None or not installed("tensorboard") or os.environ.get("NASPLAT_TENSORBOARD") == "0":
        return listeners
    from nasplat.integrations.tensorboard import TensorBoardLogger

    if not any(isinstance(c, TensorBoardLogger) for c in callbacks):
        listeners.append(TensorBoardLogger())
    return listeners
