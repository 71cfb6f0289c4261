"""The engine: the one loop every executor shares, and the invariant that makes a killed run resumable.

`loop.Engine` asks the controller, dispatches to the executor, checks each step's metrics (`step_metrics`) and
applies the controller's decision; `state.EngineState` is the part that needs no executor (the trials' `records`,
`advance`, `end`), which `replay` drives to rebuild an engine from the recorded rows and journal. `outbox`
records rows and journal entries in the order the controller saw them, each row after its checkpoint, so what is
on disk is a prefix of what happened; `checkpoints` keeps and deletes checkpoints by that record, `console`
prints the progress line, `listener` declares the hooks of whatever watches a run, and `result.ExperimentResult`
is the record read back.
"""

from nasplat.engine.loop import Engine
from nasplat.engine.records import Budget, ExperimentFailed, TrialRecord
from nasplat.engine.result import CheckpointLost, ExperimentResult

__all__ = ["Budget", "CheckpointLost", "Engine", "ExperimentFailed", "ExperimentResult", "TrialRecord"]
