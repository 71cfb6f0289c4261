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


@dataclass
class Budget:
    """When to stop asking for trials: after `max_trials` trials and/or `time_s` seconds on the executor clock."""

    max_trials: int | None = None
    time_s: float | None = None
    max_steps: int = 1

    def __post_init__(self) -> None:
        if self.max_trials is None and self.time_s is None:
            raise ValueError("a budget needs `max_trials` and/or `time_budget_s`; got neither")
        check_int("max_trials", self.max_trials, minimum=1, optional=True)
        check_real("time_budget_s", self.time_s, minimum=0, strict=True, optional=True)
        check_int("max_steps", self.max_steps, minimum=1)


class ExperimentFailed(RuntimeError):
    """More trials failed than `max_failed_trials` allows; the message sums up the first errors."""
