"""The `processes` executor: trials in worker processes forked from the driver, on every core of this machine."""

from __future__ import annotations

import importlib
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable
from functools import partial
from multiprocessing.connection import wait
from typing import Any

from nasplat.core.checks import check_int, check_real, is_int
from nasplat.executors.base import Executor, StepEvent
from nasplat.executors.processes.child import ActivitySlot
from nasplat.executors.processes.messages import (
    Adopt,
    Close,
    End,
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
)
from nasplat.executors.processes.pipes import (
    WorkerGone,
    WorkerProcess,
    has_message,
    last_words,
    overdue,
    receive,
    running_user_step,
    send,
    wake_in,
)
from nasplat.executors.processes.trials import MAX_RELAUNCHES, HostedTrial
from nasplat.executors.processes.worker import serve
from nasplat.executors.saves import SaveTracker
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

    Each hosted trial's state is one `HostedTrial`; where it lives changes only through `_place`. The pipes and
    slots are read and written by `nasplat.executors.processes.pipes`, which returns what it read.
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
        self.keeping: dict[int, object] = {}  # trial id -> the token of the `Keep` whose reply has not come
        self.keeping_on: dict[int, WorkerProcess] = {}  # trial id -> the worker that owes that reply
        self.pool: list[WorkerProcess] = []
        self.trials: dict[int, HostedTrial] = {}  # the trials hosted, and those whose attempt a death ended
        self.saves = SaveTracker()  # saves requested and not yet reported
        self.ending: dict[int, WorkerProcess] = {}  # stopped trial id -> the worker that still owes its saves
        self.ready: list[StepEvent] = []  # events received while the driver waited for a reply
        self.outgoing: dict[WorkerProcess, list[Request]] = {}  # requests not yet written, by worker (`_flush`)
        self.closing = False

    def open(self, trainer: type, experiment: str, checkpoints: Storage | None = None) -> None:
        self.trainer_cls, self.checkpoints = trainer, checkpoints
        self.t0 = time.perf_counter()  # CLOCK_MONOTONIC: the workers' clocks read the same
        if "torch" in sys.modules:  # every torch optimizer imports it when first built (~1 s): once, not per worker
            importlib.import_module("torch._dynamo")
        self.closing = False
        self._replace_dead()

    def _fork(self) -> WorkerProcess:
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
        return WorkerProcess(process, driver_end, slot)

    def _replace_dead(self) -> None:
        """Drop the dead workers from the pool and fork new ones in their place."""
        self.pool = [w for w in self.pool if w.alive]
        while len(self.pool) < self.workers:
            self.pool.append(self._fork())

    def now(self) -> float:
        return time.perf_counter() - self.t0

    # -- trials ------------------------------------------------------------------------------------
    def _place(self, trial_id: int, worker: WorkerProcess | None) -> None:
        """Host the trial on `worker` (None: nowhere, its attempt ended with its worker): its record and the
        workers' sets of trials change together, here only."""
        record = self.trials[trial_id]
        if record.worker is not None:
            record.worker.trials.discard(trial_id)
        record.worker = worker
        if worker is not None:
            worker.trials.add(trial_id)

    def launch(self, trial_id: int, config: Config, seed: int, state: Any = None, inherit: bool = False) -> None:
        if any(not w.alive for w in self.pool) or len(self.pool) < self.workers:
            self._replace_dead()
        if trial_id in self.trials:
            self._place(trial_id, None)
        self.trials[trial_id] = HostedTrial(config, seed, state, inherit, request=Step(trial_id))
        self._place(trial_id, self._least_loaded())
        self._send(trial_id, Launch(trial_id, config, seed, state, inherit))
        self._flush()

    def step(self, trial_id: int, snapshot: bool = False, save: int | None = None) -> None:
        self._owe(trial_id, save)
        if (record := self.trials.get(trial_id)) is not None:
            record.stepped(trial_id, snapshot, save)
        self._send(trial_id, Step(trial_id, snapshot, save))
        self._flush()

    def exploit(self, trial_id: int, donor_id: int, config: Config, save: int | None = None,
                fallback: Checkpoint | None = None) -> Any:
        if (donor := self._worker_of(donor_id)) is not None:  # the snapshots its worker sent so far
            self._drain(donor)
        while (donor := self._worker_of(donor_id)) is not None and self.trials[donor_id].snapshots_due:
            self._receive(donor)  # it takes a snapshot as it reads the step: within the step it is running
        state = self.trials[donor_id].snapshot if donor_id in self.trials else None
        if state is None and (donor := self._worker_of(donor_id)) is not None:  # its state once its step ran
            state = self._ask(donor, ExploitState(donor_id, fallback))
            sent = self.trials[donor_id].snapshot if donor_id in self.trials else None
            state = state if sent is None else sent  # a snapshot sent before the reply comes first
        if state is None:
            state = self._resolved(donor_id)
        if state is None:
            state = fallback
        self._owe(trial_id, save)
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
        self._place(trial_id, None)
        del self.trials[trial_id]  # a step still running is abandoned
        if worker is None:
            return
        self._owe(trial_id, save)
        if keep_state:  # the state comes with the worker's reply; `kept_state` waits for it if asked first
            token = self.keeping[trial_id] = object()
            self.keeping_on[trial_id] = worker
            self._ask_later(worker, Keep(trial_id, save), lambda state: self._keep(trial_id, token, state))
        elif worker.alive:
            self._write(worker, End(trial_id, save))
        if not worker.alive and self.saves.owes(trial_id):
            self.ready.append(self._lost(trial_id, worker.process.pid, error=None))
        elif self.saves.owes(trial_id):
            self.ending[trial_id] = worker

    def _worker_of(self, trial_id: int) -> WorkerProcess | None:
        record = self.trials.get(trial_id)
        return None if record is None else record.worker

    def _keep(self, trial_id: int, token: object, state: Any) -> None:
        if self.keeping.get(trial_id) is token:  # not dropped meanwhile
            del self.keeping[trial_id], self.keeping_on[trial_id]
            if state is not None:
                self.kept[trial_id] = state

    def _resolved(self, trial_id: int) -> Any:
        """The state kept for the trial, once its worker's reply came (None if there is none)."""
        while trial_id in self.keeping:
            self._receive(self.keeping_on[trial_id])
        return self.kept.get(trial_id)

    def kept_state(self, trial_id: int) -> Any:
        return self._resolved(trial_id)

    def take_kept(self, trial_id: int) -> Any:
        state = self._resolved(trial_id)
        self.kept.pop(trial_id, None)
        return state

    def drop_states(self, keep: set[int]) -> None:
        super().drop_states(keep)
        for trial_id in [t for t in self.keeping if t not in keep]:
            del self.keeping[trial_id], self.keeping_on[trial_id]

    def _owe(self, trial_id: int, save: int | None) -> None:
        if save is not None:
            self.saves.request(trial_id, save)

    # -- messages --------------------------------------------------------------------------------
    def _send(self, trial_id: int, message: Request) -> None:
        record = self.trials.get(trial_id)
        if record is not None and record.worker is not None:  # a live worker: `_died` moves a dead one's trials
            record.running = True
            self._write(record.worker, message)  # if the worker died, `_died` relaunched this trial or failed it
        elif self.saves.owes(trial_id):  # its worker died while the driver waited on it: the saves asked since fail
            self.ready.append(self._lost(trial_id, 0, error=None))

    def _write(self, worker: WorkerProcess, message: Request) -> None:
        """Queue `message` for the worker. `_flush` writes it: at the end of a `launch`, `step` or `exploit` (their
        steps start at once), before the driver waits on a worker; so a `stop`'s `End` goes with what comes next."""
        if worker.alive:
            self.outgoing.setdefault(worker, []).append(message)

    def _flush(self) -> None:
        """Write every queued request, one write per worker; a worker whose pipe is broken is dead (`_died`)."""
        while self.outgoing:
            worker, messages = self.outgoing.popitem()
            if worker.alive and not send(worker, messages):
                self._died(worker)

    def _ask_later(self, worker: WorkerProcess, message: Request, answer: Callable[[Any], None]) -> None:
        """Send `message`; `answer` gets the worker's reply when it comes (None if the worker dies first)."""
        if not worker.alive:
            answer(None)
            return
        worker.asks.append(answer)
        self._write(worker, message)

    def _ask(self, worker: WorkerProcess, message: Request) -> Any:
        """Send `message` and wait for the worker's reply (None if the worker died); events that arrive first are
        kept for `wait`."""
        box: list[Any] = []
        self._ask_later(worker, message, box.append)
        while not box and worker.alive:
            self._receive(worker)
        return box[0] if box else None

    def _receive(self, worker: WorkerProcess) -> Message | None:
        """One message from `worker`, taken in (`_take`); None where the worker died (or timed out) first."""
        self._flush()
        while worker.alive and not has_message(worker, wake_in(worker, self.step_timeout_s, self.now())):
            self._expire(worker)
        if not worker.alive:
            return None
        try:
            message = receive(worker)
        except WorkerGone as gone:
            self._died(worker, gone.error)
            return None
        self._take(worker, message)
        return message

    def _drain(self, worker: WorkerProcess) -> None:
        """Take in every message `worker` has sent so far (an end of file marks it dead)."""
        while worker.alive and has_message(worker) and self._receive(worker) is not None:
            pass

    def _take(self, worker: WorkerProcess, message: Message) -> None:
        """Events go to `ready`, snapshots to their trial's record, a reply to whoever asked."""
        if isinstance(message, Event):
            self._accept(message.event)
        elif isinstance(message, Snapshot):
            record = self.trials.get(message.trial_id)
            if record is not None and record.worker is not None:  # not stopped meanwhile
                record.snapshot_sent(message.state)  # None (none taken): an exploit asks for the state
        elif isinstance(message, Reply) and worker.asks:
            worker.asks.popleft()(message.value)

    def _accept(self, event: StepEvent) -> None:
        """Take in a step event (or a save report): the trial's record updated, the event ready for `wait`."""
        if (record := self.trials.get(event.trial_id)) is not None:
            record.reported(event)
        self.saves.report(event.saved)
        if not self.saves.owes(event.trial_id):
            self.ending.pop(event.trial_id, None)
        self.ready.append(event)

    def wait(self, timeout: float | None = None) -> list[StepEvent]:
        """Every step event and save report that came (at least one), the steps past `step_timeout_s` failed, or
        [] once `timeout` seconds passed with none."""
        begin = self.now()
        if not self.ready:
            self._balance()
        while not self.ready:
            self._flush()
            live = {w.conn: w for w in self.pool if w.alive}
            running = any(record.running for record in self.trials.values())
            if not running and not self.saves.owes() or not live:
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
        events, self.ready = self.ready, []
        return events

    def close(self) -> None:
        """End every worker: `Close` first, then a kill for one still running a step (abandoned) or slow to end."""
        self.closing = True
        for worker in self.pool:
            if worker.alive:
                self._write(worker, Close())
        self._flush()
        end = time.monotonic() + 10
        for worker in self.pool:
            if running_user_step(worker):
                worker.process.kill()
            worker.process.join(timeout=max(0.0, end - time.monotonic()))
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()
            worker.conn.close()
            worker.alive = False
            while worker.asks:  # states kept but not sent: none
                worker.asks.popleft()(None)
        self.pool, self.trials = [], {}

    # -- idle workers -----------------------------------------------------------------------------------
    def _least_loaded(self) -> WorkerProcess:
        return min((w for w in self.pool if w.alive), key=lambda w: len(w.trials))

    def _waiting(self, worker: WorkerProcess) -> list[int]:
        """The worker's trials with a step asked for and not reported (running or queued there)."""
        return [t for t in worker.trials if self.trials[t].running]

    def _balance(self) -> None:
        """Trials run for different times: where a worker has no step to run and another has steps waiting, ask one
        of those trials over to it. Its worker hands over the trial's state between steps, as for an exploit; the
        reply is taken in whenever it comes (`_given`)."""
        live = [w for w in self.pool if w.alive]
        waiting = {w: self._waiting(w) for w in live}
        free = len([w for w in live if not waiting[w]]) - sum(w.giving for w in live)
        for busy in sorted(live, key=lambda w: len(waiting[w]), reverse=True):
            movable = sorted(t for t in waiting[busy] if not self.saves.owes(t) and not self.trials[t].snapshots_due)
            if free <= 0 or len(waiting[busy]) < 2:
                return
            if busy.giving or not movable:
                continue
            busy.giving, free = True, free - 1
            self._ask_later(busy, Give(tuple(movable)), partial(self._given, busy))

    def _given(self, source: WorkerProcess, given: Given | None) -> None:
        """`source` handed over a trial (or none): launch it from the state it sent on the least busy other worker."""
        source.giving = False
        if given is None or self._worker_of(given.trial_id) is not source:  # none, or stopped meanwhile
            return
        others = [w for w in self.pool if w.alive and w is not source]
        target = min(others, key=lambda w: (len(self._waiting(w)), len(w.trials))) if others else source
        self._place(given.trial_id, target)
        self.trials[given.trial_id].moved(given.config, given.state)
        self._write(target, Launch(given.trial_id, given.config, given.seed, given.state))

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
        pid = worker.process.pid
        assert pid is not None  # a worker is started when made
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        error = (f"step timed out after {limit:g} s (step_timeout_s={limit:g}): trial {activity.trial_id}'s "
                 f"{activity.name} had run {self.now() - activity.since:.3g} s in worker process {pid}, which was "
                 "killed")
        self._died(worker, blame=(activity.trial_id, error))

    def _died(self, worker: WorkerProcess, error: str | None = None, blame: tuple[int, str] | None = None) -> None:
        """`worker` is dead (or, its pipe broken, killed now): take in what it sent, fail the step of the trial whose
        code it ran (`blame`: that trial and the error; else read from its slot), relaunch its other trials on a
        live worker (the pool replaced), fail every save it owed but those the relaunches make again."""
        if not worker.alive:
            return
        worker.alive = False
        messages, stepped, crash = last_words(worker)
        for message in messages:
            self._take(worker, message)
        error = error or crash
        process = worker.process
        process.join(timeout=5)
        if process.is_alive():  # its pipe broke but it lives on: it hosts nothing the driver can reach
            process.kill()
            process.join()
        worker.conn.close()
        while worker.asks:
            worker.asks.popleft()(None)
        reason = f"worker process {process.pid} died (exit code {process.exitcode})"
        if error is not None:
            reason = f"{reason}: {error}"
        if blame is None and (activity := worker.slot.read()) is not None:
            blame = (activity.trial_id, f"{reason}, running trial {activity.trial_id}'s {activity.name}")
        elif blame is not None and blame[0] in stepped:  # its step ended as it was timed out: nobody to charge
            blame = None
        guilty = blame[0] if blame is not None and blame[0] in worker.trials else None
        if blame is not None and guilty is not None:
            self._place(guilty, None)
            self._accept(self._lost(guilty, process.pid, blame[1]))
        innocent = sorted(worker.trials)
        for trial_id in sorted(t for t, w in self.ending.items() if w is worker):  # their final saves
            del self.ending[trial_id]
            self.ready.append(self._lost(trial_id, process.pid, error=None))
        if self.closing:
            for trial_id in innocent:
                self._place(trial_id, None)
            return
        self._replace_dead()
        for trial_id in innocent:
            self._relaunch(trial_id, process.pid, reason, unexplained=blame is None)

    def _relaunch(self, trial_id: int, pid: int | None, reason: str, unexplained: bool) -> None:
        """Host the trial of a dead worker again on a live one, from the newest state the driver holds; report the
        saves it owed that are lost. A trial relaunched after `MAX_RELAUNCHES` deaths charged to no trial
        (`unexplained`) since its last step fails instead."""
        lost = self.saves.lose(trial_id, "the worker process writing it died")
        record = self.trials[trial_id]
        message, lost = record.relaunch(trial_id, lost, unexplained)
        if message is None:
            self._place(trial_id, None)
            error = (f"{reason}; trial {trial_id} was hosted there, relaunched after {MAX_RELAUNCHES} earlier deaths "
                     "of its worker that no trial's code explained since its last step, and is charged for this one")
            self._accept(self._lost(trial_id, pid, error, lost))
            return
        if message.then is not None and message.then.save is not None:
            self.saves.request(trial_id, message.then.save)  # made again by the relaunch
        if lost:
            self.ready.append(self._lost(trial_id, pid, None, lost))
        target = self._least_loaded()
        self._place(trial_id, target)
        self._write(target, message)

    def _lost(self, trial_id: int, pid: int | None, error: str | None,
              saved: tuple[Any, ...] | None = None) -> StepEvent:
        """The event that ends a trial's attempt on a dead worker (`error`), with the saves it owed, failed (or
        `saved`, those given)."""
        if saved is None:
            saved = self.saves.lose(trial_id, "the worker process writing it died")
        now = self.now()
        return StepEvent(trial_id, None, error, now, now, os.uname().nodename, pid or 0, saved)
