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

STEP, SAVES = "step", "saves"  # what a queued item is: a trial's step to run, an ended trial's saves to report


class LocalExecutor(Executor):
    """Runs trials in this process, one step at a time, interleaving up to `concurrency` trials. Checkpoints are
    written by one writer thread while the next steps run. A step runs in this thread and cannot be interrupted:
    `step_timeout_s` is not supported (use `processes` or `ray`).

    Besides the `Executor` calls, it offers the `processes` workers (`nasplat.executors.processes.worker`) and
    `simulated` what they need of it: `next_step`, `build`, `withdraw`, `fail_next_step`, `setup_failed`,
    `movable`, `copy_state`, `take_snapshot`; `t0` (a clock start shared with a driver) is given at construction.
    Its queue holds the trials' next steps and the ended trials' saves to report, in the order `wait` takes them;
    a subclass changes what queueing means by overriding `_queue_step` and `_queue_saves` (`simulated` runs the
    step at once on its clock)."""

    background_writes = True

    def __init__(self, concurrency: int = 1, *, t0: float | None = None) -> None:
        check_int("concurrency", concurrency, minimum=1)
        self.concurrency = concurrency
        self.hosts: dict[int, TrialHost] = {}
        self.snapshots: dict[int, Any] = {}  # trial id -> the copy `step(snapshot=True)` took
        self.kept: dict[int, Any] = {}
        self._queue: deque[tuple[str, int]] = deque()  # (STEP | SAVES, trial id), in the order `wait` takes them
        self.failed_setup: dict[int, str] = {}  # trial id -> the error its next step reports instead of running
        self.saves = SaveTracker()  # saves requested and not yet reported
        self.writer: CheckpointWriter | None = None
        self.node, self.pid = socket.gethostname(), os.getpid()
        self._t0 = t0

    def open(self, trainer: type, experiment: str, checkpoints: Storage | None = None) -> None:
        self.trainer_cls, self.experiment = trainer, experiment
        if checkpoints is not None:
            self.writer = CheckpointWriter(checkpoints, background=self.background_writes)
        self.t0 = time.perf_counter() if self._t0 is None else self._t0

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.hosts, self.snapshots = {}, {}

    def launch(self, trial_id: int, config: Config, seed: int, state: Any = None, inherit: bool = False) -> None:
        self.build(trial_id, config, seed, state, inherit)
        self.step(trial_id)

    def build(self, trial_id: int, config: Config, seed: int, state: Any = None, inherit: bool = False) -> None:
        """Host the trial (a fresh trainer, set up, loaded from `state`) without queueing a step: `launch` without
        its first step. A setup that fails is reported by the trial's next step."""
        host = self.hosts[trial_id] = TrialHost(self.trainer_cls, self.writer)
        self.snapshots.pop(trial_id, None)
        try:
            host.build(trial_id, config, WorkerContext(trial_id=trial_id, seed=seed), state, inherit)
        except Exception:  # noqa: BLE001 (the user's setup raised: its traceback is the first step's error)
            self.failed_setup[trial_id] = traceback.format_exc()

    def step(self, trial_id: int, snapshot: bool = False, save: int | None = None) -> None:
        host = self.hosts[trial_id]
        if trial_id not in self.failed_setup:
            try:
                if snapshot:
                    self.snapshots[trial_id] = host.copy()
            except Exception:  # noqa: BLE001 (the user's state_dict raised: the next step's error)
                self.failed_setup[trial_id] = traceback.format_exc()
        if save is not None:
            self._save(host, save)
        self._queue_step(trial_id)

    def _queue_step(self, trial_id: int) -> None:
        """The trial's next step is asked for: `wait` runs it in turn."""
        self._queue.append((STEP, trial_id))

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
        except Exception:  # noqa: BLE001 (the user's load or update_config raised: the next step's error)
            self.failed_setup[trial_id] = traceback.format_exc()
        self.snapshots.pop(trial_id, None)
        if save is not None:
            self._save(host, save)
        self._queue_step(trial_id)

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
            self._queue_saves(trial_id)

    def _queue_saves(self, trial_id: int) -> None:
        """Make a later `wait` report the ended trial's outstanding saves."""
        self._queue.append((SAVES, trial_id))

    # -- what the `processes` workers and `simulated` ask of the trials hosted here ---------------------------
    def next_step(self) -> int | None:
        """The trial whose step the next `wait` runs; None where it reports saves, or where nothing is queued."""
        if not self._queue:
            return None
        kind, trial_id = self._queue[0]
        return trial_id if kind == STEP else None

    def idle(self) -> bool:
        """Whether nothing is queued: `wait` has nothing to run or report."""
        return not self._queue

    def setup_failed(self, trial_id: int) -> bool:
        """Whether the trial's next step reports an error instead of running (its setup or state copy failed)."""
        return trial_id in self.failed_setup

    def fail_next_step(self, trial_id: int, error: str) -> None:
        """Make the trial's next step report `error` instead of running."""
        self.failed_setup[trial_id] = error

    def take_snapshot(self, trial_id: int) -> Any:
        """Hand over the copy the trial's latest `step(snapshot=True)` took (None: none was taken) and forget it."""
        return self.snapshots.pop(trial_id, None)

    def waiting(self) -> list[int]:
        """The trials whose steps are queued, the one to run last first."""
        return [trial_id for kind, trial_id in reversed(self._queue) if kind == STEP]

    def movable(self, trial_id: int) -> bool:
        """Whether the trial could go on elsewhere from a copy of its state: its step is queued, it is set up and
        owes no save."""
        host = self.hosts.get(trial_id)
        return host is not None and host.trainer is not None and not self.setup_failed(trial_id) \
            and not self.saves.owes(trial_id) and (STEP, trial_id) in self._queue

    def copy_state(self, trial_id: int) -> Any:
        """A copy of the trial's current state (its trainer's `state_dict`, detached)."""
        return self.hosts[trial_id].copy()

    def withdraw(self, trial_id: int) -> tuple[Config, int]:
        """Take the trial's queued step back and stop it here (it goes on elsewhere); its config and seed."""
        host = self.hosts[trial_id]
        config, seed = host.config, host.seed
        self._queue.remove((STEP, trial_id))
        self.stop(trial_id)
        return config, seed

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
            except Exception:  # noqa: BLE001 (the user's step raised: the step's error)
                error = traceback.format_exc()
            else:
                error = unpicklable(metrics)
                metrics = None if error is not None else metrics
        saved = self._saved(trial_id, wait=error is not None)  # a failed attempt reports all it saved
        return StepEvent(trial_id, metrics, error, begin, self.now(), self.node, self.pid, saved)

    def wait(self, timeout: float | None = None) -> list[StepEvent]:
        """Run the next queued step (or report an ended trial's saves) and return its event; a step is always
        ready to run here, so `timeout` changes nothing."""
        if not self._queue:
            raise RuntimeError("wait() called with no step running")
        kind, trial_id = self._queue.popleft()
        if kind == SAVES:
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
    except Exception as exc:  # noqa: BLE001 (whatever pickling raises is the step's error)
        return (f"the step's metrics cannot be pickled, so on `processes` they could not be sent from the worker "
                f"process: {type(exc).__name__}: {exc}")
    return None
