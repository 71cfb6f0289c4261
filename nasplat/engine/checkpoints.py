"""Which of an experiment's checkpoints are written, which go, and when: a step's checkpoint where the policy asks
for one (and a paused trial's always); the ones newer checkpoints replaced, once a synced row names the successor
(before, a resume would still need them), and those of ended trials outside the `keep_best` best. Also the count of
checkpoints that could not be written, printed as they fail and summed up in one line at the run's end."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from nasplat.core.rows import Status
from nasplat.engine.console import last_line
from nasplat.engine.records import TrialRecord
from nasplat.storage import Storage
from nasplat.storage.checkpoints import Checkpoint, CheckpointPolicy


class CheckpointBook:
    """The engine's checkpoint bookkeeping under `policy` (None: checkpoints are kept, only superseded ones go), for
    the experiment folder `home` (its path or URI): only checkpoints inside it are ever deleted, never those of
    another folder that rows from before a copy still name."""

    def __init__(self, policy: CheckpointPolicy | None, home: str | None = None) -> None:
        self.policy, self.home = policy, home
        # checkpoints replaced by a newer one of the same trial: the newer one's location as rows record it ->
        # the old one; old ones whose successor a recorded row names may go once that row is synced
        self.superseded: dict[str, Checkpoint] = {}
        self.deletable: list[Checkpoint] = []
        self.lost: list[Checkpoint] = []  # checkpoints whose write failed (not those a newer one superseded)

    def save_step(self, step: int, status: Status, *, perturbation: bool, stored: bool) -> int | None:
        """The step to checkpoint after a step that left its trial in `status` (None: none): where the policy asks
        (for a `perturbation`'s snapshot, at the trial's end), and always a paused trial's where there is storage
        (`stored`): its state is kept durably always, in memory where it fits."""
        due = self.policy is not None and self.policy.due(step, perturbation=perturbation,
                                                          ending=status != Status.RUNNING)
        return step if due or (status == Status.PAUSED and stored) else None

    def replaced(self, previous: Checkpoint | None, checkpoint: Checkpoint, recorded: str | None = None) -> None:
        """`checkpoint` is its trial's latest now, in place of `previous`: that goes once a synced row names
        `checkpoint` (as `recorded`, default its uri)."""
        if previous is not None and checkpoint.uri is not None and previous.uri != checkpoint.uri:
            self.superseded[recorded or checkpoint.uri] = previous

    def recorded(self, row: Mapping[str, Any]) -> None:
        """A row went out: the checkpoint its own replaced may go once the row is synced."""
        if row.get("checkpoint") in self.superseded:
            self.deletable.append(self.superseded.pop(row["checkpoint"]))

    def delete_superseded(self) -> None:
        """Delete the checkpoints whose successors synced rows name."""
        for checkpoint in self.deletable:
            self.delete(checkpoint)
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
                self.delete(record.checkpoint)
                record.checkpoint = None

    def delete(self, checkpoint: Checkpoint) -> None:
        """Delete a checkpoint's folder, and its trial's folder once empty, if it lies in this experiment's folder;
        a failure only costs disk space."""
        uri = str(checkpoint.uri)  # set: only durable checkpoints are deleted
        if self.home is not None and not uri.startswith(self.home.rstrip("/") + "/"):
            return  # another folder's (the original of a copy): not this experiment's to delete
        try:
            Storage(uri).delete("")
            trial = Storage(uri.rsplit("/", 1)[0])
            if not trial.list():
                trial.delete("")
        except OSError:
            pass

    # -- failed writes ---------------------------------------------------------------------------------
    def failed(self, checkpoint: Checkpoint) -> str | None:
        """Count a checkpoint whose write failed; for the first three, the line that says so (printed one by one;
        the run's end counts them all: `lost_summary`), else None."""
        self.lost.append(checkpoint)
        if len(self.lost) > 3:
            return None
        return (f"checkpoint of trial {checkpoint.trial_id} at step {checkpoint.step} failed: "
                f"{last_line(checkpoint.error or '')}"
                + ("; further failures are counted at the end" if len(self.lost) == 3 else ""))

    def lost_summary(self, last: Iterable[int] = ()) -> str:
        """One line on the checkpoints that could not be written ("" if none): how many, the first error, and the
        trials in `last` whose last checkpoint is among them."""
        if not self.lost:
            return ""
        first = self.lost[0]
        summary = (f"{len(self.lost)} checkpoint{'s' if len(self.lost) > 1 else ''} could not be written; the first, "
                   f"of trial {first.trial_id} at step {first.step}: {last_line(first.error or 'no error given')}. "
                   "Their trials went on; a retry or resume starts from an earlier checkpoint or from scratch")
        trials = sorted(set(last))
        if trials:
            several = len(trials) > 1
            summary += (f"; among them the last one of trial{'s' if several else ''} {', '.join(map(str, trials))}: "
                        f"{'their' if several else 'its'} final state is not stored")
        return summary
