"""The `processes` driver's record of each trial its workers host (`HostedTrial`; all of them, `HostedTrials`): where
it is, what it owes, and enough to host it again elsewhere when its worker dies; and the final states of stopped
trials asked for and not yet sent (`AwaitedStates`).

A worker that dies takes its trials' in-memory states with it. The trial whose code was running there is charged
(the engine retries it like any failure); every other trial it hosted only waited, so the driver relaunches it on
a live worker without a word to the engine: from the newest state the driver holds (the state it was launched or
exploited from, a snapshot its worker sent, the state handed over between workers, or its latest durable
checkpoint), replaying the steps it made since, then the step the engine asked for and has not heard of yet. The
trial stands where it stood, its rows are untouched and its `max_failures` is not charged. (The replayed steps run
its trainer again: a trainer whose steps are not a function of its state and seed ends where the replay leads.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nasplat.executors.base import StepEvent
from nasplat.executors.processes.messages import Relaunch, Step
from nasplat.executors.processes.pipes import WorkerProcess
from nasplat.space import Config
from nasplat.storage.checkpoints import Checkpoint

MAX_RELAUNCHES = 3
"""How often a trial is relaunched uncharged after deaths of its worker that no trial's code explains (no code ran,
none timed out) without making a step in between; the next such death charges it (a death that keeps coming back
with it is its own, even where no code of its own seemed to run). Deaths charged to another trial do not count."""


@dataclass(eq=False)
class HostedTrial:
    """What the driver knows of one trial it hosts. Positions count the trial's reported steps since its launch.
    `worker` changes only through `HostedTrials.place`; the rest through the methods here."""

    config: Config
    seed: int
    state: Any = None  # the newest state the driver holds (a `Checkpoint` for a durable one), or None: its start
    inherit: bool = False  # `state` is a parent's, for `Trainer.inherit_state`
    worker: WorkerProcess | None = None  # hosting it; None once its worker died with its attempt charged
    running: bool = False  # a step was started and not yet reported
    snapshot: Any = None  # the state its worker sent at its latest `snapshot` step (None: none, or none taken)
    snapshots_due: int = 0  # snapshots asked for that its worker has not sent yet
    at: int = 0  # the position `state` stands at
    done: int = 0  # the position the trial stands at: its steps reported since its launch
    request: Step | None = None  # the step the engine asked for and has not been told of
    saves: dict[int, int] = field(default_factory=dict)  # save asked for (its step) -> the position it copies
    relaunches: int = 0  # relaunches after unexplained deaths since its last reported step

    def sent(self) -> None:
        """A request that starts a step of the trial (a launch, a step, an exploit) went to its worker."""
        self.running = True

    def stepped(self, trial_id: int, snapshot: bool, save: int | None) -> None:
        """The engine asked for the trial's next step (with a snapshot, a save of its current state)."""
        self.request = Step(trial_id, snapshot, save)
        if snapshot:
            self.snapshots_due += 1
        if save is not None:
            self.saves[save] = self.done

    def exploited(self, trial_id: int, state: Any, config: Config, save: int | None) -> None:
        """The trial loads a donor's `state` (None: its durable fallback, or nothing) and `config`, then steps on."""
        self.config, self.state, self.inherit, self.at, self.snapshot = config, state, False, self.done, None
        self.stepped(trial_id, False, save)

    def moved(self, config: Config, state: Any) -> None:
        """The trial was handed over between workers with its current `state`."""
        self.config, self.state, self.inherit, self.at = config, state, False, self.done

    def snapshot_sent(self, state: Any) -> None:
        """The trial's worker sent the snapshot its asked-for step took first (None: none could be taken)."""
        self.snapshots_due = max(0, self.snapshots_due - 1)
        self.snapshot = state
        if state is not None and self.done >= self.at:
            self.state, self.inherit, self.at = state, False, self.done

    def reported(self, event: StepEvent) -> None:
        """An event of the trial came: a step (or its error) answers the request; a durable save newer than the
        state held becomes the state to relaunch from."""
        for checkpoint in event.saved:
            position = self.saves.pop(checkpoint.step, None)
            if checkpoint.uri is not None and position is not None and position > self.at:
                self.state, self.inherit, self.at = checkpoint, False, position
        if event.metrics is not None:
            self.done, self.request, self.relaunches, self.running = self.done + 1, None, 0, False
        elif event.error is not None:
            self.request, self.running = None, False

    def relaunch(self, trial_id: int, lost: tuple[Checkpoint, ...], unexplained: bool
                 ) -> tuple[Relaunch | None, tuple[Checkpoint, ...]]:
        """The message that hosts the trial again after its worker died (`unexplained`: charged to no trial), and
        of the saves it owed (`lost`), those to report failed: the save its owed step asked for is made again by the
        relaunch (the caller asks for it again), as is its snapshot if one is due (not sent yet). None (nothing to
        relaunch) after `MAX_RELAUNCHES` unexplained deaths since its last step: it is charged."""
        if unexplained and self.relaunches >= MAX_RELAUNCHES:
            return None, lost
        self.relaunches += unexplained
        then = self.request
        if then is not None:
            again = then.save is not None and any(checkpoint.step == then.save for checkpoint in lost)
            if again:
                index = next(i for i, checkpoint in enumerate(lost) if checkpoint.step == then.save)
                lost = lost[:index] + lost[index + 1:]
            then = Step(trial_id, then.snapshot and self.snapshots_due > 0, then.save if again else None)
        if then is None or not then.snapshot:
            self.snapshots_due = 0
        message = Relaunch(trial_id, self.config, self.seed, self.state, self.inherit, self.done - self.at, then)
        return message, lost


class HostedTrials(dict[int, HostedTrial]):
    """The driver's record of every trial it hosts, by id (and of those whose attempt a death ended). Where a trial
    lives changes here only (`place`), its record and its workers' sets of trials together."""

    def place(self, trial_id: int, worker: WorkerProcess | None) -> None:
        """Host the trial on `worker` (None: nowhere, its attempt ended with its worker, or it ends)."""
        record = self[trial_id]
        if record.worker is not None:
            record.worker.trials.discard(trial_id)
        record.worker = worker
        if worker is not None:
            worker.trials.add(trial_id)

    def worker_of(self, trial_id: int) -> WorkerProcess | None:
        """The worker hosting the trial (None: none, or not a trial hosted)."""
        record = self.get(trial_id)
        return None if record is None else record.worker

    def waiting(self, worker: WorkerProcess) -> list[int]:
        """The worker's trials with a step asked for and not reported (running or queued there)."""
        return [t for t in worker.trials if self[t].running]

    def running(self) -> bool:
        """Whether a step of any trial was asked for and not reported."""
        return any(record.running for record in self.values())


class AwaitedStates:
    """The final states of stopped trials asked of their workers (`Keep`) whose replies have not come, by trial: the
    worker that owes each. A later ask for the same trial, or a drop, voids an earlier one (its reply is let go)."""

    def __init__(self) -> None:
        self.owed: dict[int, tuple[object, WorkerProcess]] = {}  # trial id -> (its ask's token, the worker)

    def expect(self, trial_id: int, worker: WorkerProcess, kept: dict[int, Any]) -> Callable[[Any], None]:
        """Note that `worker` owes the trial's final state; returns the answer that puts it into `kept` when it comes
        (None: there is none), unless the ask was voided meanwhile."""
        token = object()
        self.owed[trial_id] = (token, worker)

        def answer(state: Any) -> None:
            if trial_id in self.owed and self.owed[trial_id][0] is token:
                del self.owed[trial_id]
                if state is not None:
                    kept[trial_id] = state
        return answer

    def owed_by(self, trial_id: int) -> WorkerProcess | None:
        """The worker whose reply with the trial's final state has not come (None: none awaited)."""
        return self.owed[trial_id][1] if trial_id in self.owed else None

    def drop(self, keep: set[int]) -> None:
        """Let go of the states awaited but those of `keep`."""
        for trial_id in [t for t in self.owed if t not in keep]:
            del self.owed[trial_id]
