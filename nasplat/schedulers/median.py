"""The median stopping rule of Google Vizier (Golovin et al., 2017) around any controller."""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np

from nasplat.controllers.base import CONTINUE, STOP, Controller, Decision, Result
from nasplat.core.checks import check_int
from nasplat.schedulers.base import Scheduler


class MedianStopping(Scheduler):
    """Stops a trial at step s if its best score by step s is strictly worse than the median, over the trials that
    ended (completed or stopped), of their running averages of the scores reported up to step s (a trial that ended
    before s: of all its scores). Judged from step `grace_period` on, once `min_samples` trials have ended.
    """

    def __init__(self, controller: Controller, *, grace_period: int = 1, min_samples: int = 3) -> None:
        super().__init__(controller)
        self.grace_period = check_int("grace_period", grace_period, minimum=1)
        self.min_samples = check_int("min_samples", min_samples, minimum=1)
        self.steps: dict[int, list[int]] = {}  # trial -> its reported steps, ascending
        self.sums: dict[int, list[float]] = {}  # trial -> running sums of its scores
        self.best: dict[int, list[float]] = {}  # trial -> best score so far, per report
        self.ended: list[int] = []

    def decide(self, trial_id: int, result: Result) -> Decision:
        score = self.score_or_worst(result)
        steps, sums, best = self.steps.setdefault(trial_id, []), self.sums.setdefault(trial_id, []), \
            self.best.setdefault(trial_id, [])
        steps.append(result.step)
        sums.append(score + (sums[-1] if sums else 0.0))
        best.append(max(score, best[-1]) if best else score)
        if result.step < self.grace_period or len(self.ended) < self.min_samples or trial_id in self.unjudged:
            return CONTINUE
        return STOP if best[-1] < self.median(result.step) else CONTINUE

    @property
    def first_rung(self) -> int:
        """The first step judged: `grace_period`."""
        return self.grace_period

    def running_average(self, trial_id: int, step: int) -> float | None:
        """The mean of the trial's scores reported at steps <= `step`, or None if it reported none."""
        count = bisect.bisect_right(self.steps[trial_id], step)
        return self.sums[trial_id][count - 1] / count if count else None

    def median(self, step: int) -> float:
        """The median of the ended trials' running averages up to `step`."""
        averages = [a for t in self.ended if (a := self.running_average(t, step)) is not None]
        return float(np.median(averages)) if averages else float("-inf")

    def tell(self, trial_id: int, result: Result) -> None:
        if not result.failed and trial_id in self.steps:
            self.ended.append(trial_id)
        super().tell(trial_id, result)

    def describe(self) -> dict[str, Any]:
        return {"scheduler": type(self).__name__, "grace_period": self.grace_period, "min_samples": self.min_samples}
