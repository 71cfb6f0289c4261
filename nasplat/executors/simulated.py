"""The `simulated` executor: virtual workers on a simulated clock driven by the cost each step reports."""

from __future__ import annotations

import heapq
from typing import Any

from nasplat.executors.base import StepEvent
from nasplat.executors.local import LocalExecutor
from nasplat.storage import Storage
from nasplat.storage.checkpoints import Checkpoint


class SimulatedExecutor(LocalExecutor):
    """`concurrency` virtual workers on a simulated clock.

    A step is computed in this process when it is dispatched (its cost, `metrics[cost_key]` simulated seconds, is
    only known then), but its result is released only when the clock reaches its end: `wait` returns steps in order
    of finishing time (ties: in dispatch order), so asynchrony is modelled exactly and deterministically. A state
    read at time t (a PBT exploit of a trial whose step is running, a pause) is the state as of that trial's last
    step finished by t: the state a trial had when its running step was dispatched is kept until the step ends.
    Checkpoints are written at once, in this thread. The clock is simulated (`virtual_clock`): no wall-clock
    deadline applies, and `step_timeout_s` is not supported. A trainer whose step does not report `cost_key` at all
    cannot run here: that step ends the run with a ValueError before another starts (a cost that is there but not
    a finite number > 0 fails that trial only).
    """

    background_writes = False
    virtual_clock = True

    def __init__(self, concurrency: int = 1, *, cost_key: str = "time_cost") -> None:
        super().__init__(concurrency)
        self.cost_key = cost_key
        self.clock = 0.0
        self.heap: list[tuple[float, int, StepEvent]] = []
        self.sequence = 0
        self.settled: dict[int, Any] = {}  # trial with a step running -> its state before that step (if it has one)

    def open(self, trainer: type, experiment: str, checkpoints: Storage | None = None) -> None:
        super().open(trainer, experiment, checkpoints)
        self.clock = 0.0

    def now(self) -> float:
        return self.clock

    def _settle(self, trial_id: int) -> None:
        """Keep the trial's state as it is before the step about to run (trainers without `state_dict` have none
        that can be read)."""
        host = self.hosts.get(trial_id)
        if host is None or host.trainer is None or trial_id in self.failed_setup:
            return
        try:
            self.settled[trial_id] = host.copy()
        except NotImplementedError:
            pass

    def donor_state(self, donor_id: int, fallback: Checkpoint | None) -> Any:
        """The donor's state as of its last step finished by now."""
        if donor_id in self.settled:
            return self.settled[donor_id]
        return super().donor_state(donor_id, fallback)

    def stop(self, trial_id: int, keep_state: bool = False, save: int | None = None) -> None:
        settled = self.settled.pop(trial_id, None)
        super().stop(trial_id, keep_state=keep_state and settled is None, save=save)
        if keep_state and settled is not None:
            self.kept[trial_id] = settled

    def _enqueue(self, trial_id: int) -> None:
        self._settle(trial_id)
        event = self.run_step(trial_id)
        cost = 0.0
        if isinstance(event.metrics, dict) and self.cost_key not in event.metrics:  # no trial could run: end now
            raise ValueError(f"the simulated executor needs every step to report {self.cost_key!r} (simulated seconds "
                             f"of the step, a finite number > 0); trial {trial_id}'s step reported "
                             f"{sorted(map(str, event.metrics))}: return it from step(), or use another executor")
        if event.metrics is not None:
            try:
                cost = float(event.metrics[self.cost_key])
                if not cost > 0 or cost == float("inf"):
                    raise ValueError
            except (KeyError, TypeError, ValueError, OverflowError):
                event = StepEvent(trial_id, None, f"the simulated executor needs a finite {self.cost_key!r} metric > 0 "
                                  f"(simulated seconds of the step), got {event.metrics.get(self.cost_key)!r}",
                                  event.start, event.end, saved=event.saved)
                cost = 0.0
        self._push(cost, StepEvent(trial_id, event.metrics, event.error, self.clock, 0.0, event.node, event.pid,
                                   event.saved))

    def _report_saves(self, trial_id: int) -> None:
        self._push(0.0, StepEvent(trial_id, None, None, self.clock, 0.0, self.node, self.pid,
                                  self._saved(trial_id, wait=True)))

    def _push(self, cost: float, event: StepEvent) -> None:
        finish = self.clock + cost
        event = StepEvent(event.trial_id, event.metrics, event.error, event.start, finish, event.node, event.pid,
                          event.saved)
        heapq.heappush(self.heap, (finish, self.sequence, event))
        self.sequence += 1

    def wait(self, timeout: float | None = None) -> list[StepEvent]:
        """Advance the clock to the next step's end and return it; `timeout` (wall seconds) does not apply to a
        simulated clock."""
        if not self.heap:
            raise RuntimeError("wait() called with no step running")
        finish, _, event = heapq.heappop(self.heap)
        self.clock = finish
        if event.trial_id in self.hosts and (event.metrics is not None or event.error is not None):
            self.settled.pop(event.trial_id, None)
        return [event]
