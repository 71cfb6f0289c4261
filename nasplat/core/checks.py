"""Checks of user-given values, one place for all: each error names the key, the value received and what is allowed.

Numbers are numbers: `bool` is never accepted as an integer or a real (`max_trials: true` is a mistake), and a
numeric string such as `"10"` is refused rather than converted, with a hint (experiment files read `1e3` as a
number, YAML 1.2's way: see `nasplat.experiment.file`). numpy's integers and floats are numbers.

`is_int` and `is_real` answer whether a value is a number (for filters); `check_int`, `check_real`, `check_bool`
and `check_choice` raise a `ValueError` of the form "`name` must be <what is allowed>, got name=<value>".
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, NoReturn, overload

EXPERIMENT_MODES = ("max", "min")


def is_int(value: Any) -> bool:
    """Whether `value` is an integer (a Python or numpy one); a bool is not."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value: Any, *, finite: bool = False) -> bool:
    """Whether `value` is a real number (int, float, numpy's); a bool is not. With `finite`, also finite."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    return not finite or _finite(value)


def _finite(value: numbers.Real) -> bool:
    """Whether a real number is finite (an integer always is, however large)."""
    return isinstance(value, numbers.Integral) or math.isfinite(value)


def received(name: str, value: Any) -> str:
    """`got name=value`, with a hint when the value is a bool or a string that reads as a number."""
    text = f"got {name}={value!r}"
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return text
        text += " (a string: write numbers without quotes)"
    elif isinstance(value, bool):
        text += " (a bool is not a number here)"
    return text


def _as_float(value: Any) -> float | None:
    """`value` as a float if it is a real number a float can hold, else None."""
    if not is_real(value):
        return None
    try:
        return float(value)
    except OverflowError:  # an integer beyond the range of floats
        return None


def _bounds(minimum: float | None, maximum: float | None, strict: bool, strict_maximum: bool,
            show: Callable[[float], str]) -> str:
    """` >= 1`, ` < 0.5` or ` in (0, 1]`: the allowed range as the message says it; empty without bounds."""
    if minimum is not None and maximum is not None:
        return f" in {'(' if strict else '['}{show(minimum)}, {show(maximum)}{')' if strict_maximum else ']'}"
    if minimum is not None:
        return f" {'>' if strict else '>='} {show(minimum)}"
    if maximum is not None:
        return f" {'<' if strict_maximum else '<='} {show(maximum)}"
    return ""


def _refuse(name: str, value: Any, allowed: str, *, note: str, optional: bool, where: str) -> NoReturn:
    """Raise the one form of message: "[where ]`name` must be <allowed>[ (note)][ (or None)], got name=<value>"."""
    place = f"{where} " if where else ""
    extra = f" ({note})" if note else ""
    none = " (or None)" if optional else ""
    raise ValueError(f"{place}`{name}` must be {allowed}{extra}{none}, {received(name, value)}")


@overload
def check_int(name: str, value: Any, *, minimum: int | None = ..., maximum: int | None = ...,
              optional: Literal[False] = ..., note: str = ..., where: str = ...) -> int: ...
@overload
def check_int(name: str, value: Any, *, minimum: int | None = ..., maximum: int | None = ...,
              optional: bool, note: str = ..., where: str = ...) -> int | None: ...
def check_int(name: str, value: Any, *, minimum: int | None = None, maximum: int | None = None,
              optional: bool = False, note: str = "", where: str = "") -> int | None:
    """`value` as an int: an integer (not a bool) in [`minimum`, `maximum`] (either bound may be None); None passes
    only if `optional`. `note` explains the value in the message, `where` names its section (`checkpoint`)."""
    if value is None and optional:
        return None
    if not is_int(value) or (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        _refuse(name, value, "an integer" + _bounds(minimum, maximum, False, False, str), note=note,
                optional=optional, where=where)
    return int(value)


@overload
def check_real(name: str, value: Any, *, minimum: float | None = ..., maximum: float | None = ...,
               strict: bool = ..., strict_maximum: bool = ..., finite: bool = ..., optional: Literal[False] = ...,
               note: str = ..., where: str = ...) -> float: ...
@overload
def check_real(name: str, value: Any, *, minimum: float | None = ..., maximum: float | None = ...,
               strict: bool = ..., strict_maximum: bool = ..., finite: bool = ..., optional: bool,
               note: str = ..., where: str = ...) -> float | None: ...
def check_real(name: str, value: Any, *, minimum: float | None = None, maximum: float | None = None,
               strict: bool = False, strict_maximum: bool = False, finite: bool = True, optional: bool = False,
               note: str = "", where: str = "") -> float | None:
    """`value` as a float: a real number (not a bool, never NaN; finite unless `finite=False`) >= `minimum`
    (> with `strict`) and <= `maximum` (< with `strict_maximum`); None passes only if `optional`."""
    if value is None and optional:
        return None
    number = _as_float(value)
    bad = number is None or math.isnan(number) or (finite and not math.isfinite(number))
    if number is not None and not bad and minimum is not None:
        bad = number <= minimum if strict else number < minimum
    if number is not None and not bad and maximum is not None:
        bad = number >= maximum if strict_maximum else number > maximum
    if bad:
        kind = "a finite number" if finite else "a number"
        _refuse(name, value, kind + _bounds(minimum, maximum, strict, strict_maximum, lambda x: f"{x:g}"),
                note=note, optional=optional, where=where)
    return number


def check_bool(name: str, value: Any, *, where: str = "") -> bool:
    """`value`, which must be True or False (not 0, 1 or a string)."""
    if not isinstance(value, bool):
        place = f"{where} " if where else ""
        raise ValueError(f"{place}`{name}` must be true or false, got {name}={value!r}")
    return value


def check_choice(name: str, value: Any, allowed: tuple[str, ...] | list[str]) -> str:
    """`value`, which must be one of the strings `allowed`."""
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"`{name}` must be one of {list(allowed)}, got {name}={value!r}")
    return value


def parse_objectives(metric: str | Sequence[str], mode: str | Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """`(metrics, modes)` as tuples of equal length; one `mode` string applies to every metric."""
    metrics = (metric,) if isinstance(metric, str) else tuple(metric) if isinstance(metric, Sequence) else None
    if not metrics or not all(isinstance(m, str) and m for m in metrics):
        raise ValueError(f"`metric` must be a non-empty string naming a reported metric, or a non-empty list of "
                         f"them, got {metric=!r}")
    if len(set(metrics)) != len(metrics):
        raise ValueError(f"metric names must be distinct, got {metric=!r}")
    modes = (mode,) * len(metrics) if isinstance(mode, str) else tuple(mode) if isinstance(mode, Sequence) else ()
    if len(modes) != len(metrics) or not all(m in EXPERIMENT_MODES for m in modes):
        raise ValueError(f"`mode` must be 'max' or 'min', or a list of them, one per metric; got {mode=!r} for "
                         f"{len(metrics)} metric(s) {list(metrics)}")
    return metrics, modes


def check_name(value: Any) -> str:
    """An experiment name: a non-empty string usable as one folder name inside `storage` (no path separator,
    no `..`, no NUL, no surrounding spaces)."""
    if not isinstance(value, str) or not value or value != value.strip() or any(c in value for c in "/\\\0") \
            or ".." in value or value == ".":
        raise ValueError(f"`name` must be a non-empty folder name without '/', '\\', '..' or surrounding spaces "
                         f"(the experiment's folder is <storage>/<name>), got name={value!r}")
    return value


def check_run_options(*, metric: Any = None, mode: Any = "max", max_trials: Any = None, time_budget_s: Any = None,
                      max_steps: Any = 1, concurrency: Any = None, max_failures: Any = 0,
                      max_failed_trials: Any = 10, seed: Any = 0, name: Any = None,
                      executor_options: Mapping[str, Any] | None = None) -> None:
    """Check the plain-value arguments of `nasplat.run` (and of an experiment file) before anything is built."""
    if metric is not None:  # one metric and mode, or a list of each (several objectives)
        parse_objectives(metric, mode)
    check_int("max_trials", max_trials, minimum=1, optional=True)
    check_real("time_budget_s", time_budget_s, minimum=0, strict=True, optional=True)
    check_int("max_steps", max_steps, minimum=1)
    check_int("concurrency", concurrency, minimum=1, optional=True)
    check_int("max_failures", max_failures, minimum=0)
    check_int("max_failed_trials", max_failed_trials, minimum=0, optional=True)
    check_int("seed", seed, minimum=0)
    if name is not None:
        check_name(name)
    if max_trials is None and time_budget_s is None:
        raise ValueError("a budget needs `max_trials` and/or `time_budget_s`; got neither")
    options = executor_options or {}
    if not isinstance(options, Mapping):
        raise ValueError(f"`executor_options` must be a mapping, got executor_options={options!r}")
    if "workers" in options:
        check_int("workers", options["workers"], minimum=1)
    if "cpus_per_trial" in options:
        check_real("cpus_per_trial", options["cpus_per_trial"], minimum=0, strict=True)
    if "gpus_per_trial" in options:
        check_real("gpus_per_trial", options["gpus_per_trial"], minimum=0)
    for key in ("backend", "strategy", "address"):
        if key in options and options[key] is not None and not isinstance(options[key], str):
            raise ValueError(f"`{key}` must be a string, got {key}={options[key]!r}")
    if options.get("backend_options") is not None and not isinstance(options["backend_options"], Mapping):
        raise ValueError(f"`backend_options` must be a mapping, got backend_options={options['backend_options']!r}")
