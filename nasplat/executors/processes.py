"""The `processes` executor: trials in worker processes forked from the driver, on every core of this machine."""

from __future__ import annotations

import importlib
import multiprocessing
import os
import pickle
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Any

from nasplat.core.checks import check_int, is_int
from nasplat.executors.base import Executor, StepEvent
from nasplat.executors.messages import (
    Adopt,
    Close,
    ExploitState,
    Keep,
    Launch,
    Request,
    Step,
    Stop,
)
from nasplat.executors.process_child import ActivitySlot
from nasplat.executors.process_pool import Pending, PoolMixin, Worker
from nasplat.executors.process_trials import TrialCopies
from nasplat.executors.process_worker import serve
from nasplat.executors.saves import SaveTracker
from nasplat.space import Config
from nasplat.storage import Storage
from nasplat.storage.checkpoints import Checkpoint


class ProcessExecutor(PoolMixin, Executor):
    """Runs trials in `processes` worker processes forked from the driver (default: one per core, at most
    `concurrency`), each with `threads` torch threads (default: the cores shared out among them).

    Each worker hosts its trials in a `LocalExecutor` of its own and steps them in turn, so a forked worker starts
    in milliseconds with whatever the driver had imported and loaded (torch, a dataset; with torch, the driver first
    imports the `torch._dynamo` every optimizer loads when first built): no Ray, no actor start-up, no import per
    trial. A trial stays on the worker that launched it, except that where one worker has no step to run while
    another has steps waiting, one of those trials moves over with its state between two steps (its trainer is built
    anew there, as on a retry: a trainer's own random streams restart from its seed). States move through the
    driver: a worker sends a trial's snapshot (`step(snapshot=True)`) as it reads that step, and an exploit copies the
    donor's latest asked-for snapshot, waiting (at most for the step its worker is running) if it has not come yet;
    without one, it waits for the donor's state after its running step.

    A worker dies with its driver, whatever kills the driver, and holds none of the driver's files open for writing
    (`nasplat.executors.process_child.detach`): a killed driver's folder is taken over by `nasplat resume` at once.
    With `step_timeout_s`, a worker whose user code (a setup, a step, a state copy) runs longer is killed and that
    trial's step fails ("step timed out after N s"). A worker that dies (killed, crashed, timed out) fails the step
    of the trial whose code was running in it alone; its other trials are relaunched on a live worker from the
    newest state the driver holds, uncharged (`nasplat.executors.process_trials`); the saves it still owed fail.
    A worker does not write into files the driver opened for writing: a trainer that logs to a file opens its own.
    """

    supports_step_timeout = True

    def __init__(self, concurrency: int = 1, *, processes: int | None = None, threads: int | None = None) -> None:
        check_int("concurrency", concurrency, minimum=1)
        if processes is not None:
            check_int("processes", processes, minimum=1, note="worker processes")
        if threads is not None and (not is_int(threads) or threads < 1):  # the exact line tests pin: no hint
            raise ValueError(f"`threads` must be an integer >= 1 (torch threads per worker), got {threads=!r}")
        cores = len(os.sched_getaffinity(0))
        workers = min(concurrency, cores) if processes is None else processes
        self.concurrency, self.workers = concurrency, workers
        self.threads = threads if threads is not None else max(1, cores // workers)
        self.kept: dict[int, Any] = {}  # a `Pending` until its worker replies
        self.pool: list[Worker] = []
        self.where: dict[int, Worker] = {}  # trial id -> the worker hosting it
        self.copies = TrialCopies()  # what the driver needs to host a trial again elsewhere
        self.saves = SaveTracker()  # saves requested and not yet reported
        self.ended_on: dict[int, Worker] = {}  # stopped trial id -> the worker that still owes its saves
        self.running: set[int] = set()  # trials with a step started and not yet reported
        self.snapshots: dict[int, Any] = {}  # trial id -> the state its worker sent at its latest `snapshot` step
        self.in_flight: dict[int, int] = {}  # trial id -> snapshots asked for that its worker has not sent yet
        self.ready: list[StepEvent] = []  # events received while the driver waited for a reply
        self.closing = False

    def open(self, trainer: type, experiment: str, checkpoints: Storage | None = None) -> None:
        self.trainer_cls, self.checkpoints = trainer, checkpoints
        self.t0 = time.perf_counter()  # CLOCK_MONOTONIC: the workers' clocks read the same
        if "torch" in sys.modules:  # every torch optimizer imports it when first built (~1 s): once, not per worker
            importlib.import_module("torch._dynamo")
        self.closing = False
        self._replace_dead()

    def _fork(self) -> Worker:
        """A new worker; it lets go of the driver's ends of every pipe (its own and the live workers')."""
        driver_end, worker_end = multiprocessing.Pipe()
        slot = ActivitySlot()
        inherited = [driver_end.fileno()] + [w.conn.fileno() for w in self.pool if not w.conn.closed]
        process = multiprocessing.get_context("fork").Process(
            target=serve, name="nasplat-worker", daemon=True,
            args=(worker_end, self.trainer_cls, self.checkpoints, self.t0, self.threads, slot, os.getpid(),
                  tuple(inherited)))
        process.start()
        worker_end.close()
        return Worker(process, driver_end, slot)

    def _replace_dead(self) -> None:
        """Drop the dead workers from the pool and fork new ones in their place."""
        self.pool = [w for w in self.pool if w.alive]
        while len(self.pool) < self.workers:
            self.pool.append(self._fork())

    def now(self) -> float:
        return time.perf_counter() - self.t0

    # -- trials ------------------------------------------------------------------------------------
    def launch(self, trial_id: int, config: Config, seed: int, state: Any = None, inherit: bool = False) -> None:
        if any(not w.alive for w in self.pool) or len(self.pool) < self.workers:
            self._replace_dead()
        worker = self._least_loaded()
        worker.trials.add(trial_id)
        self.where[trial_id] = worker
        self.snapshots.pop(trial_id, None)
        self.in_flight.pop(trial_id, None)
        self.copies.launched(trial_id, config, seed, state, inherit)
        self._send(trial_id, Launch(trial_id, config, seed, state, inherit))

    def step(self, trial_id: int, snapshot: bool = False, save: int | None = None) -> None:
        self._owe(trial_id, save)
        if snapshot:
            self.in_flight[trial_id] = self.in_flight.get(trial_id, 0) + 1
        self.copies.stepped(trial_id, snapshot, save)
        self._send(trial_id, Step(trial_id, snapshot, save))

    def exploit(self, trial_id: int, donor_id: int, config: Config, save: int | None = None,
                fallback: Checkpoint | None = None) -> Any:
        if (donor := self.where.get(donor_id)) is not None:  # the snapshots its worker sent so far
            self._drain(donor)
        while (donor := self.where.get(donor_id)) is not None and self.in_flight.get(donor_id):
            self._receive(donor)  # it takes a snapshot as it reads the step: within the step it is running
        state = self.snapshots.get(donor_id)
        if state is None and (donor := self.where.get(donor_id)) is not None:  # its state once its step ran
            state = self._ask(donor, ExploitState(donor_id, fallback))
            sent = self.snapshots.get(donor_id)
            state = state if sent is None else sent  # a snapshot sent before the reply comes first
        if state is None:
            state = self._resolved(donor_id)
        if state is None:
            state = fallback
        self.snapshots.pop(trial_id, None)
        self._owe(trial_id, save)
        self.copies.exploited(trial_id, state, config, save)
        self._send(trial_id, Adopt(trial_id, state, config, save, fallback))
        return state

    def stop(self, trial_id: int, keep_state: bool = False, save: int | None = None) -> None:
        self.snapshots.pop(trial_id, None)
        self.in_flight.pop(trial_id, None)
        self.running.discard(trial_id)  # a step still running is abandoned
        self.copies.forget(trial_id)
        worker = self.where.pop(trial_id, None)
        if worker is None:
            return
        worker.trials.discard(trial_id)
        self._owe(trial_id, save)
        if keep_state:  # the state comes with the worker's reply; `kept_state` waits for it if asked first
            pending = self.kept[trial_id] = Pending(worker)
            self._ask_later(worker, Keep(trial_id, save), lambda state: self._keep(trial_id, pending, state))
        elif worker.alive:
            self._write(worker, Stop(trial_id, save))
        if not worker.alive and self.saves.owes(trial_id):
            self.ready.append(self._lost(trial_id, worker.process.pid, error=None))
        elif self.saves.owes(trial_id):
            self.ended_on[trial_id] = worker

    def _keep(self, trial_id: int, pending: Pending, state: Any) -> None:
        if self.kept.get(trial_id) is pending:  # not dropped meanwhile
            if state is None:
                del self.kept[trial_id]
            else:
                self.kept[trial_id] = state

    def _resolved(self, trial_id: int) -> Any:
        """The state kept for the trial, once its worker's reply came (None if there is none)."""
        while isinstance(state := self.kept.get(trial_id), Pending):
            self._receive(state.worker)
        return state

    def kept_state(self, trial_id: int) -> Any:
        return self._resolved(trial_id)

    def take_kept(self, trial_id: int) -> Any:
        state = self._resolved(trial_id)
        self.kept.pop(trial_id, None)
        return state

    def _owe(self, trial_id: int, save: int | None) -> None:
        if save is not None:
            self.saves.request(trial_id, save)

    # -- messages --------------------------------------------------------------------------------
    def _send(self, trial_id: int, message: Request) -> None:
        worker = self.where.get(trial_id)  # a live worker: `_died` takes a dead one's trials out of `where`
        if worker is not None:
            self.running.add(trial_id)
            self._write(worker, message)  # if the worker died, `_died` relaunched this trial or failed its step
        elif self.saves.owes(trial_id):  # its worker died while the driver waited on it: the saves asked since fail
            self.ready.append(self._lost(trial_id, 0, error=None))

    def _write(self, worker: Worker, message: Request) -> None:
        try:
            worker.conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
        except OSError:
            self._died(worker)

    def _ask_later(self, worker: Worker, message: Request, answer: Callable[[Any], None]) -> None:
        """Send `message`; `answer` gets the worker's reply when it comes (None if the worker dies first)."""
        if not worker.alive:
            answer(None)
            return
        worker.asks.append(answer)
        self._write(worker, message)

    def _ask(self, worker: Worker, message: Request) -> Any:
        """Send `message` and wait for the worker's reply (None if the worker died); events that arrive first are
        kept for `wait`."""
        box: list[Any] = []
        self._ask_later(worker, message, box.append)
        while not box and worker.alive:
            self._receive(worker)
        return box[0] if box else None

    def wait(self, timeout: float | None = None) -> list[StepEvent]:
        """Every step event and save report that came (at least one), the steps past `step_timeout_s` failed, or
        [] once `timeout` seconds passed with none."""
        begin = self.now()
        if not self.ready:
            self._balance()
        while not self.ready:
            live = {w.conn: w for w in self.pool if w.alive}
            if not self.running and not self.saves.owes() or not live:
                raise RuntimeError("wait() called with no step running")
            wakes = [wake for w in live.values() if (wake := self._wake(w)) is not None]
            if timeout is not None:
                wakes.append(max(0.0, begin + timeout - self.now()))
            for conn in wait(list(live), timeout=min(wakes) if wakes else None):
                self._drain(live[conn])
            for worker in live.values():
                self._expire(worker)
            if timeout is not None and self.now() - begin >= timeout:
                break
        events, self.ready = self.ready, []
        return events

    def close(self) -> None:
        """End every worker: `Close` first, then a kill for one still running a step (abandoned) or slow to end."""
        self.closing = True
        for worker in self.pool:
            if worker.alive:
                self._write(worker, Close())
        end = time.monotonic() + 10
        for worker in self.pool:
            if self._abandoned(worker):
                worker.process.kill()
            worker.process.join(timeout=max(0.0, end - time.monotonic()))
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()
            worker.conn.close()
            worker.alive = False
            while worker.asks:  # states kept but not sent: none
                worker.asks.popleft()(None)
        self.pool, self.where = [], {}
