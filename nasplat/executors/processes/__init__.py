"""The `processes` executor (`executor: processes`): trials in worker processes forked from the driver.

- `executor`: `ProcessExecutor`, the driver's side: the engine's calls as requests, the waits, step timeouts;
- `pool`: `WorkerPool`, the workers (forked, replaced, buried, closed), their queued requests and pending replies;
- `intake`: `Intake`, what each message and each death means: events for `wait`, saves owed, charges, relaunches;
- `trials`: one record per hosted trial (`HostedTrial`), where each lives (`HostedTrials`), final states awaited;
- `pipes`: the driver's I/O with one worker (its pipe and its shared-memory `ActivitySlot`), returning what it read;
- `messages`: what goes through the pipes;
- `worker`: the loop each worker runs around a `LocalExecutor`;
- `child`: what a forked worker cuts loose first, and its `ActivitySlot`.
"""

from nasplat.executors.processes.executor import ProcessExecutor

__all__ = ["ProcessExecutor"]
