"""Executors: where trials run. `EXECUTORS` names them for YAML (`executor:`), `nasplat.run(executor=...)` and the
command line; each is imported when first used, so that naming `local` never imports Ray.

- `local`: in this process, one trial step at a time;
- `processes`: worker processes forked from this one (one per core by default);
- `simulated`: in this process on a simulated clock driven by each step's reported `time_cost`;
- `ray`: gangs of Ray actors in placement groups, on this machine or a cluster.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nasplat.core.registry import Registry

if TYPE_CHECKING:
    from nasplat.executors.base import Executor

# name -> executor class, in the order the help and the error messages list them
EXECUTORS: Registry[type[Executor]] = Registry("executor", {
    "ray": "nasplat.executors.ray.executor:RayExecutor",
    "local": "nasplat.executors.local:LocalExecutor",
    "processes": "nasplat.executors.processes:ProcessExecutor",
    "simulated": "nasplat.executors.simulated:SimulatedExecutor",
})
# The executor of an experiment that names none, from YAML and from Python alike.
DEFAULT_EXECUTOR = "local"


def check_step_timeout(executor: Executor | type[Executor], step_timeout_s: float | None) -> None:
    """Refuse `step_timeout_s` on an executor (or executor class) that cannot enforce it, in one line naming it and
    those that can."""
    if step_timeout_s is None or executor.supports_step_timeout:
        return
    name = EXECUTORS.name_of(executor) or (executor if isinstance(executor, type) else type(executor)).__name__
    able = []
    for other in EXECUTORS:
        try:
            if EXECUTORS[other].supports_step_timeout:
                able.append(other)
        except ImportError:  # an executor whose package is missing (Ray) is left out
            continue
    raise ValueError(f"`step_timeout_s` needs an executor that can stop a running step, one of {able}; executor "
                     f"{name!r} cannot, got step_timeout_s={step_timeout_s!r} (drop it, or change the executor)")


def step_timeout_in_force(executor: Executor, step_timeout_s: float | None) -> float | None:
    """The step timeout a run has on `executor`: the executor's own (`Executor.step_timeout_s`, given to its
    constructor), the one value the engine reads. A run's `step_timeout_s` (None: the executor's) must be that value:
    refused in one line otherwise, as on an executor that cannot enforce one."""
    check_step_timeout(executor, step_timeout_s)
    if step_timeout_s is not None and step_timeout_s != executor.step_timeout_s:
        cls = type(executor).__name__
        raise ValueError(f"`step_timeout_s` of the run differs from the ready executor's own: got step_timeout_s="
                         f"{step_timeout_s!r} for a {cls} built with step_timeout_s={executor.step_timeout_s!r}; pass "
                         f"it to the executor's constructor, e.g. {cls}(step_timeout_s={step_timeout_s!r})")
    return executor.step_timeout_s


def reserve_members(executor: Executor, members: int, search: str) -> None:
    """Start the slots of the `members` trials the search `search` trains side by side (`Executor.reserve`, where
    there are several); refuse, in one line, an executor with fewer slots (`concurrency`)."""
    if executor.concurrency < members:
        raise ValueError(f"{search} needs its {members} members training side by side, "
                         f"got concurrency={executor.concurrency}; raise concurrency to >= {members}")
    if members > 1:
        executor.reserve(members)


__all__ = ["DEFAULT_EXECUTOR", "EXECUTORS", "check_step_timeout", "reserve_members", "step_timeout_in_force"]
