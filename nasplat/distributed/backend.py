"""The base of every data-parallel backend: what a rank of a gang does around its trainer's steps."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


class Backend:
    """How a rank takes part in data-parallel training. This base is the single-worker case: it changes nothing.

    The Worker calls `begin` before each launch/exploit, the trainer calls `prepare` (through the context) during
    `setup`, the Worker calls `on_load` after loading a state and `end_step` after every trainer step (every
    rank at once, so backends may run collectives there); `end_step` returns metrics to merge into the step's.
    """

    name = "local"

    def __init__(self, rank: int = 0, world_size: int = 1, device: torch.device | str = "cpu",
                 options: Mapping[str, Any] | None = None) -> None:
        self.rank, self.world_size = rank, world_size
        self.device = device
        self.options = dict(options or {})
        self.epoch = 0

    def begin(self, epoch: int, *, new_trial: bool) -> None:
        """A launch (`new_trial`) or an exploit numbered `epoch` by the gang starts on every rank."""
        self.epoch = epoch

    def prepare(self, model: Any, optimizer: Any) -> tuple[Any, Any]:
        """The model and optimizer the trainer uses from now on, wired into the backend; the base: as they are."""
        return model, optimizer

    def on_load(self) -> None:
        """The trainer's state was just replaced (the same state on every rank)."""

    def end_step(self) -> dict[str, float]:
        """After a step on this rank: the backend's own metrics, added to the step's (rank 0's speak for the trial)."""
        return {}
