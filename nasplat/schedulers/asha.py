"""Asynchronous successive halving (ASHA, Li et al. 2020) around any controller: stop or pause trials at rungs."""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

import numpy as np

from nasplat.controllers.base import CONTINUE, PAUSE, STOP, Controller, Decision, Result, TrialSpec
from nasplat.core.checks import check_choice, check_int
from nasplat.core.pareto import rank_order
from nasplat.schedulers.base import Scheduler, check_first_rung

TYPES = ("stop", "promote")


class ASHA(Scheduler):
    """Rungs at steps `grace_period * reduction_factor**k` below `max_steps`; a trial is judged when it reaches one.

    `type="stop"`: a trial reaching a rung stops if its score is below the `1 - 1/reduction_factor` quantile
    (linear interpolation) of the scores recorded at that rung before it, else goes on; the same rule as Ray Tune's
    `ASHAScheduler`. `type="promote"`: Algorithm 2 of Li et al. (2020). A trial reaching a rung pauses and gives its
    slot back; whenever a slot is free, `promote` scans the rungs from the top down and resumes the best trial in
    the top `floor(n / reduction_factor)` of a rung's `n` results that was not promoted yet; with none, the
    wrapped controller's `ask` grows the bottom rung.

    With `brackets=n`, bracket b's rungs start at `grace_period * reduction_factor**b`; each new trial joins a
    bracket drawn from the scheduler's seeded stream with weights `bracket_weights()` (as Tune: a softmax over
    the brackets' numbers of rungs). Promotions look at the brackets in order.

    Several objectives or constraints (the wrapped controller's): a rung's results are ranked as NSGA-II ranks
    them (`nasplat.core.pareto.rank_order`: feasible first, by non-dominated front, then crowding distance), as in
    MO-ASHA (Schmucker et al., 2021). `promote` takes its top floor(n / reduction_factor) by that ranking; `stop`
    lets a trial go on if it ranks in the top ceil(n / reduction_factor) of the rung with it.
    """

    multi_objective: ClassVar[bool] = True  # it can rank several objectives; `pareto` says whether this run does

    def __init__(self, controller: Controller, *, max_steps: int, grace_period: int = 1, reduction_factor: int = 3,
                 brackets: int = 1, type: Literal["stop", "promote"] = "stop") -> None:
        super().__init__(controller)
        self.max_steps = check_int("max_steps", max_steps, minimum=1)
        self.grace_period = check_int("grace_period", grace_period, minimum=1)
        self.reduction_factor = check_int("reduction_factor", reduction_factor, minimum=2)
        self.brackets = check_int("brackets", brackets, minimum=1)
        self.type = check_choice("type", type, TYPES)
        check_first_rung(self.__class__.__name__, self.grace_period, self.max_steps)
        most = len(self._milestones(0)) + 1  # the last of them has no rung: it trains every trial to max_steps
        if self.brackets > most:
            raise ValueError(f"`brackets` must be <= {most} (the rungs below max_steps, plus one), got {brackets=} "
                             f"with {grace_period=}, {reduction_factor=}, {max_steps=}")
        self.rungs: list[list[int]] = [self._milestones(b) for b in range(self.brackets)]
        self.weights: list[float] = self.bracket_weights()
        self.recorded: list[list[dict[int, Any]]] = [[{} for _ in rungs] for rungs in self.rungs]
        self.promoted: list[list[set[int]]] = [[set() for _ in rungs] for rungs in self.rungs]
        self.bracket_of: dict[int, int] = {}
        self.reached: dict[int, int] = {}  # trial -> highest rung index reached (len(rungs): max_steps)
        self.paused: set[int] = set()
        # this run's fact: several objectives or constraints, so rungs rank by front and crowding (MO-ASHA)
        self.pareto: bool = len(self.metrics) > 1 or bool(self.constraints)

    def _milestones(self, bracket: int) -> list[int]:
        steps, k = [], bracket
        while (step := self.grace_period * self.reduction_factor ** k) < self.max_steps:
            steps.append(step)
            k += 1
        return steps

    def bracket_weights(self) -> list[float]:
        """The chance of each bracket for a new trial: a softmax over the numbers of rungs, as Ray Tune's."""
        sizes = np.array([len(r) for r in self.rungs], dtype=float)
        weights = np.exp(sizes - sizes.max())
        return (weights / weights.sum()).tolist()

    # -- the schedule ---------------------------------------------------------------------------------
    def on_ask(self, spec: TrialSpec) -> None:
        bracket = 0
        if self.brackets > 1:
            bracket = min(int(np.searchsorted(np.cumsum(self.weights), self.rng.random(), side="right")),
                          self.brackets - 1)
        self.bracket_of[spec.trial_id] = bracket

    def decide(self, trial_id: int, result: Result) -> Decision:
        bracket = self.bracket_of.get(trial_id, 0)
        rungs, recorded = self.rungs[bracket], self.recorded[bracket]
        if result.step >= self.max_steps:
            self.reached[trial_id] = len(rungs)
            self.reach(trial_id, result)
            return STOP
        score = self.rung_score(result)
        for k in reversed(range(len(rungs))):  # the highest rung reached and not recorded yet
            if result.step < rungs[k] or trial_id in recorded[k]:
                continue
            self.reached[trial_id] = k
            self.reach(trial_id, result)
            if self.type == "stop" and self.pareto:
                recorded[k][trial_id] = score
                kept = math.ceil(len(recorded[k]) / self.reduction_factor)
                return CONTINUE if self.ranked(recorded[k]).index(trial_id) < kept else STOP
            if self.type == "stop":
                cutoff = self.cutoff(recorded[k])
                recorded[k][trial_id] = score
                return STOP if cutoff is not None and score < cutoff else CONTINUE
            recorded[k][trial_id] = score
            self.paused.add(trial_id)
            self.tell_now(trial_id, result)
            return PAUSE
        return CONTINUE

    def rung_score(self, result: Result) -> Any:
        """What a rung records: the maximised score; with several objectives or constraints, (maximised
        objectives, total violation), None where an objective is missing."""
        if not self.pareto:
            return self.score_or_worst(result)
        scored = self.objectives(result)
        return None if scored is None else (scored[0].tolist(), float(scored[1]))

    def ranked(self, rung: dict[int, Any]) -> list[int]:
        """The rung's trials, best first (of equal scores, the earlier first); results without a score last."""
        if not self.pareto:
            return sorted(rung, key=lambda t: -rung[t])
        scored = [t for t in rung if rung[t] is not None]
        points = np.array([rung[t][0] for t in scored], dtype=float).reshape(len(scored), len(self.metrics))
        order = rank_order(points, [rung[t][1] for t in scored])
        return [scored[i] for i in order] + [t for t in rung if rung[t] is None]

    def cutoff(self, recorded: dict[int, float]) -> float | None:
        """The score a trial reaching this rung must match to go on (`stop`), or None while the rung is empty."""
        if not recorded:
            return None
        return float(np.percentile(list(recorded.values()), (1 - 1 / self.reduction_factor) * 100))

    def promote(self) -> int | None:
        """Li et al. (2020), Algorithm 2's `get_job`: the best not yet promoted trial in the top 1/reduction_factor
        of the highest rung that has one (brackets in order), or None."""
        if self.type != "promote":
            return None
        for bracket, recorded in enumerate(self.recorded):
            for k in reversed(range(len(recorded))):
                rung = recorded[k]
                for trial_id in self.ranked(rung)[:len(rung) // self.reduction_factor]:
                    if trial_id not in self.promoted[bracket][k] and trial_id in self.paused:
                        self.promoted[bracket][k].add(trial_id)
                        self.paused.discard(trial_id)
                        return trial_id
        return None

    @property
    def first_rung(self) -> int:
        """The lowest bracket's first rung."""
        return self.grace_period

    # -- reporting ------------------------------------------------------------------------------------
    def rung_of(self, trial_id: int) -> int | None:
        return self.reached.get(trial_id)

    def describe(self) -> dict[str, Any]:
        return {"scheduler": type(self).__name__, "type": self.type, "reduction_factor": self.reduction_factor,
                "max_steps": self.max_steps, "rungs": [list(r) for r in self.rungs]}
