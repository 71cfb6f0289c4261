"""The `processes` executor (`executor: processes`): trials in worker processes forked from the driver.

- `executor`: `ProcessExecutor`, the driver's side: one record per hosted trial (`trials.HostedTrial`), step
  timeouts, deaths and relaunches;
- `pipes`: the driver's I/O with one worker (its pipe and its shared-memory `ActivitySlot`), returning what it read;
- `messages`: what goes through the pipes;
- `worker`: the loop each worker runs around a `LocalExecutor`;
- `child`: what a forked worker cuts loose first, and its `ActivitySlot`.
"""

from nasplat.executors.processes.executor import ProcessExecutor

__all__ = ["ProcessExecutor"]
