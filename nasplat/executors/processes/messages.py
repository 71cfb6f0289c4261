"""The messages between the `processes` executor's driver and its workers, pickled over one pipe per worker.

Each write of the driver is a list of requests, those its calls made since its last write to that worker (one
write, one wake-up of the worker, for a trial's `End` and the next one's `Launch`). The driver sends a worker the
calls on its trials (`Launch`, `Step`, `Adopt`, `End`; `Relaunch` for a trial whose
worker died), the questions it waits on (`ExploitState`, `Keep`, `Give`: the worker answers each with one `Reply`,
in order) and `Close`. A worker sends back step events (`Event`), the snapshots its steps took (`Snapshot`),
replies, and `Crash` where its loop broke. What a worker runs at each moment is not a message: it is written in
shared memory (`nasplat.executors.processes.child.ActivitySlot`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nasplat.executors.base import StepEvent
from nasplat.space import Config
from nasplat.storage.checkpoints import Checkpoint

# -- driver to worker ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Launch:
    """Build the trial's trainer (from `state`, or inheriting it) and queue its first step."""

    trial_id: int
    config: Config
    seed: int
    state: Any = None
    inherit: bool = False


@dataclass(frozen=True)
class Step:
    """Queue the trial's next step; with `snapshot`, first copy its state (sent back as a `Snapshot`); with
    `save=k`, first checkpoint it as step k."""

    trial_id: int
    snapshot: bool = False
    save: int | None = None


@dataclass(frozen=True)
class Adopt:
    """Load a donor's `state` (`fallback` where it cannot be), put `config` in effect, (save,) queue a step."""

    trial_id: int
    state: Any
    config: Config
    save: int | None = None
    fallback: Checkpoint | None = None


@dataclass(frozen=True)
class End:
    """End the trial (with `save=k`, checkpointing its final state as step k first)."""

    trial_id: int
    save: int | None = None


@dataclass(frozen=True)
class ExploitState:
    """Reply with what an exploit of the trial copies: its snapshot, else its state once its queued step ran."""

    trial_id: int
    fallback: Checkpoint | None = None


@dataclass(frozen=True)
class Keep:
    """End the trial as `End` does, and reply with its final state."""

    trial_id: int
    save: int | None = None


@dataclass(frozen=True)
class Give:
    """Reply with one of the `candidates` (trial ids) handed over, a `Given`, or None where none can be."""

    candidates: tuple[int, ...]


@dataclass(frozen=True)
class Relaunch:
    """Host again a trial whose worker died while it waited (not charged to it): build it from `state` (the newest
    state the driver holds, loaded whole or with `inherit`, as `Launch` does, without queueing a step), run `replay`
    steps without reporting them (the steps the trial made since that state, so that it stands where the engine
    left it), then handle `then` (the step it still owes the engine), if any."""

    trial_id: int
    config: Config
    seed: int
    state: Any
    inherit: bool
    replay: int
    then: Step | None = None


@dataclass(frozen=True)
class Close:
    """End the worker's loop."""


Request = Launch | Step | Adopt | End | ExploitState | Keep | Give | Relaunch | Close
ASKS = (ExploitState, Keep, Give)  # the requests the driver waits on: the worker sends one `Reply` to each

# -- worker to driver ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Given:
    """A trial handed over between two of its steps: stopped on its worker, to be launched from `state` elsewhere."""

    trial_id: int
    config: Config
    seed: int
    state: Any


@dataclass(frozen=True)
class Reply:
    """The answer to an `ASKS` request (None: the worker could not give one, e.g. a state that cannot be copied)."""

    value: Any


@dataclass(frozen=True)
class Snapshot:
    """The state a `Step(snapshot=True)` copied (None where it could not be taken: an exploit asks for the state)."""

    trial_id: int
    state: Any


@dataclass(frozen=True)
class Event:
    """A step event of one of the worker's trials."""

    event: StepEvent


@dataclass(frozen=True)
class Crash:
    """The worker's loop broke with this traceback: the driver takes it for dead."""

    error: str


Message = Reply | Snapshot | Event | Crash
