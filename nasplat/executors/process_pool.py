"""The `processes` driver's side of its workers: their messages, their step timeouts, and their deaths.

A worker's death fails the step of the trial whose user code its `ActivitySlot` names (a step, a setup, a state
copy: the one running when it died, or the one that ran past `step_timeout_s`, for which the driver killed it);
its other trials are relaunched on a live worker, uncharged (`nasplat.executors.process_trials`).
"""

from __future__ import annotations

import os
import pickle
import signal
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any

from nasplat.executors.base import StepEvent
from nasplat.executors.messages import Crash, Event, Give, Given, Launch, Message, Reply, Snapshot
from nasplat.executors.process_child import REPLAY, STEP, ActivitySlot
from nasplat.executors.process_trials import MAX_RELAUNCHES, TrialCopies
from nasplat.executors.saves import SaveTracker

RECHECK_S = 0.5
"""With `step_timeout_s`, how often (at most) the driver reads its workers' slots while it waits: a step that starts
sends no message."""


@dataclass(eq=False)
class Worker:
    """One forked worker process, the trials it hosts, and the answers it owes to the driver's questions."""

    process: BaseProcess
    conn: Connection
    slot: ActivitySlot
    trials: set[int] = field(default_factory=set)
    alive: bool = True
    asks: deque[Callable[[Any], None]] = field(default_factory=deque)  # who gets each reply, in request order
    giving: bool = False  # a `Give` was sent and its reply has not come


@dataclass(eq=False)
class Pending:
    """A kept state its worker has yet to send (`stop(keep_state=True)` does not wait for it)."""

    worker: Worker


class PoolMixin:
    """What `ProcessExecutor` does with the messages of its workers, their timeouts and their deaths."""

    pool: list[Worker]
    workers: int
    where: dict[int, Worker]
    copies: TrialCopies
    saves: SaveTracker
    ended_on: dict[int, Worker]
    running: set[int]
    snapshots: dict[int, Any]
    in_flight: dict[int, int]
    ready: list[StepEvent]
    closing: bool
    step_timeout_s: float | None

    if TYPE_CHECKING:  # defined by `ProcessExecutor`
        def now(self) -> float: ...

        def _replace_dead(self) -> None: ...

        def _write(self, worker: Worker, message: Any) -> None: ...

        def _ask_later(self, worker: Worker, message: Any, answer: Callable[[Any], None]) -> None: ...

    # -- messages ------------------------------------------------------------------------------------
    def _receive(self, worker: Worker) -> Message | None:
        """One message from `worker`, taken in (`_take`); None where the worker died (or timed out) first."""
        while worker.alive and not worker.conn.poll(self._wake(worker)):
            self._expire(worker)
        if not worker.alive:
            return None
        try:
            message: Message = pickle.loads(worker.conn.recv_bytes())
        except (EOFError, OSError):
            self._died(worker)
            return None
        if isinstance(message, Crash):
            self._died(worker, message.error)
            return None
        self._take(worker, message)
        return message

    def _drain(self, worker: Worker) -> None:
        """Take in every message `worker` has sent so far (an end of file marks it dead)."""
        while worker.alive and worker.conn.poll() and self._receive(worker) is not None:
            pass

    def _take(self, worker: Worker, message: Message) -> None:
        """Events go to `ready`, snapshots to `snapshots`, a reply to whoever asked."""
        if isinstance(message, Event):
            self._settle(message.event)
        elif isinstance(message, Snapshot):
            self.in_flight[message.trial_id] = self.in_flight.get(message.trial_id, 1) - 1
            if message.trial_id in self.where:  # not stopped meanwhile
                self.snapshots[message.trial_id] = message.state  # None (none taken): an exploit asks for the state
                self.copies.snapshot(message.trial_id, message.state)
        elif isinstance(message, Reply) and worker.asks:
            worker.asks.popleft()(message.value)

    def _settle(self, event: StepEvent) -> None:
        if event.metrics is not None or event.error is not None:
            self.running.discard(event.trial_id)
        self.copies.reported(event)
        self.saves.report(event.saved)
        if not self.saves.owes(event.trial_id):
            self.ended_on.pop(event.trial_id, None)
        self.ready.append(event)

    def _least_loaded(self) -> Worker:
        return min((w for w in self.pool if w.alive), key=lambda w: len(w.trials))

    # -- idle workers -----------------------------------------------------------------------------------
    def _balance(self) -> None:
        """Trials run for different times: where a worker has no step to run and another has steps waiting, ask one
        of those trials over to it. Its worker hands over the trial's state between steps, as for an exploit; the
        reply is taken in whenever it comes (`_given`)."""
        live = [w for w in self.pool if w.alive]
        free = len([w for w in live if not w.trials & self.running]) - sum(w.giving for w in live)
        for busy in sorted(live, key=lambda w: len(w.trials & self.running), reverse=True):
            waiting = busy.trials & self.running
            movable = sorted(t for t in waiting if not self.saves.owes(t) and not self.in_flight.get(t))
            if free <= 0 or len(waiting) < 2:
                return
            if busy.giving or not movable:
                continue
            busy.giving, free = True, free - 1
            self._ask_later(busy, Give(tuple(movable)), lambda given, busy=busy: self._given(busy, given))

    def _given(self, source: Worker, given: Given | None) -> None:
        """`source` handed over a trial (or none): launch it from the state it sent on the least busy other worker."""
        source.giving = False
        if given is None or self.where.get(given.trial_id) is not source:  # none, or stopped meanwhile
            return
        others = [w for w in self.pool if w.alive and w is not source]
        target = min(others, key=lambda w: (len(w.trials & self.running), len(w.trials))) if others else source
        source.trials.discard(given.trial_id)
        target.trials.add(given.trial_id)
        self.where[given.trial_id] = target
        self.copies.moved(given.trial_id, given.config, given.state)
        self._write(target, Launch(given.trial_id, given.config, given.seed, given.state))

    # -- step timeouts ---------------------------------------------------------------------------------
    def _wake(self, worker: Worker) -> float | None:
        """How long to wait on `worker` before its slot is read again (None: no step timeout, no need)."""
        limit = self.step_timeout_s
        if limit is None:
            return None
        recheck = min(RECHECK_S, limit / 2)
        activity = worker.slot.read()
        return recheck if activity is None else max(0.0, min(recheck, activity.since + limit - self.now()))

    def _expire(self, worker: Worker) -> None:
        """Kill `worker` if the user code it runs has run past `step_timeout_s` (after taking in what it sent)."""
        limit = self.step_timeout_s
        if limit is None or not worker.alive:
            return
        activity = worker.slot.read()
        if activity is not None and self.now() >= activity.since + limit and worker.conn.poll():
            self._drain(worker)  # its step may have ended just now
            activity = worker.slot.read() if worker.alive else None
        if activity is None or self.now() < activity.since + limit:
            return
        pid = worker.process.pid
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        error = (f"step timed out after {limit:g} s (step_timeout_s={limit:g}): trial {activity.trial_id}'s "
                 f"{activity.name} had run {self.now() - activity.since:.3g} s in worker process {pid}, which was "
                 "killed")
        self._died(worker, blame=(activity.trial_id, error))

    def _abandoned(self, worker: Worker) -> bool:
        """Whether `worker` runs a step (at close: the engine left it)."""
        activity = worker.slot.read()
        return activity is not None and activity.what in (STEP, REPLAY)

    # -- deaths ----------------------------------------------------------------------------------------
    def _died(self, worker: Worker, error: str | None = None, blame: tuple[int, str] | None = None) -> None:
        """`worker` is dead (or, its pipe broken, killed now): take in what it sent, fail the step of the trial whose
        code it ran (`blame`: that trial and the error; else read from its slot), relaunch its other trials on a
        live worker (the pool replaced), fail every save it owed but those the relaunches make again."""
        if not worker.alive:
            return
        worker.alive = False
        stepped, crash = self._drain_dead(worker)
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
            self.where.pop(guilty, None)
            self._settle(self._lost(guilty, process.pid, blame[1]))
        innocent = sorted(worker.trials - {guilty})
        worker.trials.clear()
        for trial_id in sorted(t for t, w in self.ended_on.items() if w is worker):  # their final saves
            del self.ended_on[trial_id]
            self.ready.append(self._lost(trial_id, process.pid, error=None))
        if self.closing:
            for trial_id in innocent:
                self.where.pop(trial_id, None)
            return
        self._replace_dead()
        for trial_id in innocent:
            self._relaunch(trial_id, process.pid, reason, unexplained=blame is None)

    def _drain_dead(self, worker: Worker) -> tuple[set[int], str | None]:
        """Take in what a dead `worker` sent before it died; the trials whose steps it reported, and the error of
        its `Crash`, if it sent one."""
        stepped: set[int] = set()
        crash = None
        while True:
            try:
                if not worker.conn.poll():
                    break
                message: Message = pickle.loads(worker.conn.recv_bytes())
            except (EOFError, OSError):
                break
            if isinstance(message, Crash):
                crash = message.error
                continue
            if isinstance(message, Event) and (message.event.metrics is not None or message.event.error is not None):
                stepped.add(message.event.trial_id)
            self._take(worker, message)
        return stepped, crash

    def _relaunch(self, trial_id: int, pid: int, reason: str, unexplained: bool) -> None:
        """Host the trial of a dead worker again on a live one, from the newest state the driver holds; report the
        saves it owed that are lost. A trial relaunched after `MAX_RELAUNCHES` deaths charged to no trial (`unexplained`)
        since its last step fails instead."""
        lost = self.saves.lose(trial_id, "the worker process writing it died")
        message, lost = self.copies.relaunch(trial_id, lost, bool(self.in_flight.get(trial_id)), unexplained)
        if message is None:
            self.where.pop(trial_id, None)
            error = (f"{reason}; trial {trial_id} was hosted there, relaunched after {MAX_RELAUNCHES} earlier deaths "
                     "of its worker that no trial's code explained since its last step, and is charged for this one")
            self._settle(self._lost(trial_id, pid, error, lost))
            return
        if message.then is not None and message.then.save is not None:
            self.saves.request(trial_id, message.then.save)  # made again by the relaunch
        if message.then is None or not message.then.snapshot:
            self.in_flight.pop(trial_id, None)
        if lost:
            self.ready.append(self._lost(trial_id, pid, None, lost))
        target = self._least_loaded()
        target.trials.add(trial_id)
        self.where[trial_id] = target
        self._write(target, message)

    def _lost(self, trial_id: int, pid: int | None, error: str | None,
              saved: tuple[Any, ...] | None = None) -> StepEvent:
        """The event that ends a trial's attempt on a dead worker (`error`), with the saves it owed, failed (or
        `saved`, those given)."""
        if saved is None:
            saved = self.saves.lose(trial_id, "the worker process writing it died")
        now = self.now()
        return StepEvent(trial_id, None, error, now, now, os.uname().nodename, pid or 0, saved)
