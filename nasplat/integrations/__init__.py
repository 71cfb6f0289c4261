"""The tools people already watch: TensorBoard, MLflow, Optuna's dashboard and importance.

Each integration is an engine listener (`on_start(engine)`, `on_row(engine, row)`, `on_end(engine)`) or a
function over an `ExperimentResult`. Their packages are optional extras (`pip install nasplat[mlflow]`, ...),
imported only when an integration is used; a missing one raises a one-line `ImportError` naming the extra.
`CALLBACKS` maps the names an experiment file may list under `callbacks:` to their listener classes.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from nasplat.results import RESERVED

# name in `callbacks:` -> "module:class" of the listener (imported when first used)
CALLBACKS: dict[str, str] = {
    "mlflow": "nasplat.integrations.mlflow:MLflowLogger",
    "tensorboard": "nasplat.integrations.tensorboard:TensorBoardLogger",
}

_LAZY = {"MLflowLogger": "nasplat.integrations.mlflow", "TensorBoardLogger": "nasplat.integrations.tensorboard",
         "to_optuna": "nasplat.integrations.optuna_export", "param_importances": "nasplat.integrations.optuna_export"}

__all__ = ["CALLBACKS", "MLflowLogger", "MissingExtra", "TensorBoardLogger", "make_callbacks", "param_importances",
           "require", "to_optuna"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class MissingExtra(ImportError):
    """An integration's package is not installed; the message names the nasplat extra that installs it."""


def require(module: str, extra: str) -> Any:
    """Import `module`, or raise a one-line `MissingExtra` naming the nasplat extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtra(f"{module} is not installed (needed by nasplat's {extra} integration); "
                          f"install it with: pip install 'nasplat[{extra}]'") from exc


def installed(module: str) -> bool:
    """Whether `module` can be imported (without importing it)."""
    return importlib.util.find_spec(module) is not None


def make_callbacks(specs: Sequence[str | Mapping[str, Any]], *, source: str = "experiment") -> list[Any]:
    """Listeners from `callbacks:` entries: a name in `CALLBACKS`, or a mapping with `name` and its options."""
    if isinstance(specs, (str, Mapping)) or not isinstance(specs, Sequence):
        raise ValueError(f"{source}: 'callbacks' must be a list of names or mappings, got {specs!r}")
    listeners = []
    for spec in specs:
        options = dict(spec) if isinstance(spec, Mapping) else {"name": spec}
        name = options.pop("name", None)
        if name not in CALLBACKS:
            raise ValueError(f"{source}: unknown callback {name!r} in {spec!r}; allowed: {sorted(CALLBACKS)} "
                             "(as a name or as a mapping with 'name' and options)")
        module, cls = CALLBACKS[name].split(":")
        factory: Callable[..., Any] = getattr(importlib.import_module(module), cls)
        try:
            listeners.append(factory(**options))
        except TypeError as exc:
            raise ValueError(f"{source}: callback {name!r} got options {options!r}: {exc}") from exc
    return listeners


def default_listeners(folder: Path | None, callbacks: Sequence[Any]) -> list[Any]:
    """The listeners every run gets unasked: TensorBoard event files in the experiment folder, when the
    writer's package (`tensorboard`) is installed, no TensorBoard listener was given explicitly and
    `$NASPLAT_TENSORBOARD` is not `0`."""
    if folder is None or not installed("tensorboard") or os.environ.get("NASPLAT_TENSORBOARD") == "0":
        return []
    from nasplat.integrations.tensorboard import TensorBoardLogger

    if any(isinstance(c, TensorBoardLogger) for c in callbacks):
        return []
    return [TensorBoardLogger()]


def row_metrics(row: Mapping[str, Any]) -> dict[str, float]:
    """The finite numeric metrics of a recorded row (bookkeeping columns and booleans left out)."""
    return {k: float(v) for k, v in row.items() if k not in RESERVED and isinstance(v, (int, float))
            and not isinstance(v, bool) and math.isfinite(v)}
