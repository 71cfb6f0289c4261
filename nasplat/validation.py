"""Checks of user-given values, one place for all: each error names the key, the value received and what is allowed.

Numbers are numbers: `bool` is never accepted as an integer or a real (`max_trials: true` is a mistake), and a
numeric string such as `"10"` is refused rather than converted, with a hint, since PyYAML reads `1e3` (no dot, no
exponent sign) as the string `'1e3'`: write `1000` or `1.0e+3`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

from nasplat.pareto import parse_objectives

EXPERIMENT_MODES = ("max", "min")


def _received(name: str, value: Any) -> str:
    """`got name=value`, with a hint when the value is a string that reads as a number."""
    text = f"got {name}={value!r}"
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return text
        text += (" (a string: write numbers without quotes; YAML reads 1e3 as a string, write 1000 or 1.0e+3)")
    elif isinstance(value, bool):
        text += " (a bool is not a number here)"
    return text


def check_int(name: str, value: Any, *, minimum: int | None = None, optional: bool = False) -> int | None:
    """`value` as an int: an integer (not a bool) >= `minimum`; None passes only if `optional`."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or (minimum is not None and value < minimum):
        bound = f" >= {minimum}" if minimum is not None else ""
        none = " (or None)" if optional else ""
        raise ValueError(f"`{name}` must be an integer{bound}{none}, {_received(name, value)}")
    return int(value)


def check_real(name: str, value: Any, *, minimum: float | None = None, strict: bool = False,
               optional: bool = False) -> float | None:
    """`value` as a float: a finite real number (not a bool) >= `minimum` (> with `strict`); None if `optional`."""
    if value is None and optional:
        return None
    bad = isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value)
    if not bad and minimum is not None:
        bad = value <= minimum if strict else value < minimum
    if bad:
        bound = "" if minimum is None else f" {'>' if strict else '>='} {minimum:g}"
        none = " (or None)" if optional else ""
        raise ValueError(f"`{name}` must be a finite number{bound}{none}, {_received(name, value)}")
    return float(value)


def check_choice(name: str, value: Any, allowed: tuple[str, ...] | list[str]) -> str:
    """`value`, which must be one of the strings `allowed`."""
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"`{name}` must be one of {list(allowed)}, got {name}={value!r}")
    return value


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
