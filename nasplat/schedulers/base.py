"""A scheduler: a controller that wraps another one and decides, step by step, which trials train on."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import numpy as np

from nasplat.controllers.base import CONTINUE, Continue, Controller, Decision, Result, TrialSpec


class Scheduler(Controller):
    """Wraps `controller`: `ask`, `parents` and the metric are the wrapped controller's; `on_result` first asks the
    wrapped controller and, where it lets the trial go on, applies `decide` (the schedule: stop, pause, go on).

    The wrapped controller is told each trial's result once, at the rung where the trial ended: when the engine
    ends it (completed, stopped, failed) or, for schedulers that pause (ASHA's `promote` type), when it first pauses
    (`tell_now`). A trial promoted later and ending higher up is not told again, so the wrapped controller's
    population holds each trial at the fidelity where it first left the schedule.
    """

    def __init__(self, controller: Controller) -> None:
        if not isinstance(controller, Controller):
            raise TypeError(f"a scheduler wraps a Controller, got {controller!r}")
        if isinstance(controller, Scheduler):
            raise ValueError(f"a scheduler wraps a search controller, not another scheduler; got "
                             f"{type(controller).__name__}")
        if getattr(controller, "min_concurrency", 1) > 1:
            raise ValueError(f"{type(controller).__name__} trains its population side by side and decides itself when "
                             "members stop; it cannot be wrapped by a scheduler")
        self.controller = controller
        self.space, self.metric, self.mode, self.seed = controller.space, controller.metric, controller.mode, \
            controller.seed
        # the objectives and constraints are the wrapped controller's
        self.metrics, self.modes, self.constraints = controller.metrics, controller.modes, controller.constraints
        self.rng = np.random.default_rng([controller.seed, 0x5C4E])  # the scheduler's own stream (brackets)
        self.told: set[int] = set()

    # -- forwarded to the wrapped controller ---------------------------------------------------------
    def ask(self) -> TrialSpec | None:
        spec = self.controller.ask()
        if spec is not None:
            self.on_ask(spec)
        return spec

    def on_ask(self, spec: TrialSpec) -> None:
        """A new trial starts (assign it a bracket, say). The default: nothing."""

    def tell(self, trial_id: int, result: Result) -> None:
        self.tell_now(trial_id, result)

    def tell_now(self, trial_id: int, result: Result) -> None:
        """Tell the wrapped controller `result` unless it was told about the trial already."""
        if trial_id not in self.told:
            self.told.add(trial_id)
            self.controller.tell(trial_id, result)

    def parents(self) -> set[int] | None:
        return self.controller.parents()

    def snapshot_due(self, trial_id: int, step: int) -> bool:
        return self.controller.snapshot_due(trial_id, step)

    def on_result(self, trial_id: int, result: Result) -> Decision:
        decision = self.controller.on_result(trial_id, result)
        if not isinstance(decision, Continue):
            return decision
        return self.decide(trial_id, result)

    def decide(self, trial_id: int, result: Result) -> Decision:
        """The schedule's decision for an intermediate report; the default lets the trial go on."""
        return CONTINUE

    def describe(self) -> dict[str, Any]:
        """The schedule as plain data for `meta.json` and the report (rung steps, reduction factor)."""
        return {"scheduler": type(self).__name__}

    def score_or_worst(self, result: Result) -> float:
        """The maximised score of `result`; a result without a finite metric ranks below every other."""
        score = self.score(result)
        return float("-inf") if score is None else score

    # -- persistence: the scheduler's fields and the wrapped controller's state -------------------------
    def state_dict(self) -> dict[str, Any]:
        state = {k: copy.deepcopy(v) for k, v in self.__dict__.items()
                 if k not in ("space", "rng", "controller")}
        state["rng"] = copy.deepcopy(self.rng.bit_generator.state)
        state["controller"] = self.controller.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        state = dict(state)
        self.controller.load_state_dict(state.pop("controller"))
        super().load_state_dict(state)


def check_int(name: str, value: Any, low: int) -> int:
    """`value` if it is an integer >= `low`, else a ValueError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"`{name}` must be an integer >= {low}, got {name}={value!r}")
    return int(value)
