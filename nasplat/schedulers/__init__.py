"""Schedulers: ASHA, Hyperband and the median stopping rule, each wrapping any search controller."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nasplat.controllers.base import Controller
from nasplat.schedulers.asha import ASHA
from nasplat.schedulers.base import Scheduler
from nasplat.schedulers.hyperband import Hyperband
from nasplat.schedulers.median import MedianStopping

SCHEDULERS: dict[str, type[Scheduler]] = {"asha": ASHA, "hyperband": Hyperband, "median": MedianStopping}
NEEDS_MAX_STEPS = (ASHA,)  # these take `max_steps` (default: the run's)


def make_scheduler(scheduler: str | Mapping[str, Any] | Scheduler, controller: Controller, *,
                   max_steps: int) -> Scheduler:
    """A scheduler around `controller`: a name of `SCHEDULERS`, a mapping `{"name": ..., **options}`, or a ready
    `Scheduler` (which wraps `controller` already). `max_steps` (the run's) is the default of ASHA's and Hyperband's
    and their upper bound."""
    if isinstance(scheduler, Scheduler):
        if scheduler.controller is not controller:
            raise ValueError("a ready scheduler wraps its own controller: pass that controller as `controller` (or "
                             f"the scheduler by name); got controller {type(controller).__name__} and a scheduler "
                             f"around {type(scheduler.controller).__name__}")
        built = scheduler
    else:
        options = {"name": scheduler} if isinstance(scheduler, str) else scheduler
        if not isinstance(options, Mapping) or options.get("name") not in SCHEDULERS:
            raise ValueError(f"`scheduler` must be one of {sorted(SCHEDULERS)}, a mapping with 'name' (one of them) "
                             f"and options, or a Scheduler; got {scheduler!r}")
        cls = SCHEDULERS[options["name"]]
        kwargs = {k: v for k, v in options.items() if k != "name"}
        if issubclass(cls, NEEDS_MAX_STEPS):
            kwargs.setdefault("max_steps", max_steps)
        try:
            built = cls(controller, **kwargs)
        except TypeError as exc:
            raise ValueError(f"scheduler {options['name']!r}: {exc}") from None
    if isinstance(built, NEEDS_MAX_STEPS) and built.max_steps > max_steps:
        raise ValueError(f"the scheduler's max_steps must be <= the run's, got scheduler max_steps={built.max_steps}, "
                         f"run max_steps={max_steps}")
    return built


__all__ = ["ASHA", "SCHEDULERS", "Hyperband", "MedianStopping", "Scheduler", "make_scheduler"]
