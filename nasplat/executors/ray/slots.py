"""The `ray` executor's records: a gang's slot, a call in flight, and the trainer class shipped to the workers."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import ray
import ray.cloudpickle

from nasplat.executors.ray.gang import Gang


@dataclass
class Slot:
    """A gang and what the executor knows of it: where it runs, whether it is healthy and up, what it still writes."""

    gang: Gang
    info: ray.ObjectRef | None = None
    node: str = ""
    pid: int = 0
    healthy: bool = True
    snapshot: ray.ObjectRef | None = None  # the running trial's latest state snapshot
    finishing: int = 0  # calls in flight that report an ended trial's saves (an idle gang still busy writing)
    up: float | None = None  # when (executor clock) its actors were seen up: a step is timed from then on


@dataclass
class Call:
    """A call in flight on a gang: a step (launch, step, exploit) or, at a trial's end, its outstanding saves."""

    trial_id: int
    refs: list[ray.ObjectRef]
    start: float
    slot: Slot
    saves_only: bool = False
    deadline: float | None = None  # when its step times out (executor clock; counted once its gang is up and free)


def ship_by_value(trainer: type) -> None:
    """Send the trainer's module with the class when workers may not import it (scripts, sys.path hacks)."""
    module = sys.modules.get(trainer.__module__)
    path = getattr(module, "__file__", None) or ""
    if module is None or module.__name__ == "__main__" or "site-packages" in path:
        return
    if module.__name__.split(".")[0] in ("nasplat", "search_spaces", "trainers"):
        return
    ray.cloudpickle.register_pickle_by_value(module)
