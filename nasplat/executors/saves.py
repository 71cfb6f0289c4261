"""Checkpoint saves in flight: which each trial was asked for and not yet reported.

Every executor keeps one `SaveTracker`: a save is `request`ed when `step`, `exploit` or `stop` asks for it, and
leaves the tracker once an event reports it (`report`), durable or failed. Where its writer is gone (a dead worker
process, a lost actor), `lose` reports the trial's pending saves as failed. So every save requested is reported
exactly once, whatever the executor.
"""

from __future__ import annotations

from collections.abc import Iterable

from nasplat.storage.checkpoints import Checkpoint


class SaveTracker:
    """The saves (trial id, step) requested and not yet reported; a step asked for twice is owed twice."""

    def __init__(self) -> None:
        self._pending: dict[int, list[int]] = {}  # trial id -> steps of its unreported saves, in request order

    def request(self, trial_id: int, step: int) -> None:
        """Note that trial `trial_id`'s state at step `step` is being saved; an event must report it."""
        self._pending.setdefault(trial_id, []).append(step)

    def pending(self, trial_id: int) -> tuple[int, ...]:
        """The steps of trial `trial_id`'s saves requested and not yet reported, in request order."""
        return tuple(self._pending.get(trial_id, ()))

    def owes(self, trial_id: int | None = None) -> bool:
        """Whether a save (of trial `trial_id`, or of any trial) is still to be reported."""
        if trial_id is None:
            return any(self._pending.values())
        return bool(self._pending.get(trial_id))

    def report(self, saved: Iterable[Checkpoint]) -> tuple[Checkpoint, ...]:
        """Take the finished saves `saved` (durable or failed) off the pending ones; returns them, to be reported.
        A checkpoint no save asked for passes through as it is."""
        saved = tuple(saved)
        for checkpoint in saved:
            steps = self._pending.get(checkpoint.trial_id)
            if steps is not None and checkpoint.step in steps:
                steps.remove(checkpoint.step)
                if not steps:
                    del self._pending[checkpoint.trial_id]
        return saved

    def lose(self, trial_id: int, reason: str) -> tuple[Checkpoint, ...]:
        """Trial `trial_id`'s pending saves as failed checkpoints (error `reason`: their writer is gone), taken off
        the pending ones: the caller reports them. A write may still have left a complete checkpoint behind."""
        return tuple(Checkpoint(trial_id, step, None, reason) for step in sorted(self._pending.pop(trial_id, ())))
