"""Asynchronous successive halving (ASHA, Li et al. 2020) around any controller: stop or pause trials at rungs."""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

import numpy as np

from nasplat.controllers.base import CONTINUE, PAUSE, STOP, Controller, Decision, Result, TrialSpec
from nasplat.core.checks import check_bool, check_choice, check_int
from nasplat.core.pareto import rank_order
from nasplat.schedulers.base import Scheduler, check_first_rung

TYPES = ("stop", "promote")
RANKINGS = ("value", "curve")
MIN_CURVES = 4  # trials seen past a rung before its curve model ranks promotions


class ASHA(Scheduler):
    """Rungs at steps `grace_period * reduction_factor**k` below `max_steps`; a trial is judged when it reaches one.

    `type="stop"`: a trial reaching a rung stops if its score is below the `1 - 1/reduction_factor` quantile
    (linear interpolation) of the scores recorded at that rung before it, else goes on; the same rule as Ray Tune's
    `ASHAScheduler`. `type="promote"`: Algorithm 2 of Li et al. (2020). A trial reaching a rung pauses and gives its
    slot back; whenever a slot is free, `promote` scans the rungs from the top down and resumes the best trial in
    the top `floor(n / reduction_factor)` of a rung's `n` results that was not promoted yet; with none, the
    wrapped controller's `ask` grows the bottom rung. A trial proposed `train_to_end` (a warm start's earlier
    incumbent) passes every rung: its rungs reach the wrapped controller, and nothing else records them.

    With `brackets=n`, bracket b's rungs start at `grace_period * reduction_factor**b`; each new trial joins a
    bracket drawn from the scheduler's seeded stream with weights `bracket_weights()` (as Tune: a softmax over
    the brackets' numbers of rungs). Promotions look at the brackets in order.

    Several objectives or constraints (the wrapped controller's): a rung's results are ranked as NSGA-II ranks
    them (`nasplat.core.pareto.rank_order`: feasible first, by non-dominated front, then crowding distance), as in
    MO-ASHA (Schmucker et al., 2021). `promote` takes its top floor(n / reduction_factor) by that ranking; `stop`
    lets a trial go on if it ranks in the top ceil(n / reduction_factor) of the rung with it.

    `rank_by="curve"` (with `type="promote"` and one objective): a rung's trials are ranked for promotion by their
    predicted final score instead of their score at the rung (after freeze-thaw: the curve, not the point, says
    which paused trial to continue). The prediction is a ridge regression, fitted at each promotion, of the score
    at `max_steps` (while fewer than `MIN_CURVES` of the rung's trials got there: at the next rung) on the score at
    the rung and its change over the step before, learnt from the rung's trials that went further; with fewer than
    `MIN_CURVES` of those, the score at the rung ranks as with `rank_by="value"` (the default).

    `delayed=True` (with `type="promote"`; after Hyper-Tune's delayed ASHA, Li et al. 2022): a rung of `n` results
    has promoted at most `floor(n / reduction_factor)` trials at any time, as many as synchronous successive
    halving would. Plain ASHA promotes every trial that enters the rung's top `floor(n / reduction_factor)` while
    paused, so a controller whose later proposals beat its earlier ones (a model-based one) gets most of them
    promoted, and trains far more steps than the rule's share.
    """

    multi_objective: ClassVar[bool] = True  # it can rank several objectives; `pareto` says whether this run does

    def __init__(self, controller: Controller, *, max_steps: int, grace_period: int = 1, reduction_factor: int = 3,
                 brackets: int = 1, type: Literal["stop", "promote"] = "stop",
                 rank_by: Literal["value", "curve"] = "value", delayed: bool = False) -> None:
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
        self.rank_by = check_choice("rank_by", rank_by, RANKINGS)
        if self.rank_by == "curve" and (self.type != "promote" or self.pareto):
            raise ValueError(f"rank_by='curve' ranks paused trials for promotion by one objective; it needs "
                             f"type='promote' and one metric without constraints, got type={self.type!r}, "
                             f"metric={list(self.metrics)}, constraints={[str(c) for c in self.constraints]}")
        self.curves: dict[int, dict[int, float]] = {}  # trial -> step -> score, with rank_by="curve"
        self.delayed = check_bool("delayed", delayed)
        if self.delayed and self.type != "promote":
            raise ValueError(f"`delayed` bounds promotions, so it needs type='promote'; got delayed=True with "
                             f"type={self.type!r}")

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
            if self.rank_by == "curve":
                self.curves.setdefault(trial_id, {})[result.step] = self.rung_score(result)
            self.reached[trial_id] = len(rungs)
            self.reach(trial_id, result)
            return STOP
        score = self.rung_score(result)
        if self.rank_by == "curve":
            self.curves.setdefault(trial_id, {})[result.step] = score
        for k in reversed(range(len(rungs))):  # the highest rung reached and not recorded yet
            if result.step < rungs[k] or trial_id in recorded[k]:
                continue
            if trial_id in self.unjudged and self.reached.get(trial_id, -1) >= k:
                return CONTINUE  # past a rung already handed on, below the next
            self.reached[trial_id] = k
            self.reach(trial_id, result)
            if trial_id in self.unjudged:  # trained to the end: seen at its rungs, never recorded, paused or stopped
                return CONTINUE
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
        of the highest rung that has one (brackets in order; with `delayed`, among rungs below their quota of
        promotions), or None."""
        if self.type != "promote":
            return None
        for bracket, recorded in enumerate(self.recorded):
            for k in reversed(range(len(recorded))):
                rung, quota = recorded[k], len(recorded[k]) // self.reduction_factor
                if self.delayed and len(self.promoted[bracket][k]) >= quota:
                    continue
                order = self.by_curve(bracket, k) if self.rank_by == "curve" else self.ranked(rung)
                for trial_id in order[:quota]:
                    if trial_id not in self.promoted[bracket][k] and trial_id in self.paused:
                        self.promoted[bracket][k].add(trial_id)
                        self.paused.discard(trial_id)
                        return trial_id
        return None

    def by_curve(self, bracket: int, k: int) -> list[int]:
        """Rung k's trials, best predicted final score first (`rank_by="curve"`); by score at the rung while the
        rung's curve model has too few trials to learn from."""
        rung, rungs = self.recorded[bracket][k], self.rungs[bracket]
        step = rungs[k]
        later = [self.max_steps] + ([rungs[k + 1]] if k + 1 < len(rungs) else [])
        for target in later:
            learnt = [t for t in rung if target in self.curves.get(t, {})]
            if len(learnt) >= MIN_CURVES:
                break
        else:
            return self.ranked(rung)
        x = np.array([self._curve_features(t, step) for t in learnt])
        y = np.array([self.curves[t][target] for t in learnt])
        finite = np.isfinite(x).all(axis=1) & np.isfinite(y)
        if finite.sum() < MIN_CURVES:
            return self.ranked(rung)
        x, y = x[finite], y[finite]
        weights = np.linalg.solve(x.T @ x + 1e-3 * np.eye(x.shape[1]), x.T @ y)
        predicted = {t: float(np.dot(self._curve_features(t, step), weights)) for t in rung}
        return sorted(rung, key=lambda t: -predicted[t] if np.isfinite(predicted[t]) else np.inf)

    def _curve_features(self, trial_id: int, step: int) -> list[float]:
        """1, the trial's score at `step`, and its change since the step before (0 at the first step)."""
        curve = self.curves.get(trial_id, {})
        value = curve.get(step, float("-inf"))
        before = curve.get(step - 1, value)
        return [1.0, value, value - before]

    @property
    def first_rung(self) -> int:
        """The lowest bracket's first rung."""
        return self.grace_period

    # -- reporting ------------------------------------------------------------------------------------
    def rung_of(self, trial_id: int) -> int | None:
        return self.reached.get(trial_id)

    def describe(self) -> dict[str, Any]:
        return {"scheduler": type(self).__name__, "type": self.type, "reduction_factor": self.reduction_factor,
                "max_steps": self.max_steps, "rungs": [list(r) for r in self.rungs], "rank_by": self.rank_by,
                "delayed": self.delayed}
