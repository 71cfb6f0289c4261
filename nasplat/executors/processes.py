"""The `processes` executor: trials in worker processes forked from the driver, on every core of this machine."""

from __future__ import annotations

import importlib
import multiprocessing
import os
import pickle
import sys
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from nasplat.core.checks import check_int, is_int
from nasplat.executors.base import Executor, StepEvent
from nasplat.executors.messages import (
    Adopt,
    Close,
    Crash,
    Event,
    ExploitState,
    Give,
    Given,
    Keep,
    Launch,
    Message,
    Reply,
    Request,
    Snapshot,
    Step,
    Stop,
)
from nasplat.executors.process_worker import serve
from nasplat.executors.saves import SaveTracker
from nasplat.space import Config
from nasplat.storage import Storage
from nasplat.storage.checkpoints import Checkpoint


@dataclass
class _Worker:
    """One forked worker process and the trials it hosts."""

    process: multiprocessing.process.BaseProcess
    conn: Connection
    trials: set[int] = field(default_factory=set)
    alive: bool = True


class ProcessExecutor(Executor):
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
    without one, it waits for the donor's state after its running step. A worker that dies fails the steps of its
    trials (the engine retries them on a live worker) and the saves it still owed.
    """

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
        self.kept: dict[int, Any] = {}
        self.pool: list[_Worker] = []
        self.where: dict[int, _Worker] = {}  # trial id -> the worker hosting it
        self.saves = SaveTracker()  # saves requested and not yet reported
        self.ended_on: dict[int, _Worker] = {}  # stopped trial id -> the worker that still owes its saves
        self.running: set[int] = set()  # trials with a step started and not yet reported
        self.snapshots: dict[int, Any] = {}  # trial id -> the state its worker sent at its latest `snapshot` step
        self.in_flight: dict[int, int] = {}  # trial id -> snapshots asked for that its worker has not sent yet
        self.ready: list[StepEvent] = []  # events received while the driver waited for a reply

    def open(self, trainer: type, experiment: str, checkpoints: Storage | None = None) -> None:
        self.trainer_cls, self.checkpoints = trainer, checkpoints
        self.t0 = time.perf_counter()  # CLOCK_MONOTONIC: the workers' clocks read the same
        if "torch" in sys.modules:  # every torch optimizer imports it when first built (~1 s): once, not per worker
            importlib.import_module("torch._dynamo")
        self.pool = [self._fork() for _ in range(self.workers)]

    def _fork(self) -> _Worker:
        driver_end, worker_end = multiprocessing.Pipe()
        process = multiprocessing.get_context("fork").Process(
            target=serve, args=(worker_end, self.trainer_cls, self.checkpoints, self.t0, self.threads),
            name="nasplat-worker", daemon=True)
        process.start()
        worker_end.close()
        return _Worker(process, driver_end)

    def now(self) -> float:
        return time.perf_counter() - self.t0

    # -- trials ------------------------------------------------------------------------------------
    def launch(self, trial_id: int, config: Config, seed: int, state: Any = None, inherit: bool = False) -> None:
        live = [w for w in self.pool if w.alive]
        if len(live) < self.workers:  # replace the dead
            self.pool = live + [self._fork() for _ in range(self.workers - len(live))]
            live = self.pool
        worker = min(live, key=lambda w: len(w.trials))
        worker.trials.add(trial_id)
        self.where[trial_id] = worker
        self.snapshots.pop(trial_id, None)
        self.in_flight.pop(trial_id, None)
        self._send(trial_id, Launch(trial_id, config, seed, state, inherit))

    def step(self, trial_id: int, snapshot: bool = False, save: int | None = None) -> None:
        self._owe(trial_id, save)
        if snapshot:
            self.in_flight[trial_id] = self.in_flight.get(trial_id, 0) + 1
        self._send(trial_id, Step(trial_id, snapshot, save))

    def exploit(self, trial_id: int, donor_id: int, config: Config, save: int | None = None,
                fallback: Checkpoint | None = None) -> Any:
        donor = self.where.get(donor_id)
        if donor is not None:  # take in the snapshots its worker has sent so far, and the one it is about to send
            self._drain(donor)
            while self.in_flight.get(donor_id) and donor.alive and donor_id in self.where:
                self._receive(donor)  # it takes a snapshot as it reads the step: within the step it is running
        state = self.snapshots.get(donor_id)
        if state is None and donor is not None:  # no snapshot: its state once the step it is running ends
            state = self._ask(donor, ExploitState(donor_id, fallback))
            sent = self.snapshots.get(donor_id)
            state = state if sent is None else sent  # a snapshot sent before the reply comes first
        if state is None:
            state = self.kept.get(donor_id, fallback)
        self.snapshots.pop(trial_id, None)
        self._owe(trial_id, save)
        self._send(trial_id, Adopt(trial_id, state, config, save, fallback))
        return state

    def stop(self, trial_id: int, keep_state: bool = False, save: int | None = None) -> None:
        self.snapshots.pop(trial_id, None)
        self.in_flight.pop(trial_id, None)
        worker = self.where.pop(trial_id, None)
        if worker is None:
            return
        worker.trials.discard(trial_id)
        self._owe(trial_id, save)
        if keep_state:
            state = self._ask(worker, Keep(trial_id, save))
            if state is not None:
                self.kept[trial_id] = state
        elif worker.alive:
            self._write(worker, Stop(trial_id, save))
        if not worker.alive and self.saves.owes(trial_id):
            self.ready.append(self._lost(trial_id, worker.process.pid, error=None))
        elif self.saves.owes(trial_id):
            self.ended_on[trial_id] = worker

    def _owe(self, trial_id: int, save: int | None) -> None:
        if save is not None:
            self.saves.request(trial_id, save)

    # -- messages --------------------------------------------------------------------------------
    def _send(self, trial_id: int, message: Request) -> None:
        worker = self.where.get(trial_id)  # a live worker: `_died` takes a dead one's trials out of `where`
        if worker is not None:
            self.running.add(trial_id)
            self._write(worker, message)  # if the worker died, `_died` failed this step with its others
        elif self.saves.owes(trial_id):  # its worker died while the driver waited on it: the saves asked since fail
            self.ready.append(self._lost(trial_id, 0, error=None))

    def _write(self, worker: _Worker, message: Request) -> None:
        try:
            worker.conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
        except OSError:
            self._died(worker)

    def _ask(self, worker: _Worker, message: Request) -> Any:
        """Send `message` and wait for the worker's reply (None if the worker died); events that arrive first are
        kept for `wait`."""
        if worker.alive:
            self._write(worker, message)
        while worker.alive:
            reply = self._receive(worker)
            if isinstance(reply, Reply):
                return reply.value
        return None

    def _drain(self, worker: _Worker) -> None:
        """Take in every message `worker` has sent so far (an end of file marks it dead)."""
        while worker.alive and worker.conn.poll() and self._receive(worker) is not None:
            pass

    def _receive(self, worker: _Worker) -> Message | None:
        """One message from `worker`; events go to `ready`. None where the worker died."""
        try:
            message: Message = pickle.loads(worker.conn.recv_bytes())
        except (EOFError, OSError):
            self._died(worker)
            return None
        if isinstance(message, Event):
            self._settle(message.event)
        elif isinstance(message, Snapshot):
            self.in_flight[message.trial_id] = self.in_flight.get(message.trial_id, 1) - 1
            self.snapshots[message.trial_id] = message.state  # None (none taken): an exploit asks for the state
        elif isinstance(message, Crash):
            self._died(worker, message.error)
            return None
        return message

    def _settle(self, event: StepEvent) -> None:
        if event.metrics is not None or event.error is not None:
            self.running.discard(event.trial_id)
        self.saves.report(event.saved)
        if not self.saves.owes(event.trial_id):
            self.ended_on.pop(event.trial_id, None)
        self.ready.append(event)

    def _died(self, worker: _Worker, error: str | None = None) -> None:
        """Fail the running steps of `worker`'s trials and every save it owed, of ended trials too; the next launch
        replaces it."""
        if not worker.alive:
            return
        worker.alive = False
        worker.process.join(timeout=5)
        if worker.process.is_alive():  # its pipe broke but it lives on: it hosts nothing the driver can reach
            worker.process.kill()
            worker.process.join()
        reason = error or self._reason(worker)
        for trial_id in sorted(worker.trials):
            self._settle(self._lost(trial_id, worker.process.pid, error=reason))
            self.where.pop(trial_id, None)
        worker.trials.clear()
        for trial_id in sorted(t for t, w in self.ended_on.items() if w is worker):  # their final saves
            del self.ended_on[trial_id]
            self.ready.append(self._lost(trial_id, worker.process.pid, error=None))

    @staticmethod
    def _reason(worker: _Worker) -> str:
        return f"worker process {worker.process.pid} died (exit code {worker.process.exitcode})"

    def _lost(self, trial_id: int, pid: int | None, error: str | None) -> StepEvent:
        """The event that ends a trial's attempt on a dead worker (`error`), with the saves it owed, failed."""
        saved = self.saves.lose(trial_id, "the worker process writing it died")
        now = self.now()
        return StepEvent(trial_id, None, error, now, now, os.uname().nodename, pid or 0, saved)

    def _balance(self) -> None:
        """Trials run for different times: where a worker has no step to run and another has steps waiting, move one
        of those trials to it. Its worker hands over the trial's state between steps, as for an exploit."""
        live = [w for w in self.pool if w.alive]
        idle = [w for w in live if not w.trials & self.running]
        for busy in sorted(live, key=lambda w: len(w.trials & self.running), reverse=True):
            waiting = busy.trials & self.running
            movable = sorted(t for t in waiting if not self.saves.owes(t) and not self.in_flight.get(t))
            if not idle or len(waiting) < 2 or not movable:
                return
            given: Given | None = self._ask(busy, Give(tuple(movable)))
            if given is not None:
                target = idle.pop()
                busy.trials.discard(given.trial_id)
                target.trials.add(given.trial_id)
                self.where[given.trial_id] = target
                self._write(target, Launch(given.trial_id, given.config, given.seed, given.state))

    def wait(self) -> list[StepEvent]:
        if not self.ready:
            self._balance()
        while not self.ready:
            live = {w.conn: w for w in self.pool if w.alive}
            if not self.running and not self.saves.owes() or not live:
                raise RuntimeError("wait() called with no step running")
            for conn in wait(list(live)):
                self._drain(live[conn])
        events, self.ready = self.ready, []
        return events

    def close(self) -> None:
        for worker in self.pool:
            if worker.alive:
                self._write(worker, Close())
        for worker in self.pool:
            worker.process.join(timeout=10)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()
            worker.conn.close()
        self.pool, self.where = [], {}
