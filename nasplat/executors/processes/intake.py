"""What the `processes` driver takes in from its workers, their messages and their deaths, and what it owes the engine
for it: the step events ready for `wait`, and the saves asked for and not yet reported.

`Intake` is where a message is read for what it means (an event updates its trial's record and goes to `ready`, a
snapshot goes to its trial's record, a reply to whoever asked) and where a dead worker's trials are charged or
relaunched (the rules are `nasplat.executors.processes.trials`'). Each trial's record changes through its own
methods (`HostedTrial`), where it lives through `HostedTrials.place`.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from nasplat.executors.base import StepEvent
from nasplat.executors.processes.messages import Event, Message, Reply, Snapshot
from nasplat.executors.processes.pipes import WorkerProcess
from nasplat.executors.processes.pool import WorkerPool
from nasplat.executors.processes.trials import MAX_RELAUNCHES, HostedTrials
from nasplat.executors.saves import SaveTracker
from nasplat.storage.checkpoints import Checkpoint

LOST_SAVE = "the worker process writing it died"


class Intake:
    """Takes in what `pool`'s workers send for the trials in `trials`, and their deaths; `clock` is the executor's
    `now`. `ready` holds the events for `wait`, `saves` the saves owed, `ending` the worker that owes a stopped
    trial's last saves."""

    def __init__(self, pool: WorkerPool, trials: HostedTrials, clock: Callable[[], float]) -> None:
        self.pool, self.trials, self.clock = pool, trials, clock
        self.ready: list[StepEvent] = []  # events taken in and not yet handed to `wait`
        self.saves = SaveTracker()  # saves requested and not yet reported
        self.ending: dict[int, WorkerProcess] = {}  # stopped trial id -> the worker that still owes its saves

    def owe(self, trial_id: int, save: int | None) -> None:
        """A save of the trial was asked for (`save`, None: none): an event must report it."""
        if save is not None:
            self.saves.request(trial_id, save)

    def take(self, worker: WorkerProcess, message: Message) -> None:
        """A message from `worker`: events go to `ready`, snapshots to their trial's record, a reply to whoever
        asked."""
        if isinstance(message, Event):
            self.accept(message.event)
        elif isinstance(message, Snapshot):
            record = self.trials.get(message.trial_id)
            if record is not None and record.worker is not None:  # not stopped meanwhile
                record.snapshot_sent(message.state)  # None (none taken): an exploit asks for the state
        elif isinstance(message, Reply):
            self.pool.answer(worker, message.value)

    def accept(self, event: StepEvent) -> None:
        """Take in a step event (or a save report): the trial's record updated, the event ready for `wait`."""
        if (record := self.trials.get(event.trial_id)) is not None:
            record.reported(event)
        self.saves.report(event.saved)
        if not self.saves.owes(event.trial_id):
            self.ending.pop(event.trial_id, None)
        self.ready.append(event)

    def lost(self, trial_id: int, pid: int | None, saved: tuple[Checkpoint, ...] | None = None) -> None:
        """Report the saves the trial owed as failed (or `saved`, those given): their writer, a worker, is dead."""
        self.ready.append(self._lost(trial_id, pid, None, saved))

    def _lost(self, trial_id: int, pid: int | None, error: str | None,
              saved: tuple[Checkpoint, ...] | None = None) -> StepEvent:
        """The event that ends a trial's attempt on a dead worker (`error`; None: it reports saves only), with the
        saves it owed, failed (or `saved`, those given)."""
        if saved is None:
            saved = self.saves.lose(trial_id, LOST_SAVE)
        now = self.clock()
        return StepEvent(trial_id, None, error, now, now, os.uname().nodename, pid or 0, saved)

    def ended(self, trial_id: int, worker: WorkerProcess) -> None:
        """The trial was stopped on `worker`: the saves it owes are reported as they come, or failed now where the
        worker is dead."""
        if not worker.alive and self.saves.owes(trial_id):
            self.lost(trial_id, worker.process.pid)
        elif self.saves.owes(trial_id):
            self.ending[trial_id] = worker

    def died(self, worker: WorkerProcess, error: str | None = None, blame: tuple[int, str] | None = None) -> None:
        """`worker` is dead (or, its pipe broken, killed now): take in what it sent, fail the step of the trial whose
        code it ran (`blame`: that trial and the error; else read from its slot), relaunch its other trials on a
        live worker (the pool replaced; not while it closes), fail every save it owed but those the relaunches make
        again."""
        if not worker.alive:
            return
        burial = self.pool.bury(worker)
        for message in burial.messages:
            self.take(worker, message)
        self.pool.give_up_asks(worker)
        error, pid = error or burial.crash, burial.pid
        reason = f"worker process {pid} died (exit code {burial.exitcode})"
        if error is not None:
            reason = f"{reason}: {error}"
        if blame is None and (activity := worker.slot.read()) is not None:
            blame = (activity.trial_id, f"{reason}, running trial {activity.trial_id}'s {activity.name}")
        elif blame is not None and blame[0] in burial.stepped:  # its step ended as it was timed out: nobody to charge
            blame = None
        guilty = blame[0] if blame is not None and blame[0] in worker.trials else None
        if blame is not None and guilty is not None:
            self.trials.place(guilty, None)
            self.accept(self._lost(guilty, pid, blame[1]))
        innocent = sorted(worker.trials)
        for trial_id in sorted(t for t, w in self.ending.items() if w is worker):  # their final saves
            del self.ending[trial_id]
            self.lost(trial_id, pid)
        if self.pool.closing:
            for trial_id in innocent:
                self.trials.place(trial_id, None)
            return
        self.pool.replace_dead()
        for trial_id in innocent:
            self._relaunch(trial_id, pid, reason, unexplained=blame is None)

    def _relaunch(self, trial_id: int, pid: int | None, reason: str, unexplained: bool) -> None:
        """Host the trial of a dead worker again on a live one, from the newest state the driver holds; report the
        saves it owed that are lost. A trial relaunched after `MAX_RELAUNCHES` deaths charged to no trial
        (`unexplained`) since its last step fails instead."""
        lost = self.saves.lose(trial_id, LOST_SAVE)
        message, lost = self.trials[trial_id].relaunch(trial_id, lost, unexplained)
        if message is None:
            self.trials.place(trial_id, None)
            error = (f"{reason}; trial {trial_id} was hosted there, relaunched after {MAX_RELAUNCHES} earlier deaths "
                     "of its worker that no trial's code explained since its last step, and is charged for this one")
            self.accept(self._lost(trial_id, pid, error, lost))
            return
        if message.then is not None and message.then.save is not None:
            self.saves.request(trial_id, message.then.save)  # made again by the relaunch
        if lost:
            self.lost(trial_id, pid, lost)
        target = self.pool.least_loaded()
        self.trials.place(trial_id, target)
        self.pool.write(target, message)

    def take_ready(self) -> list[StepEvent]:
        """The events ready for `wait`, handed over (none left here)."""
        events, self.ready = self.ready, []
        return events
