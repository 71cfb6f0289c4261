"""What the engine needs from the place trials run: launch, step, exploit, stop, wait."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from nasplat.space import Config
from nasplat.storage.checkpoints import Checkpoint


@dataclass(frozen=True)
class StepEvent:
    """One finished step of a trial (its metrics, or the error that ended the attempt), and the checkpoints of the
    trial that became durable (or failed) since the last event. An event with neither metrics nor error only reports
    checkpoints (the final save of a trial that ended)."""

    trial_id: int
    metrics: dict[str, Any] | None
    error: str | None
    start: float
    end: float
    node: str = ""
    pid: int = 0
    saved: tuple[Checkpoint, ...] = ()


class Executor(ABC):
    """Runs trials of one trainer class; `concurrency` trials at once; reports steps as they finish."""

    concurrency: int
    kept: dict[int, Any]
    """Trial id -> the final state handle `stop(keep_state=True)` kept (only states: a state still on its way is
    not in it); read through `kept_state`, `take_kept`, `drop_states`."""
    gangs_started: int = 0
    """How many gangs (groups of Ray actors hosting a trial) the executor has started; 0 on executors without
    gangs. The Ray dashboard gauge `nasplat_gangs_started` shows it."""
    ray_dashboard: bool = False
    """Whether the run's progress is mirrored into Ray dashboard gauges: the executor runs on Ray."""
    supports_step_timeout: ClassVar[bool] = False
    """Whether the executor enforces `step_timeout_s`: a step running longer is ended and reported as failed."""
    step_timeout_s: float | None = None
    """The longest a step may run, in seconds (None: no limit): a constructor keyword of an executor that
    `supports_step_timeout` (`nasplat.experiment.build.make_executor` passes the run's), None on the others. The
    engine reads it (`nasplat.executors.step_timeout_in_force`), never sets it. A step that runs longer is killed and
    reported as a `StepEvent` whose error says "step timed out after N s (step_timeout_s=N)"."""
    virtual_clock: ClassVar[bool] = False
    """Whether `now` is a simulated clock (no step takes wall time): the engine then puts no deadline on running
    steps after the time budget (see `nasplat.engine.loop.Engine`)."""

    @abstractmethod
    def open(self, trainer: type, experiment: str, checkpoints: Any = None) -> None:
        """Get ready to run `trainer` trials for the experiment named `experiment`; `checkpoints` (a
        `nasplat.storage.Storage`, or None) is where `save` requests write trainer states."""

    def reserve(self, slots: int) -> None:
        """Start `slots` trial slots now and wait until they are up, so that trials launched together start
        together (PBT's members must train side by side). Executors whose slots cost nothing do nothing."""

    @abstractmethod
    def now(self) -> float:
        """Seconds since `open`, on this executor's clock (wall or simulated)."""

    @abstractmethod
    def launch(self, trial_id: int, config: Config, seed: int, state: Any = None, inherit: bool = False) -> None:
        """Set the trial up and start its first step. `state` (a handle from `exploit` or `kept_state`, or a durable
        `Checkpoint`) is loaded whole, or with `inherit` passed to `Trainer.inherit_state` (a parent's state that
        may not fit)."""

    @abstractmethod
    def step(self, trial_id: int, snapshot: bool = False, save: int | None = None) -> None:
        """Start the trial's next step; with `snapshot`, first keep a copy of its current state for `exploit`; with
        `save=k`, first copy its state and write it to storage as its checkpoint of step k, off the training path
        (the write goes on while the step runs; a later event reports it in `StepEvent.saved`)."""

    @abstractmethod
    def exploit(self, trial_id: int, donor_id: int, config: Config, save: int | None = None,
                fallback: Checkpoint | None = None) -> Any:
        """Copy `donor_id`'s state (its latest snapshot, else its current state) into the trial, put `config` in
        effect, (with `save=k`, checkpoint the loaded state as step k,) start its next step. Where the donor's
        in-memory state is lost (its node died), load its durable checkpoint `fallback` instead.

        Returns a handle to the donor state it loaded: a retry of the trial restarts from it."""

    @abstractmethod
    def stop(self, trial_id: int, keep_state: bool = False, save: int | None = None) -> None:
        """End the trial and free what it held; with `keep_state`, keep a handle to its final state first; with
        `save=k`, write its final state as its checkpoint of step k (reported by a later event, like `step`'s)."""

    def kept_state(self, trial_id: int) -> Any:
        """The final state kept by `stop(trial_id, keep_state=True)`, or None."""
        return self.kept.get(trial_id)

    def take_kept(self, trial_id: int) -> Any:
        """Hand over the final state kept by `stop(trial_id, keep_state=True)` and let go of it here (None if none
        is kept): a paused trial the controller promotes resumes from it."""
        return self.kept.pop(trial_id, None)

    def drop_states(self, keep: set[int]) -> None:
        """Let go of every kept state but those of `keep`."""
        for trial_id in [t for t in self.kept if t not in keep]:
            del self.kept[trial_id]

    @abstractmethod
    def wait(self, timeout: float | None = None) -> list[StepEvent]:
        """Block until at least one started step or requested save finishes; return every finished one. Every save
        requested is reported once, durable or failed. With `timeout`, return [] when nothing finished within that
        many seconds (an executor that runs steps in this thread may run one ready step regardless)."""

    def close(self) -> None:
        """Release everything."""
