"""The in-process `local` executor (wall clock); `nasplat.executors.simulated` builds the `simulated` one on it."""

from __future__ import annotations

import os
import pickle
import socket
import time
import traceback
from collections import deque
from typing import Any

from nasplat.core.checks import check_int
from nasplat.executors.base import Executor, StepEvent
from nasplat.executors.host import TrialHost
from nasplat.executors.saves import SaveTracker
from nasplat.space import Config
from nasplat.storage import Storage
from nasplat.storage.checkpoints import Checkpoint, CheckpointWriter
from nasplat.trainer import WorkerContext


class LocalExecutor(Executor):
    """Runs trials in this process, one step at a time, interleaving up to `concurrency` trials. Checkpoints are
    written by one writer thread while the next steps run. A step runs in this thread and cannot be interrupted:
    `step_timeout_s` is not supported (use `processes` or `ray`)."""

    background_writes = True

    def __init__(self, concurrency: int = 1) -> None:
        check_int("concurrency", concurrency, minimum=1)
        self.concurrency = concurrency
        self.hosts: dict[int, TrialHost] = {}
        self.snapshots: dict[int, Any] = {}  # trial id -> the copy `step(snapshot=True)` took
        self.kept: dict[int, Any] = {}
        self.queue: deque[tuple[str, int]] = deque()  # ("step" | "saves", trial id)
        self.failed_setup: dict[int, str] = {}
        self.saves = SaveTracker()  # saves requested and not yet reported
        self.writer: CheckpointWriter | None = None
        self.node, self.pid = socket.gethostname(), os.getpid()

    def open(self, trainer: type, experiment: str, checkpoints: Storage | None = None) -> None:
        self.trainer_cls, self.experiment = trainer, experiment
        if checkpoints is not None:
            self.writer = CheckpointWriter(checkpoints, background=self.background_writes)
        self.t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.hosts, self.snapshots = {}, {}

    def launch(self, trial_id: int, config: Config, seed: int, state: Any = None, inherit: bool = False) -> None:
        host = self.hosts[trial_id] = TrialHost(self.trainer_cls, self.writer)
        self.snapshots.pop(trial_id, None)
        try:
            host.build(trial_id, config, WorkerContext(trial_id=trial_id, seed=seed), state, inherit)
        except Exception:
            self.failed_setup[trial_id] = traceback.format_exc()
        self.step(trial_id)

    def step(self, trial_id: int, snapshot: bool = False, save: int | None = None) -> None:
        host = self.hosts[trial_id]
        if trial_id not in self.failed_setup:
            try:
                if snapshot:
                    self.snapshots[trial_id] = host.copy()
            except Exception:
                self.failed_setup[trial_id] = traceback.format_exc()
        if save is not None:
            self._save(host, save)
        self._enqueue(trial_id)

    def _enqueue(self, trial_id: int) -> None:
        self.queue.append(("step", trial_id))

    def _save(self, host: TrialHost, step: int) -> None:
        if self.writer is None:
            raise RuntimeError("a save was requested from an executor opened without checkpoint storage")
        self.saves.request(host.trial_id, step)
        host.save(step)

    def exploit(self, trial_id: int, donor_id: int, config: Config, save: int | None = None,
                fallback: Checkpoint | None = None) -> Any:
        state = self.exploit_state(donor_id, fallback)
        self.adopt(trial_id, state, config, save, fallback)
        return state

    def exploit_state(self, donor_id: int, fallback: Checkpoint | None = None) -> Any:
        """What an exploit of `donor_id` copies: its latest snapshot, else its current state (`donor_state`)."""
        state = self.snapshots.get(donor_id)
        return self.donor_state(donor_id, fallback) if state is None else state

    def adopt(self, trial_id: int, state: Any, config: Config, save: int | None = None,
              fallback: Checkpoint | None = None) -> None:
        """The second half of `exploit`: load a donor's `state` into the trial, put `config` in effect, (with
        `save=k`, checkpoint it as step k,) queue its next step."""
        host = self.hosts[trial_id]
        try:
            host.exploit(state, config, fallback)
        except Exception:
            self.failed_setup[trial_id] = traceback.format_exc()
        self.snapshots.pop(trial_id, None)
        if save is not None:
            self._save(host, save)
        self._enqueue(trial_id)

    def donor_state(self, donor_id: int, fallback: Checkpoint | None) -> Any:
        """A donor's current state: of its trainer, else kept from its end, else its durable `fallback`."""
        donor = self.hosts.get(donor_id)
        if donor is not None and donor.trainer is not None:
            return donor.copy()
        state = self.kept.get(donor_id)
        return fallback if state is None else state

    def stop(self, trial_id: int, keep_state: bool = False, save: int | None = None) -> None:
        host = self.hosts.pop(trial_id, None)
        self.snapshots.pop(trial_id, None)
        if host is None:
            return
        if keep_state and host.trainer is not None:
            self.kept[trial_id] = host.copy()
        if save is not None:
            self._save(host, save)
        if self.saves.owes(trial_id):
            self._report_saves(trial_id)

    def _report_saves(self, trial_id: int) -> None:
        """Make a later `wait` report the ended trial's outstanding saves."""
        self.queue.append(("saves", trial_id))

    def _saved(self, trial_id: int, *, wait: bool) -> tuple[Checkpoint, ...]:
        if self.writer is None:
            return ()
        return self.saves.report(self.writer.collect(trial_id, wait=wait))

    def run_step(self, trial_id: int) -> StepEvent:
        begin = self.now()
        error = self.failed_setup.pop(trial_id, None)
        metrics = None
        if error is None:
            try:
                metrics = self.hosts[trial_id].step()
            except Exception:
                error = traceback.format_exc()
            else:
                error = unpicklable(metrics)
                metrics = None if error is not None else metrics
        saved = self._saved(trial_id, wait=error is not None)  # a failed attempt reports all it saved
        return StepEvent(trial_id, metrics, error, begin, self.now(), self.node, self.pid, saved)

    def wait(self, timeout: float | None = None) -> list[StepEvent]:
        """Run the next queued step (or report an ended trial's saves) and return its event; a step is always
        ready to run here, so `timeout` changes nothing."""
        if not self.queue:
            raise RuntimeError("wait() called with no step running")
        kind, trial_id = self.queue.popleft()
        if kind == "saves":
            now = self.now()
            return [StepEvent(trial_id, None, None, now, now, self.node, self.pid,
                              self._saved(trial_id, wait=True))]
        return [self.run_step(trial_id)]


def unpicklable(metrics: Any) -> str | None:
    """The step's error where its metrics cannot be pickled, else None. `processes` and `ray` send them from a
    worker process, so they must pickle in-process too: such a step fails with the same error as on `processes`,
    and is retried like any failed step (`max_failures`)."""
    try:
        pickle.dumps(metrics, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # noqa: BLE001 - whatever pickling raises is the step's error
        return (f"the step's metrics cannot be pickled, so on `processes` they could not be sent from the worker "
                f"process: {type(exc).__name__}: {exc}")
    return None
