"""The ask/tell contract the engine talks to (`Searcher`), the search controllers that follow it (`Controller`),
and the decisions they return. A scheduler (`nasplat.schedulers.Scheduler`) is the other kind of `Searcher`: it
wraps a controller."""

from __future__ import annotations

import copy
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from nasplat.core.checks import check_int, parse_objectives
from nasplat.core.pareto import Constraint, parse_constraints, signs, total_violation
from nasplat.space import Config, Space


@dataclass(frozen=True)
class TrialSpec:
    """A trial proposed by a controller."""

    trial_id: int
    config: Config
    parent_id: int | None = None
    inherit_from: int | None = None  # an ended trial whose final state this one starts from, where it fits
    train_to_end: bool = False  # a scheduler trains it to `max_steps` without judging it at rungs (a warm start's
    # earlier incumbent, proposed again: the earlier run judged it already)


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
    """Load `donor_id`'s state into the trial and go on with `config` (PBT).

    The state is the donor's latest snapshot (taken where `snapshot_due` said), else its current one. With
    `donor_step`, the step that snapshot was taken at, the trial goes on from the donor's training progress: its
    `max_steps` count as if it had trained only as far as the donor had at `donor_step`, so a trial that copies a
    donor's earlier state trains on for the steps it gave up (as Ray Tune's PBT does). Without, it keeps its count.
    """

    donor_id: int
    config: Config
    donor_step: int | None = None


@dataclass(frozen=True)
class Pause:
    """Stop the trial for now and keep its state (in memory where it fits, durably with storage); the controller
    may resume it later through `promote` (asynchronous successive halving)."""


Decision = Continue | Stop | Exploit | Pause
CONTINUE = Continue()
STOP = Stop()
PAUSE = Pause()


class Searcher(ABC):
    """What the engine asks and tells: which trial to start (`ask`) or resume (`promote`), what to do after each
    reported step (`on_result`), that a trial ended (`tell`), and what to keep (`snapshot_due`, `parents`).

    Two kinds implement it: a `Controller` (a search strategy) and a `nasplat.schedulers.Scheduler` (a schedule
    that wraps a controller and forwards its objectives). Each hook has a default that lets trials run their
    course; `ask` and the persistence (`state_dict`, `load_state_dict`) are each implementation's own.
    """

    multi_objective: ClassVar[bool] = False
    """A capability of the class, not a fact of one run: whether it ranks several objectives and constraints. A
    `Controller` without it refuses them; a scheduler without it judges trials by the first objective only."""

    @property
    def min_concurrency(self) -> int:
        """How many trials must train side by side (PBT's population); the engine refuses a smaller concurrency and
        reserves that many slots. A scheduler wraps only controllers that need 1."""
        return 1

    if TYPE_CHECKING:  # read-only to the engine: a `Controller` stores them, a `Scheduler` forwards its controller's
        # The objectives, parsed: `metrics` and `modes` (one "max" or "min" per metric), the constraints on metrics;
        # `metric` and `mode` are the first objective. The space searched and the seed of the search.
        @property
        def space(self) -> Space: ...
        @property
        def metrics(self) -> tuple[str, ...]: ...
        @property
        def modes(self) -> tuple[str, ...]: ...
        @property
        def constraints(self) -> tuple[Constraint, ...]: ...
        @property
        def metric(self) -> str: ...
        @property
        def mode(self) -> str: ...
        @property
        def seed(self) -> int: ...

    # -- the contract --------------------------------------------------------------------------
    @abstractmethod
    def ask(self) -> TrialSpec | None:
        """The next trial to run, or None when nothing should start now."""

    def tell(self, trial_id: int, result: Result) -> None:
        """A trial ended with `result` (its last report, or a failure). A paused trial has not ended: `tell` comes
        only if it is resumed and ends, or fails. The default: nothing."""

    def promote(self) -> int | None:
        """A paused trial to resume now, asked before `ask` whenever a slot is free (also once the budget for new
        trials is spent); the trial continues from its saved state at its next step. The default: none."""
        return None

    def rung_of(self, trial_id: int) -> int | None:
        """The highest rung (index, 0 first) of a schedule the trial has reached, recorded in its rows as `rung`;
        None without rungs (the default) or before the first."""
        return None

    def on_result(self, trial_id: int, result: Result) -> Decision:
        """An intermediate report; the default lets every trial run to its step budget."""
        return CONTINUE

    def on_rung(self, trial_id: int, result: Result) -> None:
        """The trial's report at a rung of the schedule that wraps this searcher, its fidelity `result.step`.

        A scheduler calls it for every rung every trial reaches, and for the last report of a trial that ends
        between rungs or at `max_steps`, whatever happens next (it goes on, pauses, stops or completes; a failed
        report is never one). `tell` still comes once per trial, where the scheduler documents it: a controller
        that learns from partial training (a model of the metric over config and fidelity) learns here. Called in
        the order of the reports, so a resume replays it exactly. The default: nothing (the controller learns from
        `tell` only)."""

    def warm_start(self, results: Sequence[tuple[Config, Result]]) -> None:
        """An earlier experiment's results (each a config and its report at `result.step`), handed once before
        the first `ask` (`warm_start:` of an experiment); a controller may learn from them. The default: nothing."""

    def snapshot_due(self, trial_id: int, step: int) -> bool:
        """Whether a later exploit may copy the trial's state as of `step`; executors then keep a copy of it,
        so that the exploit need not wait for the donor's running step. The default: never."""
        return False

    def parents(self) -> set[int] | None:
        """Ended trials whose final state a later trial may start from (`TrialSpec.inherit_from`); executors keep
        those states and let go of the others. None (the default): no trial inherits, keep nothing."""
        return None

    # -- persistence -----------------------------------------------------------------------------
    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue identically, RNG state included, as a snapshot that shares nothing."""

    @abstractmethod
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from `state`, taken by `state_dict` of a searcher built with the same arguments."""


class Controller(Searcher):
    """A seeded ask/tell search strategy: a `Searcher` that proposes the trials itself. Scores are always
    maximised: `mode="min"` flips the sign once here.

    `metric` may name several objectives (with one `mode` each, or one for all) and `constraints` may bound
    metrics (`"params <= 1.0"`, see `nasplat.core.pareto.parse_constraints`); only controllers with
    `multi_objective = True` accept either. `metrics`, `modes` and `constraints` hold them parsed;
    `metric` and `mode` are the first objective.
    """

    space: Space
    metrics: tuple[str, ...]
    modes: tuple[str, ...]
    constraints: tuple[Constraint, ...]
    metric: str
    mode: str
    seed: int

    def __init__(self, space: Space | Mapping[str, Any], *, metric: str | Sequence[str],
                 mode: str | Sequence[str] = "max", constraints: Any = None, seed: int = 0) -> None:
        self.metrics, self.modes = parse_objectives(metric, mode)
        self.constraints = parse_constraints(constraints)
        if (len(self.metrics) > 1 or self.constraints) and not self.multi_objective:
            raise ValueError(f"{type(self).__name__} optimises one metric without constraints, got "
                             f"metric={list(self.metrics)}, constraints={[str(c) for c in self.constraints]}; "
                             f"for several objectives or constraints use 'mo_evolution', 'random' or 'optuna'")
        check_int("seed", seed, minimum=0)
        self.space = space if isinstance(space, Space) else Space(space)
        self.metric, self.mode, self.seed = self.metrics[0], self.modes[0], seed
        self._signs = signs(self.modes)
        self.rng = np.random.default_rng(seed)
        self.next_trial_id = 0
        self.failed_trials: list[int] = []  # ids of trials that reported a failure or a non-finite metric, in order

    def tell(self, trial_id: int, result: Result) -> None:
        """A trial ended with `result`; the default records it in `failed_trials` if it failed."""
        self._objectives_of(trial_id, result)

    # -- helpers ---------------------------------------------------------------------------
    def score(self, result: Result) -> float | None:
        """The maximised score of `result`, or None if it failed or lacks a finite metric."""
        if result.failed:
            return None
        try:  # a missing metric reads as NaN: not finite, so no score
            value = float(result.metrics.get(self.metric, math.nan))
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

    def objectives(self, result: Result) -> tuple[np.ndarray, float] | None:
        """The maximised objective vector of `result` (one entry per metric) and its total constraint violation
        (0: feasible), or None if it failed or lacks a finite value for an objective or a constrained metric."""
        if result.failed:
            return None
        values = []
        for name in self.metrics:
            try:
                value = float(result.metrics.get(name, math.nan))
            except (TypeError, ValueError):
                return None
            if not math.isfinite(value):
                return None
            values.append(value)
        violation = total_violation(self.constraints, result.metrics)
        if not math.isfinite(violation):
            return None
        return np.asarray(values) * self._signs, violation

    def _objectives_of(self, trial_id: int, result: Result) -> tuple[np.ndarray, float] | None:
        """`objectives(result)`; a failed result (None) is recorded in `failed_trials`."""
        scored = self.objectives(result)
        if scored is None:
            self.failed_trials.append(trial_id)
        return scored

    def _propose(self, config: Config, parent_id: int | None = None, inherit_from: int | None = None,
                 train_to_end: bool = False) -> TrialSpec:
        spec = TrialSpec(self.next_trial_id, config, parent_id, inherit_from, train_to_end)
        self.next_trial_id += 1
        return spec

    # -- persistence -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue identically, RNG state included (one deep copy: objects that
        attributes share stay shared)."""
        state = copy.deepcopy({k: v for k, v in self.__dict__.items() if k not in ("space", "rng")})
        state["rng"] = copy.deepcopy(self.rng.bit_generator.state)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from `state` (a copy of it: the controller shares nothing with it)."""
        own = copy.deepcopy(dict(state))
        self.rng.bit_generator.state = own.pop("rng")
        for key, value in own.items():
            setattr(self, key, value)
