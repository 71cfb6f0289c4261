"""Schedulers: ASHA, Hyperband and the median stopping rule, each wrapping any search controller. `SCHEDULERS`
names them for YAML (`scheduler:`), `nasplat.run(scheduler=...)` and the command line's help."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nasplat.controllers.base import Searcher
from nasplat.core.registry import Registry, constructor_options
from nasplat.schedulers.asha import ASHA
from nasplat.schedulers.base import Scheduler
from nasplat.schedulers.hyperband import Hyperband
from nasplat.schedulers.median import MedianStopping

SCHEDULERS: Registry[type[Scheduler]] = Registry("scheduler", {
    "asha": ASHA, "hyperband": Hyperband, "median": MedianStopping,
})
NEEDS_MAX_STEPS = (ASHA,)  # these take `max_steps` (default: the run's)


def check_scheduler(scheduler: Any) -> tuple[str, dict[str, Any]] | None:
    """`scheduler` as (name, options), or None for a ready `Scheduler`; anything but a name of `SCHEDULERS`, a
    mapping with such a `name`, or a `Scheduler` is one line naming what is allowed. The options' values are
    checked by the scheduler's constructor."""
    return None if isinstance(scheduler, Scheduler) else _named(scheduler)


def _named(scheduler: Any) -> tuple[str, dict[str, Any]]:
    options = {"name": scheduler} if isinstance(scheduler, str) else scheduler
    if not isinstance(options, Mapping) or options.get("name") not in SCHEDULERS:
        raise ValueError(f"`scheduler` must be one of {sorted(SCHEDULERS)}, a mapping with 'name' (one of them) "
                         f"and options, or a Scheduler; got {scheduler!r}")
    return options["name"], {k: v for k, v in options.items() if k != "name"}


def make_scheduler(scheduler: str | Mapping[str, Any] | Scheduler, controller: Searcher, *,
                   max_steps: int) -> Scheduler:
    """A scheduler around `controller`: a name of `SCHEDULERS`, a mapping `{"name": ..., **options}`, or a ready
    `Scheduler` (which wraps `controller` already). `max_steps` (the run's) is the default of ASHA's and Hyperband's
    and their upper bound; a scheduler whose first rung is not below it is refused (it would stop or pause none)."""
    if isinstance(scheduler, Scheduler):
        if scheduler.controller is not controller:
            raise ValueError("a ready scheduler wraps its own controller: pass that controller as `controller` (or "
                             f"the scheduler by name); got controller {type(controller).__name__} and a scheduler "
                             f"around {type(scheduler.controller).__name__}")
        built = scheduler
    else:
        name, kwargs = _named(scheduler)
        cls = SCHEDULERS[name]
        allowed = constructor_options(cls, base=Scheduler, skip=("controller",))
        unknown = [k for k in kwargs if allowed is not None and k not in allowed]
        if unknown:
            raise ValueError(f"unknown option(s) {unknown} for scheduler {name!r}; allowed: {allowed}")
        if issubclass(cls, NEEDS_MAX_STEPS):
            kwargs.setdefault("max_steps", max_steps)
        try:
            built = cls(controller, **kwargs)
        except TypeError as exc:
            raise ValueError(f"scheduler {name!r}: {exc}") from None
    if isinstance(built, NEEDS_MAX_STEPS) and built.max_steps > max_steps:
        raise ValueError(f"the scheduler's max_steps must be <= the run's, got scheduler max_steps={built.max_steps}, "
                         f"run max_steps={max_steps}")
    built.check_max_steps(max_steps)
    return built


__all__ = ["ASHA", "SCHEDULERS", "Hyperband", "MedianStopping", "Scheduler", "check_scheduler", "make_scheduler"]
