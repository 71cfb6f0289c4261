"""The engine's records: one trial's state, the search budget, and the error that ends a failing experiment."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from nasplat.executors.base import Checkpoint
from nasplat.space import Config


@dataclass
class TrialRecord:
    """The engine's view of one trial."""

    trial_id: int
    config: Config
    parent_id: int | None = None
    status: str = "running"  # running | paused | completed | stopped | failed
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
        if self.max_trials is not None and not is_int(self.max_trials, 1):
            raise ValueError(f"`max_trials` must be an integer >= 1, got {self.max_trials!r}")
        if self.time_s is not None and (isinstance(self.time_s, bool) or not isinstance(self.time_s, (int, float))
                                        or not self.time_s > 0 or not math.isfinite(self.time_s)):
            raise ValueError(f"`time_budget_s` must be a number > 0, got {self.time_s!r}")
        if not is_int(self.max_steps, 1):
            raise ValueError(f"`max_steps` must be an integer >= 1, got {self.max_steps!r}")


class ExperimentFailed(RuntimeError):
    """More trials failed than `max_failed_trials` allows; the message sums up the first errors."""


def is_int(value: Any, low: int) -> bool:
    """Whether `value` is an integer >= `low` (a bool is not)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= low
