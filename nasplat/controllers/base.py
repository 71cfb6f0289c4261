"""The ask/tell contract every search controller follows, and the decisions it returns."""

from __future__ import annotations

import copy
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from nasplat.space import Config, Space
from nasplat.validation import check_int


@dataclass(frozen=True)
class TrialSpec:
    """A trial proposed by a controller."""

    trial_id: int
    config: Config
    parent_id: int | None = None
    inherit_from: int | None = None  # an ended trial whose final state this one starts from, where it fits


@dataclass(frozen=True)
class Result:
    """What a trial reported at `step` (1-based); `failed` marks a crash or a NaN metric."""

    metrics: Mapping[str, Any] = field(default_factory=dict)
    step: int = 0
    failed: bool = False
    error: str | None = None


@dataclass(frozen=True)
class Continue:
    """Keep training the trial."""


@dataclass(frozen=True)
class Stop:
    """End the trial now."""


@dataclass(frozen=True)
class Exploit:
    """Load `donor_id`'s current state into the trial and go on with `config` (PBT)."""

    donor_id: int
    config: Config


Decision = Continue | Stop | Exploit
CONTINUE = Continue()
STOP = Stop()


class Controller(ABC):
    """A seeded ask/tell search strategy. Scores are always maximised: `mode="min"` flips the sign once here."""

    def __init__(self, space: Space | Mapping[str, Any], *, metric: str, mode: Literal["max", "min"] = "max",
                 seed: int = 0) -> None:
        if mode not in ("max", "min"):
            raise ValueError(f"mode must be 'max' or 'min', got {mode=!r}")
        if not isinstance(metric, str) or not metric:
            raise ValueError(f"metric must be a non-empty string naming a reported metric, got {metric=!r}")
        check_int("seed", seed, minimum=0)
        self.space = space if isinstance(space, Space) else Space(space)
        self.metric, self.mode, self.seed = metric, mode, seed
        self.rng = np.random.default_rng(seed)
        self.next_trial_id = 0
        self.failed_trials: list[int] = []  # ids of trials that reported a failure or a non-finite metric, in order

    # -- the contract --------------------------------------------------------------------------
    @abstractmethod
    def ask(self) -> TrialSpec | None:
        """The next trial to run, or None when nothing should start now."""

    def tell(self, trial_id: int, result: Result) -> None:
        """A trial ended with `result` (its last report, or a failure)."""
        self._score_of(trial_id, result)

    def on_result(self, trial_id: int, result: Result) -> Decision:
        """An intermediate report; the default lets every trial run to its step budget."""
        return CONTINUE

    def snapshot_due(self, trial_id: int, step: int) -> bool:
        """Whether a later exploit may copy the trial's state as of `step`; executors then keep a copy of it,
        so that the exploit need not wait for the donor's running step. The default: never."""
        return False

    # -- helpers ---------------------------------------------------------------------------
    def score(self, result: Result) -> float | None:
        """The maximised score of `result`, or None if it failed or lacks a finite metric."""
        if result.failed:
            return None
        value = result.metrics.get(self.metric)
        try:
            value = float(value)
        except (TypeError, ValueError):
            return None
        if not math.isfinite(value):
            return None
        return value if self.mode == "max" else -value

    def _score_of(self, trial_id: int, result: Result) -> float | None:
        """`score(result)`; a failed result (None) is recorded in `failed_trials`. Subclasses score results here."""
        score = self.score(result)
        if score is None:
            self.failed_trials.append(trial_id)
        return score

    def parents(self) -> set[int] | None:
        """Ended trials whose final state a later trial may start from (`TrialSpec.inherit_from`); executors keep
        those states and let go of the others. None (the default): no trial inherits, keep nothing."""
        return None

    def _propose(self, config: Config, parent_id: int | None = None, inherit_from: int | None = None) -> TrialSpec:
        spec = TrialSpec(self.next_trial_id, config, parent_id, inherit_from)
        self.next_trial_id += 1
        return spec

    # -- persistence -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue identically, RNG state included."""
        state = {k: copy.deepcopy(v) for k, v in self.__dict__.items() if k not in ("space", "rng")}
        state["rng"] = copy.deepcopy(self.rng.bit_generator.state)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        state = dict(state)
        self.rng.bit_generator.state = copy.deepcopy(state.pop("rng"))
        for key, value in state.items():
            setattr(self, key, copy.deepcopy(value))
