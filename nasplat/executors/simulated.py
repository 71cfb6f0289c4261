"""The `simulated` executor: virtual workers on a simulated clock driven by the cost each step reports."""

from __future__ import annotations

import copy
import heapq
import traceback
from typing import Any

from nasplat.executors.base import Checkpoint, StepEvent
from nasplat.executors.local import LocalExecutor
from nasplat.space import Config


class SimulatedExecutor(LocalExecutor):
    """`concurrency` virtual workers on a simulated clock.

    A step is computed in this process when it is dispatched (its cost, `metrics[cost_key]` simulated seconds, is
    only known then), but its result is released only when the clock reaches its end: `wait` returns steps in order
    of finishing time (ties: in dispatch order), so asynchrony is modelled exactly and deterministically. A state
    read at time t (a PBT exploit of a trial whose step is running, a pause) is the state as of that trial's last
    step finished by t: the state a trial had when its running step was dispatched is kept until the step ends.
    """

    def __init__(self, concurrency: int = 1, *, cost_key: str = "time_cost") -> None:
        super().__init__(concurrency)
        self.cost_key = cost_key
        self.clock = 0.0
        self.heap: list[tuple[float, int, StepEvent]] = []
        self.sequence = 0
        self.settled: dict[int, Any] = {}  # trial with a step running -> its state before that step (if it has one)

    def open(self, trainer: type, experiment: str, checkpoints: Any = None) -> None:
        super().open(trainer, experiment, checkpoints)
        self.clock = 0.0

    def now(self) -> float:
        return self.clock

    def step(self, trial_id: int, snapshot: bool = False, save: int | None = None) -> None:
        self._save(trial_id, save)
        self._settle(trial_id)
        event = self.run_step(trial_id)
        cost = 0.0
        if event.metrics is not None:
            try:
                cost = float(event.metrics[self.cost_key])
                if not cost > 0 or cost == float("inf"):
                    raise ValueError
            except (KeyError, TypeError, ValueError, OverflowError):
                event = StepEvent(trial_id, None, f"the simulated executor needs a finite {self.cost_key!r} metric > 0 "
                                  f"(simulated seconds of the step), got {event.metrics.get(self.cost_key)!r}",
                                  event.start, event.end)
                cost = 0.0
        finish = self.clock + cost
        event = StepEvent(trial_id, event.metrics, event.error, self.clock, finish, event.node, event.pid)
        heapq.heappush(self.heap, (finish, self.sequence, event))
        self.sequence += 1

    def _settle(self, trial_id: int) -> None:
        """Keep the trial's state as it is before the step about to run (trainers without `state_dict` have none
        that can be read)."""
        trainer = self.trainers.get(trial_id)
        if trainer is None or trial_id in self.failed_setup:
            return
        try:
            self.settled[trial_id] = copy.deepcopy(trainer.state_dict())
        except NotImplementedError:
            pass

    def state_now(self, trial_id: int) -> Any:
        """The trial's state as of its last step finished by now."""
        if trial_id in self.settled:
            return self.settled[trial_id]
        return self.trainers[trial_id].state_dict()

    def exploit(self, trial_id: int, donor_id: int, config: Config, save: int | None = None,
                fallback: Checkpoint | None = None) -> Any:
        state = copy.deepcopy(self.state_now(donor_id))
        trainer = self.trainers[trial_id]
        try:
            trainer.load_state_dict(copy.deepcopy(state))
            trainer.update_config(config)
            trainer.config = config
        except Exception:
            self.failed_setup[trial_id] = traceback.format_exc()
        self.step(trial_id, save=save)
        return state

    def stop(self, trial_id: int, keep_state: bool = False, save: int | None = None) -> None:
        settled = self.settled.pop(trial_id, None)
        super().stop(trial_id, keep_state=keep_state and settled is None, save=save)
        if keep_state and settled is not None:
            self.kept[trial_id] = settled

    def wait(self) -> list[StepEvent]:
        if self.saves:
            return super().wait()
        if not self.heap:
            raise RuntimeError("wait() called with no step running")
        finish, _, event = heapq.heappop(self.heap)
        self.clock = finish
        if event.trial_id in self.trainers:
            self.settled.pop(event.trial_id, None)
        return [event]
