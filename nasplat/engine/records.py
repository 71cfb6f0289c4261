"""The engine's records: one trial's state, the search budget, and the error that ends a failing experiment."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nasplat.core.checks import check_int, check_real
from nasplat.core.rows import Status
from nasplat.space import Config
from nasplat.storage.checkpoints import Checkpoint


@dataclass
class TrialRecord:
    """The engine's view of one trial."""

    trial_id: int
    config: Config
    parent_id: int | None = None
    status: Status = Status.RUNNING  # running, paused, or ended: completed, stopped, failed (never retried)
    step: int = 0
    attempt: int = 0
    metrics: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    behind: int = 0  # steps its count runs ahead of its training progress (exploits of donors' earlier states)
    restart: tuple[Any, int] | None = None  # (in-memory state handle, step) a retry may start from, set by exploits
    checkpoint: Checkpoint | None = None  # the latest durable checkpoint
    inherit: Any = None  # the parent's final state handle the trial starts from (evolution's inherit_weights)


MIN_GRACE_S = 10.0
"""The least grace running steps get after the time budget when `step_timeout_s` is not set (see `Budget.grace_s`)."""


@dataclass
class Budget:
    """When to stop asking for trials: after `max_trials` trials and/or `time_s` seconds on the executor clock;
    `step_timeout_s`: the longest one step may run (None: no limit), enforced by the executor."""

    max_trials: int | None = None
    time_s: float | None = None
    max_steps: int = 1
    step_timeout_s: float | None = None

    def __post_init__(self) -> None:
        if self.max_trials is None and self.time_s is None:
            raise ValueError("a budget needs `max_trials` and/or `time_budget_s`; got neither")
        check_int("max_trials", self.max_trials, minimum=1, optional=True)
        check_real("time_budget_s", self.time_s, minimum=0, strict=True, optional=True)
        check_int("max_steps", self.max_steps, minimum=1)
        check_real("step_timeout_s", self.step_timeout_s, minimum=0, strict=True, optional=True)

    @property
    def grace_s(self) -> float | None:
        """How long steps still running when the time budget is spent may go on before their trials are stopped
        (left resumable): `step_timeout_s` if set, else 10% of `time_s` and at least `MIN_GRACE_S`; None without
        a time budget."""
        if self.time_s is None:
            return None
        return self.step_timeout_s if self.step_timeout_s is not None else max(MIN_GRACE_S, 0.1 * self.time_s)


class ExperimentFailed(RuntimeError):
    """More trials failed than `max_failed_trials` allows; the message sums up the first errors."""
