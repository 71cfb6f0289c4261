"""Answers from the record: a deterministic trainer's config already evaluated is not run again.

A trainer class that declares `deterministic = True` (`nasplat.trainer.Trainer.deterministic`) reports what its
config alone decides. Once a trial of such a trainer has completed, a later trial with an equal config (a duplicate
a controller proposed: evolution's mutations, a small space) is answered step by step from the completed trial's
recorded metrics instead of running on the executor. The answered trial is a trial like any other: the controller
proposed it, it counts against `max_trials`, its rows reach the controller (and its scheduler: a `Stop` or `Pause`
applies as it would have) and the record in the same order, so the search takes the same decisions as if it had
run. Its rows carry `cached_from: <source trial id>`, start and end at the moment they were answered, and cost no
executor time (on `simulated`, no simulated seconds either). It has no checkpoint: it needs no state.

The source is the first trial in the record's order that completed with that config; replaying the record
(`nasplat resume`) rebuilds the same table, so a resumed run answers the same trials from the same sources.
Searches whose members exploit one another (`min_concurrency > 1`, PBT) copy states, which an answer has none
of: they run every trial.
"""

from __future__ import annotations

import json
from collections import deque
from typing import Any

from nasplat.engine.records import TrialRecord
from nasplat.executors.base import StepEvent
from nasplat.space import Config


def config_key(config: Config) -> str | None:
    """A config as a hashable key (its JSON with sorted keys, as the record stores it); None where it has values
    JSON cannot hold (live objects): such a config is never answered from the record."""
    try:
        return json.dumps(config, sort_keys=True, allow_nan=True)
    except (TypeError, ValueError):
        return None


class RecordedAnswers:
    """The metrics of each step of every completed trial of a deterministic trainer, by config (the first trial
    to complete each), which trials are being answered from which source, and the steps answered and not yet
    handled (`pending`: the engine takes them as it takes the executor's events)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._steps: dict[int, list[dict[str, Any]]] = {}  # running trial -> its metrics of steps 1, 2, ...
        self._first: dict[str, int] = {}  # config key -> the first trial that completed with it
        self._sources: dict[int, tuple[dict[str, Any], ...]] = {}  # such a trial -> its metrics of each step
        self.answering: dict[int, int] = {}  # trial answered from the record -> its source trial
        self.pending: deque[StepEvent] = deque()

    def observe(self, trial_id: int, step: int, metrics: dict[str, Any]) -> None:
        """A step's metrics were recorded for the trial (a retried attempt starts again at an earlier step)."""
        if not self.enabled:
            return
        steps = self._steps.setdefault(trial_id, [])
        del steps[step - 1:]
        if len(steps) == step - 1:
            steps.append(metrics)

    def ended(self, trial_id: int, config: Config, completed: bool) -> None:
        """The trial ended; if it completed, its steps answer later trials of an equal config (unless an earlier
        one already does)."""
        steps = self._steps.pop(trial_id, None)
        self.answering.pop(trial_id, None)
        if not completed or not steps or (key := config_key(config)) is None:
            return
        if key not in self._first:
            self._first[key] = trial_id
            self._sources[trial_id] = tuple(steps)

    def source(self, trial_id: int, config: Config) -> int | None:
        """The trial that answers `trial_id` (already answering it, or the first completed with an equal config),
        or None: it runs on the executor."""
        if not self.enabled:
            return None
        if trial_id in self.answering:
            return self.answering[trial_id]
        key = config_key(config)
        found = self._first.get(key) if key is not None else None
        if found is not None:
            self.answering[trial_id] = found
        return found

    def answered_from(self, trial_id: int, source: int) -> None:
        """A row read back from the record says the trial was answered from `source` (a resume)."""
        if self.enabled:
            self.answering[trial_id] = source

    def metrics(self, trial_id: int, step: int) -> dict[str, Any] | None:
        """The metrics that answer the trial's step `step` (from 1), or None where its source recorded no such
        step."""
        steps = self._sources.get(self.answering.get(trial_id, -1), ())
        return dict(steps[step - 1]) if 0 < step <= len(steps) else None

    def answer_next(self, record: TrialRecord, now: float) -> bool:
        """Answer the trial's next step from the record into `pending` (an event at `now` on the executor's clock),
        if a completed trial of an equal config can: a new trial from its first step, one already answered (then
        paused) from where it stands. False where it must run on the executor."""
        answering = record.trial_id in self.answering
        if self.source(record.trial_id, record.config) is None:
            return False
        step = record.step + 1 if answering else 1
        metrics = self.metrics(record.trial_id, step)
        if metrics is None:  # its source recorded no such step: it runs (from the start)
            self.answering.pop(record.trial_id, None)
            return False
        record.step = step - 1
        self.pending.append(StepEvent(record.trial_id, metrics, None, now, now))
        return True
