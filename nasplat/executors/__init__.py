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

__all__ = ["DEFAULT_EXECUTOR", "EXECUTORS"]
