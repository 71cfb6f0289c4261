"""The `processes` driver's copy of each trial it hosts: enough to host it again elsewhere when its worker dies.

A worker that dies takes its trials' in-memory states with it. The trial whose code was running there is charged
(the engine retries it like any failure); every other trial it hosted only waited, so the driver relaunches it on
a live worker without a word to the engine: from the newest state the driver holds (the state it was launched or
exploited from, a snapshot its worker sent, the state handed over between workers, or its latest durable
checkpoint), replaying the steps it made since, then the step the engine asked for and has not heard of yet. The
trial stands where it stood, its rows are untouched and its `max_failures` is not charged. (The replayed steps run
its trainer again: a trainer whose steps are not a function of its state and seed ends where the replay leads.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nasplat.executors.base import StepEvent
from nasplat.executors.messages import Relaunch, Step
from nasplat.space import Config
from nasplat.storage.checkpoints import Checkpoint

MAX_RELAUNCHES = 3
"""How often a trial is relaunched uncharged after deaths of its worker that no trial's code explains (no code ran,
none timed out) without making a step in between; the next such death charges it (a death that keeps coming back
with it is its own, even where no code of its own seemed to run). Deaths charged to another trial do not count."""


@dataclass
class TrialCopy:
    """What the driver knows of one hosted trial. Positions count the trial's reported steps since its launch."""

    config: Config
    seed: int
    state: Any = None  # the newest state the driver holds (a `Checkpoint` for a durable one), or None: its start
    inherit: bool = False  # `state` is a parent's, for `Trainer.inherit_state`
    at: int = 0  # the position `state` stands at
    done: int = 0  # the position the trial stands at: its steps reported since its launch
    request: Step | None = None  # the step the engine asked for and has not been told of
    saves: dict[int, int] = field(default_factory=dict)  # save asked for (its step) -> the position it copies
    relaunches: int = 0  # relaunches after unexplained deaths since its last reported step


class TrialCopies:
    """The driver's `TrialCopy` of every trial its workers host, kept up to date by the executor's calls and the
    workers' messages; `relaunch` makes the message that hosts a trial again."""

    def __init__(self) -> None:
        self.copies: dict[int, TrialCopy] = {}

    def launched(self, trial_id: int, config: Config, seed: int, state: Any, inherit: bool) -> None:
        """The engine launched the trial (its first step is asked for)."""
        self.copies[trial_id] = TrialCopy(config, seed, state, inherit, request=Step(trial_id))

    def stepped(self, trial_id: int, snapshot: bool, save: int | None) -> None:
        """The engine asked for the trial's next step (with a snapshot, a save of its current state)."""
        if (copy := self.copies.get(trial_id)) is not None:
            copy.request = Step(trial_id, snapshot, save)
            if save is not None:
                copy.saves[save] = copy.done

    def exploited(self, trial_id: int, state: Any, config: Config, save: int | None) -> None:
        """The trial loads a donor's `state` (None: its durable fallback, or nothing) and `config`, then steps on."""
        if (copy := self.copies.get(trial_id)) is not None:
            copy.config, copy.state, copy.inherit, copy.at = config, state, False, copy.done
            self.stepped(trial_id, False, save)

    def moved(self, trial_id: int, config: Config, state: Any) -> None:
        """The trial was handed over between workers with its current `state`."""
        if (copy := self.copies.get(trial_id)) is not None:
            copy.config, copy.state, copy.inherit, copy.at = config, state, False, copy.done

    def snapshot(self, trial_id: int, state: Any) -> None:
        """The trial's worker sent the snapshot its asked-for step took first (None: none could be taken)."""
        if (copy := self.copies.get(trial_id)) is not None and state is not None and copy.done >= copy.at:
            copy.state, copy.inherit, copy.at = state, False, copy.done

    def reported(self, event: StepEvent) -> None:
        """An event of the trial came: a step (or its error) answers the request; a durable save newer than the
        state held becomes the state to relaunch from."""
        copy = self.copies.get(event.trial_id)
        if copy is None:
            return
        for checkpoint in event.saved:
            position = copy.saves.pop(checkpoint.step, None)
            if checkpoint.uri is not None and position is not None and position > copy.at:
                copy.state, copy.inherit, copy.at = checkpoint, False, position
        if event.metrics is not None:
            copy.done, copy.request, copy.relaunches = copy.done + 1, None, 0
        elif event.error is not None:
            copy.request = None

    def forget(self, trial_id: int) -> None:
        """The trial ended here."""
        self.copies.pop(trial_id, None)

    def request(self, trial_id: int) -> Step | None:
        """The step the trial owes the engine, or None."""
        copy = self.copies.get(trial_id)
        return None if copy is None else copy.request

    def relaunch(self, trial_id: int, lost: tuple[Checkpoint, ...], snapshot_due: bool, unexplained: bool
                 ) -> tuple[Relaunch | None, tuple[Checkpoint, ...]]:
        """The message that hosts the trial again after its worker died (`unexplained`: charged to no trial), and
        of the saves it owed (`lost`), those to report failed: the save its owed step asked for is made again by the
        relaunch (the caller asks for it again), as is its snapshot if `snapshot_due` (not sent yet). None (nothing
        to relaunch) for a trial not hosted, or after `MAX_RELAUNCHES` unexplained deaths since its last step: it
        is charged."""
        copy = self.copies.get(trial_id)
        if copy is None or unexplained and copy.relaunches >= MAX_RELAUNCHES:
            return None, lost
        copy.relaunches += unexplained
        then = copy.request
        if then is not None:
            again = then.save is not None and any(checkpoint.step == then.save for checkpoint in lost)
            if again:
                index = next(i for i, checkpoint in enumerate(lost) if checkpoint.step == then.save)
                lost = lost[:index] + lost[index + 1:]
            then = Step(trial_id, then.snapshot and snapshot_due, then.save if again else None)
        message = Relaunch(trial_id, copy.config, copy.seed, copy.state, copy.inherit, copy.done - copy.at, then)
        return message, lost
