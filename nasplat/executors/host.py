"""One trial host: builds, steps, exploits and checkpoints the trainer of whichever trial runs now.

`LocalExecutor` holds one per running trial; on Ray, each rank of a gang (`nasplat.executors.ray.rank.RankActor`)
holds one for the actor's whole life. States move between hosts packed (`nasplat.executors.packing`): `load` copies a
packed state's tensors into the trainer's own, whatever the state came from (an exploit's donor, a kept parent, a
retry's handle or a durable `Checkpoint`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from nasplat.core.trees import copy_state
from nasplat.executors.packing import pack, unpack
from nasplat.space import Config
from nasplat.storage import Storage
from nasplat.storage.checkpoints import Checkpoint, CheckpointWriter, load_checkpoint
from nasplat.trainer import Trainer, WorkerContext, start


class TrialHost:
    """Hosts trainers of `trainer_cls`, one trial at a time. With `writer` (or `new_writer`, which makes one at the
    first save), `save` checkpoints the trainer's state there (the copy on the caller's thread, the write by the
    writer's)."""

    def __init__(self, trainer_cls: type, writer: CheckpointWriter | None = None,
                 new_writer: Callable[[], CheckpointWriter] | None = None) -> None:
        self.trainer_cls, self.writer, self.new_writer = trainer_cls, writer, new_writer
        self.trainer: Trainer | None = None
        self.trial_id = -1
        self.spare: list[Any] = []  # copies the writer is done with: the next save copies into one

    @classmethod
    def for_storage(cls, trainer_cls: type, checkpoints: str | None, *, background: bool = True) -> TrialHost:
        """A host whose checkpoints go to the folder or URI `checkpoints` (None: no checkpoints). Its writer (with
        the torch it imports and its thread) is made at the first save: a trial that never saves pays nothing."""
        if not checkpoints:
            return cls(trainer_cls)
        return cls(trainer_cls, new_writer=lambda: CheckpointWriter(Storage(checkpoints), background=background))

    @property
    def config(self) -> Config:
        assert self.trainer is not None, "no trial is hosted"
        return self.trainer.config

    @property
    def seed(self) -> int:
        """The hosted trial's seed."""
        assert self.trainer is not None, "no trial is hosted"
        return self.trainer.ctx.seed

    def build(self, trial_id: int, config: Config, ctx: WorkerContext, state: Any = None,
              inherit: bool = False) -> None:
        """Start trial `trial_id`'s trainer; load `state` (packed, plain, a `Checkpoint`, or a one-item list holding
        an object-store reference), or with `inherit` hand it to `Trainer.inherit_state`."""
        self.trial_id, self.trainer = trial_id, None  # drop the previous trial's trainer first (its memory, its DDP)
        trainer = start(self.trainer_cls(), config, ctx)
        self.trainer = trainer
        if state is not None:
            if inherit:
                trainer.inherit_state(unpack(pack(resolve_state(state))))
            else:
                self.load(state)

    def step(self) -> dict[str, Any]:
        """One step of the trainer; its metrics as a new dict (what else it returned fails the trial, named)."""
        assert self.trainer is not None, "no trial is hosted"
        metrics = self.trainer.step()
        if not isinstance(metrics, Mapping):
            raise TypeError(f"{type(self.trainer).__name__}.step() must return a mapping of metric names to values, "
                            f"got {type(metrics).__name__}: {metrics!r:.80}")
        return dict(metrics)

    def exploit(self, state: Any, config: Config, fallback: Checkpoint | None = None) -> None:
        """Load the donor's `state` (or, where it is lost, the durable `fallback`), then put `config` in effect."""
        assert self.trainer is not None, "no trial is hosted"
        self.load(state, fallback=fallback)
        self.trainer.config = config
        self.trainer.update_config(config)

    def load(self, state: Any, fallback: Checkpoint | None = None) -> None:
        """Load `state` whole, copying its tensors into the trainer's current ones where shape and dtype match."""
        assert self.trainer is not None, "no trial is hosted"
        state = resolve_state(state, fallback)
        self.trainer.load_state_dict(unpack(pack(state), into=self.trainer.state_dict()))

    def state(self) -> Any:
        """The trainer's state packed for the object store; it shares memory with the trainer's tensors, so it must
        be serialised before the trainer steps on (an actor method's return value is)."""
        assert self.trainer is not None, "no trial is hosted"
        return pack(self.trainer.state_dict())

    def copy(self) -> Any:
        """A copy of the trainer's state (CPU tensors) that its later steps leave alone."""
        assert self.trainer is not None, "no trial is hosted"
        return copy_state(self.trainer.state_dict())

    def save(self, step: int) -> None:
        """Checkpoint the trainer's current state as its step `step`: copy it now (into the memory of an earlier
        copy where one is free), write it in the background."""
        if self.writer is None and self.new_writer is not None:
            self.writer = self.new_writer()
        if self.writer is None:
            raise RuntimeError("this executor was opened without checkpoint storage; a save needs one")
        assert self.trainer is not None, "no trial is hosted"
        try:
            reuse = self.writer.supersede(self.trial_id)  # writes fell behind: the newer state replaces a queued one
            if reuse is None and self.spare:
                reuse = self.spare.pop()
            state = copy_state(self.trainer.state_dict(), into=reuse)
        except Exception as exc:  # noqa: BLE001 (e.g. a trainer without state_dict: the save fails, the trial goes on)
            self.writer.fail(self.trial_id, step, f"{type(exc).__name__}: {exc}")
            return
        self.writer.submit(self.trial_id, step, state, self.config, release=self._release)

    def _release(self, state: Any) -> None:
        """The writer is done with a copy: keep two for the next saves (list.append is atomic across threads)."""
        if len(self.spare) < 2:
            self.spare.append(state)

    def saved(self, *, wait: bool = False) -> list[Checkpoint]:
        """The checkpoints of the hosted trial written (or failed) since the last call; with `wait`, first wait
        for the writes still going on."""
        return [] if self.writer is None else self.writer.collect(self.trial_id, wait=wait)

    def close(self) -> None:
        self.trainer = None
        if self.writer is not None:
            self.writer.close()


def resolve_state(state: Any, fallback: Checkpoint | None = None) -> Any:
    """A state from what the executor passed: a `Checkpoint` is read from storage; a one-item list holds an
    object-store reference, resolved here so that its loss (the node that held it died) can be caught, and the
    durable `fallback` read instead."""
    if isinstance(state, list) and len(state) == 1 and type(state[0]).__name__ == "ObjectRef":
        import ray

        try:
            state = ray.get(state[0])
        except ray.exceptions.RayError:  # ObjectLostError, OwnerDiedError, the donor actor died with the object
            if fallback is None or fallback.uri is None:
                raise
            state = fallback
    if isinstance(state, Checkpoint):
        if state.uri is None:
            raise ValueError(f"checkpoint of trial {state.trial_id} at step {state.step} was never written "
                             f"({state.error})")
        return load_checkpoint(state.uri)
    return state
