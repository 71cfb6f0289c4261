"""The in-process `local` executor (wall clock); `nasplat.executors.simulated` builds the `simulated` one on it."""

from __future__ import annotations

import copy
import os
import socket
import time
import traceback
from collections import deque
from typing import Any

from nasplat.executors.base import Checkpoint, Executor, StepEvent
from nasplat.space import Config
from nasplat.trainer import Trainer, WorkerContext, start


class LocalExecutor(Executor):
    """Runs trials in this process, one step at a time, interleaving up to `concurrency` trials."""

    def __init__(self, concurrency: int = 1) -> None:
        if not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"`concurrency` must be an integer >= 1, got {concurrency=!r}")
        self.concurrency = concurrency
        self.trainers: dict[int, Trainer] = {}
        self.kept: dict[int, Any] = {}
        self.queue: deque[int] = deque()
        self.failed_setup: dict[int, str] = {}
        self.saves: list[Checkpoint] = []  # requested saves not yet reported
        self.node, self.pid = socket.gethostname(), os.getpid()

    def open(self, trainer: type, experiment: str, checkpoints: Any = None) -> None:
        self.trainer_cls, self.experiment, self.checkpoints = trainer, experiment, checkpoints
        self.t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def launch(self, trial_id: int, config: Config, seed: int, state: Any = None, inherit: bool = False) -> None:
        try:
            trainer = start(self.trainer_cls(), config, WorkerContext(trial_id=trial_id, seed=seed))
            if state is not None:
                load = trainer.inherit_state if inherit else trainer.load_state_dict
                load(copy.deepcopy(state))
            self.trainers[trial_id] = trainer
        except Exception:
            self.failed_setup[trial_id] = traceback.format_exc()
        self.step(trial_id)

    def step(self, trial_id: int, snapshot: bool = False, save: int | None = None) -> None:
        self._save(trial_id, save)
        self.queue.append(trial_id)

    def _save(self, trial_id: int, step: int | None) -> None:
        if step is not None:
            self.saves.append(Checkpoint(trial_id, step, None, "this executor does not write checkpoints yet"))

    def exploit(self, trial_id: int, donor_id: int, config: Config, save: int | None = None,
                fallback: Checkpoint | None = None) -> Any:
        trainer = self.trainers[trial_id]
        state = copy.deepcopy(self.trainers[donor_id].state_dict())
        try:
            trainer.load_state_dict(copy.deepcopy(state))
            trainer.update_config(config)
            trainer.config = config
        except Exception:
            self.failed_setup[trial_id] = traceback.format_exc()
        self.step(trial_id, save=save)
        return state

    def stop(self, trial_id: int, keep_state: bool = False, save: int | None = None) -> None:
        self._save(trial_id, save)
        trainer = self.trainers.pop(trial_id, None)
        if keep_state and trainer is not None:
            self.kept[trial_id] = copy.deepcopy(trainer.state_dict())

    def run_step(self, trial_id: int) -> StepEvent:
        begin = self.now()
        error = self.failed_setup.pop(trial_id, None)
        metrics = None
        if error is None:
            try:
                metrics = dict(self.trainers[trial_id].step())
            except Exception:
                error = traceback.format_exc()
        return StepEvent(trial_id, metrics, error, begin, self.now(), self.node, self.pid)

    def wait(self) -> list[StepEvent]:
        if self.saves:
            saves, self.saves = self.saves, []
            return [StepEvent(c.trial_id, None, None, self.now(), self.now(), saved=(c,)) for c in saves]
        if not self.queue:
            raise RuntimeError("wait() called with no step running")
        return [self.run_step(self.queue.popleft())]

