"""What a trainer's `step()` may report, checked once per step: a bad report fails that trial, never the experiment."""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

from nasplat.core.checks import is_real
from nasplat.core.rows import RESERVED

MAX_INT = 2 ** 53  # integers beyond this lose precision as floats, and JSON readers read them as floats


class MetricError(ValueError):
    """A step's report that cannot be recorded (the trial fails with this message)."""


def clean_metrics(raw: Any, objectives: tuple[str, ...]) -> dict[str, Any]:
    """`raw` as plain JSON values: real numbers (Python, numpy, 0-d arrays and tensors) become int or float;
    strings, booleans and None stay; every name in `objectives` must be a finite real number that is not a bool.

    Raises `MetricError` naming the metric, the value and what is allowed."""
    if not isinstance(raw, Mapping):
        raise MetricError(f"step() must return a mapping of metric names to values, got {type(raw).__name__}: "
                          f"{_short(raw)}")
    metrics: dict[str, Any] = {}
    for key, value in raw.items():
        if not isinstance(key, str):
            raise MetricError(f"metric names must be strings, got {key!r} ({type(key).__name__})")
        if key in RESERVED:
            raise MetricError(f"metric name {key!r} is reserved for the row's own field; rename it "
                              f"(reserved: {list(RESERVED)})")
        metrics[key] = _plain(key, value)
    for name in objectives:
        value = metrics.get(name)
        if name not in metrics:
            raise MetricError(f"metric {name!r} is missing from the report (reported: {sorted(metrics)})")
        if not is_real(value, finite=True):
            raise MetricError(f"metric {name!r} must be a finite real number, got {_short(raw[name])} "
                              f"(reported: {sorted(metrics)})")
    return metrics


def _plain(key: str, value: Any) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if hasattr(value, "ndim") and hasattr(value, "item"):  # numpy scalars and arrays, torch tensors
        if value.ndim != 0 and getattr(value, "size", None) not in (1,) and _numel(value) != 1:
            raise MetricError(f"metric {key!r} must be a scalar, got an array of shape {tuple(value.shape)}")
        value = value.item()
        if isinstance(value, bool):
            return value
    if isinstance(value, numbers.Integral):
        value = int(value)
        if abs(value) <= MAX_INT:
            return value
        try:
            return float(value)
        except OverflowError:
            raise MetricError(f"metric {key!r} = {_short(value)} is too large for a float") from None
    if isinstance(value, numbers.Real):
        return float(value)
    raise MetricError(f"metric {key!r} must be a real number, a string, a boolean or None, got "
                      f"{type(value).__name__}: {_short(value)}")


def _numel(value: Any) -> int:
    numel = getattr(value, "numel", None)
    return int(numel()) if callable(numel) else int(getattr(value, "size", 0))


def _short(value: Any, limit: int = 80) -> str:
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 (a user object's repr may raise anything: its type's name stands in)
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[:limit - 3] + "..."
