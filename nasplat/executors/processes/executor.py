"""The `processes` executor: trials in worker processes forked from the driver, on every core of this machine."""

from __future__ import annotations

import importlib
import os
import sys
import time
from functools import partial
from multiprocessing.connection import wait
from typing import Any

from nasplat.core.checks import check_int, check_real, is_int
from nasplat.executors.base import Executor, StepEvent
from nasplat.executors.processes.intake import Intake
from nasplat.executors.processes.messages import (
    Adopt,
    End,
    ExploitState,
    Give,
    Given,
    Keep,
    Launch,
    Message,
    Request,
    Step,
)
from nasplat.executors.processes.pipes import WorkerGone, WorkerProcess, has_message, overdue, receive, wake_in
from nasplat.executors.processes.pool import WorkerPool
from nasplat.executors.processes.trials import AwaitedStates, HostedTrial, HostedTrials
from nasplat.space import Config
from nasplat.storage import Storage
from nasplat.storage.checkpoints import Checkpoint


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
    without one, it waits for the donor's state after its running step.

    A worker dies with its driver, whatever kills the driver, and holds none of the driver's files open for writing
    (`nasplat.executors.processes.child.detach`): a killed driver's folder is taken over by `nasplat resume` at once.
    With `step_timeout_s`, a worker whose user code (a setup, a step, a state copy) runs longer is killed and that
    trial's step fails ("step timed out after N s"). A worker that dies (killed, crashed, timed out) fails the step
    of the trial whose code was running in it alone; its other trials are relaunched on a live worker from the
    newest state the driver holds, uncharged (`nasplat.executors.processes.trials`); the saves it still owed fail.
    A worker does not write into files the driver opened for writing: a trainer that logs to a file opens its own.

    The executor turns the engine's calls into requests and waits for what comes back, with three collaborators:
    `pool` (a `WorkerPool`: the workers, the requests queued for them, who gets each reply), `trials` (a
    `HostedTrials`: each hosted trial's one `HostedTrial` record, changed by its methods; where it lives only by
    `place`) and `intake` (an `Intake`: what each message and each death means, the events for `wait`, the saves
    owed). The pipes are read by `nasplat.executors.processes.pipes`, which returns what it read.
    """

    supports_step_timeout = True

    def __init__(self, concurrency: int = 1, *, processes: int | None = None, threads: int | None = None,
                 step_timeout_s: float | None = None) -> None:
        check_int("concurrency", concurrency, minimum=1)
        self.step_timeout_s = check_real("step_timeout_s", step_timeout_s, minimum=0, strict=True, optional=True)
        if processes is not None:
            check_int("processes", processes, minimum=1, note="worker processes")
        if threads is not None and (not is_int(threads) or threads < 1):  # the exact line tests pin: no hint
            raise ValueError(f"`threads` must be an integer >= 1 (torch threads per worker), got {threads=!r}")
        cores = len(os.sched_getaffinity(0))
        workers = min(concurrency, cores) if processes is None else processes
        self.concurrency, self.workers = concurrency, workers
        self.threads = threads if threads is not None else max(1, cores // workers)
        self.kept: dict[int, Any] = {}  # trial id -> its final state, once its worker sent it
        self.awaited = AwaitedStates()  # final states asked for whose replies have not come
        self.pool = WorkerPool(workers, self.threads)
        self.trials = HostedTrials()  # the trials hosted, and those whose attempt a death ended
        self.intake = Intake(self.pool, self.trials, self.now)  # events for `wait`, the saves owed, deaths

    def open(self, trainer: type, experiment: str, checkpoints: Storage | None = None) -> None:
        self.t0 = time.perf_counter()  # CLOCK_MONOTONIC: the workers' clocks read the same
        if "torch" in sys.modules:  # every torch optimizer imports it when first built (~1 s): once, not per worker
            importlib.import_module("torch._dynamo")
        self.pool.open(trainer, checkpoints, self.t0)

    def now(self) -> float:
        return time.perf_counter() - self.t0

    # -- trials ------------------------------------------------------------------------------------
    def launch(self, trial_id: int, config: Config, seed: int, state: Any = None, inherit: bool = False) -> None:
        if not self.pool.full():
            self.pool.replace_dead()
        if trial_id in self.trials:
            self.trials.place(trial_id, None)
        self.trials[trial_id] = HostedTrial(config, seed, state, inherit, request=Step(trial_id))
        self.trials.place(trial_id, self.pool.least_loaded())
        self._send(trial_id, Launch(trial_id, config, seed, state, inherit))
        self._flush()

    def step(self, trial_id: int, snapshot: bool = False, save: int | None = None) -> None:
        self.intake.owe(trial_id, save)
        if (record := self.trials.get(trial_id)) is not None:
            record.stepped(trial_id, snapshot, save)
        self._send(trial_id, Step(trial_id, snapshot, save))
        self._flush()

    def exploit(self, trial_id: int, donor_id: int, config: Config, save: int | None = None,
                fallback: Checkpoint | None = None) -> Any:
        if (donor := self.trials.worker_of(donor_id)) is not None:  # the snapshots its worker sent so far
            self._drain(donor)
        while (donor := self.trials.worker_of(donor_id)) is not None and self.trials[donor_id].snapshots_due:
            self._receive(donor)  # it takes a snapshot as it reads the step: within the step it is running
        state = self.trials[donor_id].snapshot if donor_id in self.trials else None
        if state is None and (donor := self.trials.worker_of(donor_id)) is not None:  # its state once its step ran
            state = self._ask(donor, ExploitState(donor_id, fallback))
            sent = self.trials[donor_id].snapshot if donor_id in self.trials else None
            state = state if sent is None else sent  # a snapshot sent before the reply comes first
        if state is None:
            state = self._resolved(donor_id)
        if state is None:
            state = fallback
        self.intake.owe(trial_id, save)
        if (record := self.trials.get(trial_id)) is not None:
            record.exploited(trial_id, state, config, save)
        self._send(trial_id, Adopt(trial_id, state, config, save, fallback))
        self._flush()
        return state

    def stop(self, trial_id: int, keep_state: bool = False, save: int | None = None) -> None:
        record = self.trials.get(trial_id)
        if record is None:
            return
        worker = record.worker
        self.trials.place(trial_id, None)
        del self.trials[trial_id]  # a step still running is abandoned
        if worker is None:
            return
        self.intake.owe(trial_id, save)
        if keep_state:  # the state comes with the worker's reply; `kept_state` waits for it if asked first
            self.pool.ask_later(worker, Keep(trial_id, save), self.awaited.expect(trial_id, worker, self.kept))
        elif worker.alive:
            self.pool.write(worker, End(trial_id, save))
        self.intake.ended(trial_id, worker)

    def _resolved(self, trial_id: int) -> Any:
        """The state kept for the trial, once its worker's reply came (None if there is none)."""
        while (worker := self.awaited.owed_by(trial_id)) is not None:
            self._receive(worker)
        return self.kept.get(trial_id)

    def kept_state(self, trial_id: int) -> Any:
        return self._resolved(trial_id)

    def take_kept(self, trial_id: int) -> Any:
        state = self._resolved(trial_id)
        self.kept.pop(trial_id, None)
        return state

    def drop_states(self, keep: set[int]) -> None:
        super().drop_states(keep)
        self.awaited.drop(keep)

    # -- messages --------------------------------------------------------------------------------
    def _send(self, trial_id: int, message: Request) -> None:
        record = self.trials.get(trial_id)
        if record is not None and record.worker is not None:  # a live worker: `Intake.died` moves a dead one's trials
            record.sent()
            self.pool.write(record.worker, message)  # if the worker died, `Intake.died` relaunched or failed the trial
        elif self.intake.saves.owes(trial_id):  # its worker died while the driver waited on it: the saves asked since
            self.intake.lost(trial_id, 0)  # fail

    def _flush(self) -> None:
        """Write every request queued (`pool.write`): at the end of a `launch`, `step` or `exploit` (their steps
        start at once), before the driver waits on a worker; so a `stop`'s `End` goes with what comes next. A worker
        whose pipe is broken is dead (`Intake.died`); what its death queued (relaunches) is written too."""
        while broken := self.pool.flush():
            for worker in broken:
                self.intake.died(worker)

    def _ask(self, worker: WorkerProcess, message: Request) -> Any:
        """Send `message` and wait for the worker's reply (None if the worker died); events that arrive first are
        kept for `wait`."""
        box: list[Any] = []
        self.pool.ask_later(worker, message, box.append)
        while not box and worker.alive:
            self._receive(worker)
        return box[0] if box else None

    def _receive(self, worker: WorkerProcess) -> Message | None:
        """One message from `worker`, taken in (`Intake.take`); None where the worker died (or timed out) first."""
        self._flush()
        while worker.alive and not has_message(worker, wake_in(worker, self.step_timeout_s, self.now())):
            self._expire(worker)
        if not worker.alive:
            return None
        try:
            message = receive(worker)
        except WorkerGone as gone:
            self.intake.died(worker, gone.error)
            return None
        self.intake.take(worker, message)
        return message

    def _drain(self, worker: WorkerProcess) -> None:
        """Take in every message `worker` has sent so far (an end of file marks it dead)."""
        while worker.alive and has_message(worker) and self._receive(worker) is not None:
            pass

    def wait(self, timeout: float | None = None) -> list[StepEvent]:
        """Every step event and save report that came (at least one), the steps past `step_timeout_s` failed, or
        [] once `timeout` seconds passed with none."""
        begin = self.now()
        if not self.intake.ready:
            self._balance()
        while not self.intake.ready:
            self._flush()
            live = {w.conn: w for w in self.pool.live()}
            if not self.trials.running() and not self.intake.saves.owes() or not live:
                raise RuntimeError("wait() called with no step running")
            now = self.now()
            wakes = [wake for w in live.values() if (wake := wake_in(w, self.step_timeout_s, now)) is not None]
            if timeout is not None:
                wakes.append(max(0.0, begin + timeout - now))
            for conn in wait(list(live), timeout=min(wakes) if wakes else None):
                # typeshed types what `wait` returns as any waitable; it is members of the list it was given
                self._drain(live[conn])  # type: ignore[index]
            for worker in live.values():
                self._expire(worker)
            if timeout is not None and self.now() - begin >= timeout:
                break
        return self.intake.take_ready()

    def close(self) -> None:
        """End every worker: `Close` first, then a kill for one still running a step (abandoned) or slow to end."""
        self.pool.close_all()
        self._flush()
        self.pool.end()  # states kept but not sent: none
        self.trials.clear()

    # -- idle workers -----------------------------------------------------------------------------------
    def _balance(self) -> None:
        """Trials run for different times: where a worker has no step to run and another has steps waiting, ask one
        of those trials over to it. Its worker hands over the trial's state between steps, as for an exploit; the
        reply is taken in whenever it comes (`_given`)."""
        live = self.pool.live()
        waiting = {w: self.trials.waiting(w) for w in live}
        free = len([w for w in live if not waiting[w]]) - sum(w.giving for w in live)
        for busy in sorted(live, key=lambda w: len(waiting[w]), reverse=True):
            movable = sorted(t for t in waiting[busy]
                             if not self.intake.saves.owes(t) and not self.trials[t].snapshots_due)
            if free <= 0 or len(waiting[busy]) < 2:
                return
            if busy.giving or not movable:
                continue
            busy.giving, free = True, free - 1
            self.pool.ask_later(busy, Give(tuple(movable)), partial(self._given, busy))

    def _given(self, source: WorkerProcess, given: Given | None) -> None:
        """`source` handed over a trial (or none): launch it from the state it sent on the least busy other worker."""
        source.giving = False
        if given is None or self.trials.worker_of(given.trial_id) is not source:  # none, or stopped meanwhile
            return
        others = [w for w in self.pool.live() if w is not source]
        target = min(others, key=lambda w: (len(self.trials.waiting(w)), len(w.trials))) if others else source
        self.trials.place(given.trial_id, target)
        self.trials[given.trial_id].moved(given.config, given.state)
        self.pool.write(target, Launch(given.trial_id, given.config, given.seed, given.state))

    # -- step timeouts and deaths ------------------------------------------------------------------------
    def _expire(self, worker: WorkerProcess) -> None:
        """Kill `worker` if the user code it runs has run past `step_timeout_s` (after taking in what it sent)."""
        limit = self.step_timeout_s
        activity = overdue(worker, limit, self.now())
        if activity is not None and has_message(worker):
            self._drain(worker)  # its step may have ended just now
            activity = overdue(worker, limit, self.now())
        if activity is None or limit is None:
            return
        pid = self.pool.kill(worker)
        error = (f"step timed out after {limit:g} s (step_timeout_s={limit:g}): trial {activity.trial_id}'s "
                 f"{activity.name} had run {self.now() - activity.since:.3g} s in worker process {pid}, which was "
                 "killed")
        self.intake.died(worker, blame=(activity.trial_id, error))
