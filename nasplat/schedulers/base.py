"""A scheduler: a `Searcher` that wraps a search controller and decides, step by step, which trials train on."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from nasplat.controllers.base import CONTINUE, Continue, Controller, Decision, Result, Searcher, TrialSpec
from nasplat.core.pareto import Constraint
from nasplat.space import Config, Space

# The wrapped controller's fields a scheduler forwards; snapshots taken before schedulers forwarded them (when they
# were copies) carry them too, and loading one leaves them to the controller.
FORWARDED = ("space", "metric", "mode", "metrics", "modes", "constraints", "seed")


class Scheduler(Searcher):
    """Wraps `controller`: `ask`, `parents`, `snapshot_due` and the objectives (`metric`, `metrics`, `modes`,
    `constraints`, and `space`, `seed`) are the wrapped controller's; `on_result` first asks the wrapped controller
    and, where it lets the trial go on, applies `decide` (the schedule: stop, pause, go on).

    The wrapped controller is told each trial's result once, at the rung where the trial ended: when the engine
    ends it (completed, stopped, failed) or, for schedulers that pause (ASHA's `promote` type), when it first pauses
    (`tell_now`). A trial promoted later and ending higher up is not told again, so the wrapped controller's
    population holds each trial at the fidelity where it first left the schedule. Every rung a trial reaches, and
    its last report, also reach the wrapped controller's `on_rung` (`reach`), in order: a controller that learns
    from every fidelity (`nasplat.controllers.mf_model`) learns there, paused, stopped and promoted trials alike.
    """

    def __init__(self, controller: Searcher) -> None:
        if isinstance(controller, Scheduler):
            raise ValueError(f"a scheduler wraps a search controller, not another scheduler; got "
                             f"{type(controller).__name__}")
        if not isinstance(controller, Controller):
            raise TypeError(f"a scheduler wraps a Controller, got {controller!r}")
        if controller.min_concurrency > 1:
            raise ValueError(f"{type(controller).__name__} trains its population side by side and decides itself when "
                             "members stop; it cannot be wrapped by a scheduler")
        self.controller = controller
        self.rng = np.random.default_rng([controller.seed, 0x5C4E])  # the scheduler's own stream (brackets)
        self.told: set[int] = set()
        self.rung_steps: dict[int, int] = {}  # trial -> the step of its latest report handed to `on_rung`
        self.unjudged: set[int] = set()  # trials proposed `train_to_end`: never stopped or paused at a rung

    # -- the wrapped controller's objectives -----------------------------------------------------------
    @property
    def space(self) -> Space:
        """The wrapped controller's space."""
        return self.controller.space

    @property
    def metric(self) -> str:
        """The wrapped controller's first objective."""
        return self.controller.metric

    @property
    def mode(self) -> str:
        """The mode of the wrapped controller's first objective."""
        return self.controller.mode

    @property
    def metrics(self) -> tuple[str, ...]:
        """The wrapped controller's objectives."""
        return self.controller.metrics

    @property
    def modes(self) -> tuple[str, ...]:
        """The wrapped controller's modes, one per objective."""
        return self.controller.modes

    @property
    def constraints(self) -> tuple[Constraint, ...]:
        """The wrapped controller's constraints."""
        return self.controller.constraints

    @property
    def seed(self) -> int:
        """The wrapped controller's seed (the scheduler's own stream is drawn from it)."""
        return self.controller.seed

    # -- forwarded to the wrapped controller ---------------------------------------------------------
    def ask(self) -> TrialSpec | None:
        """The wrapped controller's next trial, which `on_ask` then places in the schedule (a trial proposed
        `train_to_end` goes on at every rung: `decide` lets it through)."""
        spec = self.controller.ask()
        if spec is not None:
            if spec.train_to_end:
                self.unjudged.add(spec.trial_id)
            self.on_ask(spec)
        return spec

    def on_ask(self, spec: TrialSpec) -> None:
        """A new trial starts (assign it a bracket, say). The default: nothing."""

    def tell(self, trial_id: int, result: Result) -> None:
        """A trial ended: its last report reaches `on_rung` (`reach`), and the wrapped controller learns its result,
        unless it learnt it when the trial paused."""
        self.reach(trial_id, result)
        self.tell_now(trial_id, result)

    def reach(self, trial_id: int, result: Result) -> None:
        """Hand the wrapped controller's `on_rung` a report at a rung (or a trial's last), once per trial and step;
        failed reports are left out."""
        if result.failed or result.step <= self.rung_steps.get(trial_id, 0):
            return
        self.rung_steps[trial_id] = result.step
        self.controller.on_rung(trial_id, result)

    def tell_now(self, trial_id: int, result: Result) -> None:
        """Tell the wrapped controller `result` unless it was told about the trial already."""
        if trial_id not in self.told:
            self.told.add(trial_id)
            self.controller.tell(trial_id, result)

    def warm_start(self, results: Sequence[tuple[Config, Result]]) -> None:
        """The wrapped controller's warm start."""
        self.controller.warm_start(results)

    def parents(self) -> set[int] | None:
        """The wrapped controller's parents."""
        return self.controller.parents()

    def snapshot_due(self, trial_id: int, step: int) -> bool:
        """Whether the wrapped controller wants the trial's state as of `step`."""
        return self.controller.snapshot_due(trial_id, step)

    def on_result(self, trial_id: int, result: Result) -> Decision:
        """The wrapped controller's decision where it is not to go on, else the schedule's (`decide`)."""
        decision = self.controller.on_result(trial_id, result)
        if not isinstance(decision, Continue):
            return decision
        return self.decide(trial_id, result)

    # -- the schedule ---------------------------------------------------------------------------------
    @property
    def first_rung(self) -> int:
        """The first step at which the schedule may stop or pause a trial; the default: every step."""
        return 1

    def check_max_steps(self, max_steps: int) -> None:
        """Refuse a run of `max_steps` steps a trial in which the schedule can stop or pause none (`first_rung`)."""
        check_first_rung(type(self).__name__, self.first_rung, max_steps)

    def decide(self, trial_id: int, result: Result) -> Decision:
        """The schedule's decision for an intermediate report; the default lets the trial go on."""
        return CONTINUE

    def describe(self) -> dict[str, Any]:
        """The schedule as plain data for `meta.json` and the report (rung steps, reduction factor)."""
        return {"scheduler": type(self).__name__}

    def score(self, result: Result) -> float | None:
        """The wrapped controller's maximised score of `result` (`Controller.score`)."""
        return self.controller.score(result)

    def objectives(self, result: Result) -> tuple[np.ndarray, float] | None:
        """The wrapped controller's maximised objectives and total violation of `result` (`Controller.objectives`)."""
        return self.controller.objectives(result)

    def score_or_worst(self, result: Result) -> float:
        """The maximised score of `result`; a result without a finite metric ranks below every other."""
        score = self.score(result)
        return float("-inf") if score is None else score

    # -- persistence: the scheduler's fields and the wrapped controller's state -------------------------
    def state_dict(self) -> dict[str, Any]:
        """The scheduler's own fields (one deep copy), its stream's state, and the wrapped controller's state."""
        state = copy.deepcopy({k: v for k, v in self.__dict__.items() if k not in ("rng", "controller")})
        state["rng"] = copy.deepcopy(self.rng.bit_generator.state)
        state["controller"] = self.controller.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from `state`: the wrapped controller from its part, the scheduler from the rest."""
        own = copy.deepcopy(dict(state))
        self.controller.load_state_dict(own.pop("controller"))
        self.rng.bit_generator.state = own.pop("rng")
        for key, value in own.items():
            if key not in FORWARDED and key != "multi_objective":  # older snapshots: copies, and ASHA's run fact
                setattr(self, key, value)


def check_first_rung(scheduler: str, first_rung: int, max_steps: int) -> None:
    """One line refusing a schedule whose first rung (step `first_rung`) is not below `max_steps`: every trial
    completes at `max_steps` first, so the scheduler would stop or pause none and the run would be a plain search."""
    if first_rung >= max_steps:
        raise ValueError(f"{scheduler} has no rung below max_steps={max_steps}: its first is at step "
                         f"{first_rung} (grace_period), where every trial completes, so it would stop or pause none; "
                         f"set max_steps > {first_rung} (the steps of a full trial) or leave the scheduler out")
