"""Which of an experiment's checkpoints go, and when: the ones newer checkpoints replaced, once a synced row names
the successor (before, a resume would still need them), and those of ended trials outside the `keep_best` best."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nasplat.core.rows import Status
from nasplat.engine.records import TrialRecord
from nasplat.storage import Storage
from nasplat.storage.checkpoints import Checkpoint, CheckpointPolicy


class CheckpointBook:
    """The engine's checkpoint bookkeeping under `policy` (None: checkpoints are kept, only superseded ones go)."""

    def __init__(self, policy: CheckpointPolicy | None) -> None:
        self.policy = policy
        # checkpoints replaced by a newer one of the same trial: new uri -> old; old ones whose successor a
        # recorded row names may go once that row is synced
        self.superseded: dict[str, Checkpoint] = {}
        self.deletable: list[Checkpoint] = []

    def replaced(self, previous: Checkpoint | None, checkpoint: Checkpoint) -> None:
        """`checkpoint` is its trial's latest now, in place of `previous`: that goes once a synced row names
        `checkpoint`."""
        if previous is not None and checkpoint.uri is not None and previous.uri != checkpoint.uri:
            self.superseded[checkpoint.uri] = previous

    def recorded(self, row: Mapping[str, Any]) -> None:
        """A row went out: the checkpoint its own replaced may go once the row is synced."""
        if row.get("checkpoint") in self.superseded:
            self.deletable.append(self.superseded.pop(row["checkpoint"]))

    def delete_superseded(self) -> None:
        """Delete the checkpoints whose successors synced rows name."""
        for checkpoint in self.deletable:
            delete(checkpoint)
        self.deletable.clear()

    def prune(self, trials: Mapping[int, TrialRecord], metric: str, mode: str) -> None:
        """Keep the checkpoints of the `keep_best` best ended trials by `metric` (and of every running or paused
        one); delete the rest."""
        assert self.policy is not None
        scored = [(r.metrics[metric], r.trial_id) for r in trials.values()
                  if r.status in (Status.COMPLETED, Status.STOPPED) and r.checkpoint is not None
                  and isinstance(r.metrics.get(metric), (int, float))]
        scored.sort(reverse=mode == "max")
        for _, trial_id in scored[self.policy.keep_best:]:
            record = trials[trial_id]
            if record.checkpoint is not None:
                delete(record.checkpoint)
                record.checkpoint = None


def delete(checkpoint: Checkpoint) -> None:
    """Delete a checkpoint's folder, and its trial's folder once empty; a failure only costs disk space."""
    uri = str(checkpoint.uri)  # set: only durable checkpoints are deleted
    try:
        Storage(uri).delete("")
        trial = Storage(uri.rsplit("/", 1)[0])
        if not trial.list():
            trial.delete("")
    except OSError:
        pass
