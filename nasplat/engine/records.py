"""The engine's records: one trial's state (and the row of one of its steps), the search budget, and the error that
ends a failing experiment."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nasplat.core.checks import check_int, check_real
from nasplat.core.rows import Status
from nasplat.executors.base import StepEvent
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

    def start(self) -> tuple[Any, int] | None:
        """The newest state the trial can go on from, with its step: an in-memory state (`restart`: an exploit's
        donor state, a paused trial's own) or its latest durable checkpoint, whichever is further (memory on a
        tie); None where it has neither."""
        memory, durable = self.restart, self.checkpoint
        if durable is not None and (memory is None or durable.step > memory[1]):
            return durable, durable.step
        return memory

    def seed(self, experiment_seed: int) -> int:
        """The seed of the trial's current attempt: a function of the experiment's seed, the trial and the attempt."""
        return int(np.random.SeedSequence([experiment_seed, self.trial_id, self.attempt]).generate_state(1)[0])

    def row(self, event: StepEvent, status: Status, step: int, metrics: dict[str, Any], *, clock_offset: float,
            error: str | None = None) -> dict[str, Any]:
        """The row of the trial's step `step`, which `event` reported: the `RESERVED` keys (its times on the
        experiment's clock: the executor's plus `clock_offset`), then `metrics`."""
        row: dict[str, Any] = {
            "trial_id": self.trial_id, "step": step, "attempt": self.attempt, "status": status,
            "config": self.config, "parent_id": self.parent_id, "donor_id": None,
            "start": clock_offset + event.start, "end": clock_offset + event.end,
            "node": event.node, "pid": event.pid, "error": error,
        }
        row.update(metrics)
        return row


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

    def deadline(self, start: float) -> float | None:
        """When (on the experiment's clock) the trials still running are stopped and left running in the record,
        for `nasplat resume`: `grace_s` after the time budget, or after `start` (the run's start) where that is later
        (a resume); None without a time budget."""
        grace = self.grace_s
        if grace is None or self.time_s is None:
            return None
        return max(self.time_s, start) + grace


class ExperimentFailed(RuntimeError):
    """More trials failed than `max_failed_trials` allows; the message sums up the first errors."""
