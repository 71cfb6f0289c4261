"""What the engine needs from the place trials run: launch, step, exploit, stop, wait."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from nasplat.space import Config


@dataclass(frozen=True)
class StepEvent:
    """One finished step of a trial: its metrics, or the error that ended the attempt."""

    trial_id: int
    metrics: dict[str, Any] | None
    error: str | None
    start: float
    end: float
    node: str = ""
    pid: int = 0


class Executor(ABC):
    """Runs trials of one trainer class; `concurrency` trials at once; reports steps as they finish."""

    concurrency: int
    kept: dict[int, Any]  # trial id -> final state handle (see `stop`)

    @abstractmethod
    def open(self, trainer: type, experiment: str) -> None:
        """Get ready to run `trainer` trials for the experiment named `experiment`."""

    def reserve(self, slots: int) -> None:
        """Start `slots` trial slots now and wait until they are up, so that trials launched together start
        together (PBT's members must train side by side). Executors whose slots cost nothing do nothing."""

    @abstractmethod
    def now(self) -> float:
        """Seconds since `open`, on this executor's clock (wall or simulated)."""

    @abstractmethod
    def launch(self, trial_id: int, config: Config, seed: int, state: Any = None, inherit: bool = False) -> None:
        """Set the trial up and start its first step. `state` (a handle from `exploit` or `kept_state`) is loaded
        whole, or with `inherit` passed to `Trainer.inherit_state` (a parent's state that may not fit)."""

    @abstractmethod
    def step(self, trial_id: int, snapshot: bool = False) -> None:
        """Start the trial's next step; with `snapshot`, first keep a copy of its current state for `exploit`."""

    @abstractmethod
    def exploit(self, trial_id: int, donor_id: int, config: Config) -> Any:
        """Copy `donor_id`'s state (its latest snapshot, else its current state) into the trial, put `config` in
        effect, start its next step.

        Returns a handle to the donor state it loaded: a retry of the trial restarts from it."""

    @abstractmethod
    def stop(self, trial_id: int, keep_state: bool = False) -> None:
        """End the trial and free what it held; with `keep_state`, keep a handle to its final state first."""

    def kept_state(self, trial_id: int) -> Any:
        """The final state kept by `stop(trial_id, keep_state=True)`, or None."""
        return self.kept.get(trial_id)

    def drop_states(self, keep: set[int]) -> None:
        """Let go of every kept state but those of `keep`."""
        for trial_id in [t for t in self.kept if t not in keep]:
            del self.kept[trial_id]

    @abstractmethod
    def wait(self) -> list[StepEvent]:
        """Block until at least one started step finishes; return every finished one."""

    def close(self) -> None:
        """Release everything."""
