"""One rank of a gang (`RankActor`, a Ray actor): it hosts the trainer of whichever trial its gang runs now, and
joins the gang's backend. `nasplat.executors.ray.gang.Gang` makes and drives the actors. What a rank's call returns:
a `StepOutcome`, or raises `TrialFailed`."""

from __future__ import annotations

import os
import socket
import sys
import traceback
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import ray

from nasplat.distributed.context import (
    DistributedContext,
    make_backend,
    rank_seed,
    worker_device,
)
from nasplat.space import Config
from nasplat.storage.checkpoints import Checkpoint
from nasplat.trainer import Trainer


class TrialFailed(Exception):
    """A trainer raised; carries the checkpoints the worker finished writing before it gave up (`saved`)."""

    def __init__(self, message: str, saved: list[Checkpoint]) -> None:
        super().__init__(message)
        self.saved = saved

    def __reduce__(self) -> tuple[Any, ...]:
        return TrialFailed, (self.args[0], self.saved)


@dataclass(frozen=True)
class StepOutcome(Mapping[str, Any]):
    """What one rank of a gang returns from a step: the trainer's `metrics` and the checkpoints of the trial that
    finished (durable or failed) since the rank's last call, `saved` (only rank 0 writes any). It reads as the
    mapping of its metrics, so a caller after the metrics alone needs nothing else."""

    metrics: dict[str, Any]
    saved: tuple[Checkpoint, ...] = field(default=())

    def __getitem__(self, key: str) -> Any:
        return self.metrics[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.metrics)

    def __len__(self) -> int:
        return len(self.metrics)


class RankActor:
    """One rank of a gang: hosts the trainer of whichever trial the gang runs now (a `TrialHost`). Rank 0 writes
    the trial's checkpoints to `checkpoints` (a folder or URI; None: no checkpoints) with a writer thread."""

    def __init__(self, trainer_cls: type, rank: int, world_size: int, label: str, backend: str = "allreduce",
                 options: Mapping[str, Any] | None = None, device: str = "cpu", threads: int = 1,
                 checkpoints: str | None = None) -> None:
        self.trainer_cls, self.rank, self.world_size, self.label = trainer_cls, rank, world_size, label
        self.backend = backend
        os.environ["OMP_NUM_THREADS"] = str(threads)
        if "torch" in sys.modules:  # the trainer's module imported it; a no-op trainer never pays for torch
            sys.modules["torch"].set_num_threads(threads)
        # One CPU worker needs no torch device; the distributed backends do.
        self.device = worker_device(device) if world_size > 1 or device != "cpu" else "cpu"
        self.impl = make_backend(backend, rank, world_size, self.device, options)
        from nasplat.executors.host import TrialHost  # here: the host imports this package (packing)

        self.host = TrialHost.for_storage(trainer_cls, checkpoints if rank == 0 else None)
        self.trial_id = -1
        self.group_uid, self.group_inits = "", 0
        self.store: Any = None  # rank 0: the process group's TCPStore, hosted from `rendezvous` on

    def bind(self, trainer_cls: type, label: str, checkpoints: str | None) -> tuple[str, int]:
        """Serve another experiment (a parked one-rank actor adopted): host `trainer_cls` trials, write checkpoints
        to `checkpoints`; returns `info()`."""
        from nasplat.executors.host import TrialHost

        self.host.close()
        self.trainer_cls, self.label, self.trial_id = trainer_cls, label, -1
        self.host = TrialHost.for_storage(trainer_cls, checkpoints if self.rank == 0 else None)
        return self.info()

    def park(self) -> None:
        """Drop the last trial's trainer (its memory) and finish the checkpoint writer: nothing runs until `bind`."""
        self.host.close()
        self.trial_id = -1

    def __repr__(self) -> str:  # the Ray dashboard and log prefixes show this
        # getattr: Ray also calls this when __init__ failed half-way, to name the actor in the error
        label, trial_id, rank = (getattr(self, k, "?") for k in ("label", "trial_id", "rank"))
        return f"{label}/trial-{trial_id}/rank-{rank}"

    @property
    def trainer(self) -> Trainer | None:
        return self.host.trainer

    def info(self) -> tuple[str, int]:
        return socket.gethostname(), os.getpid()

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def rendezvous(self) -> str:
        """Rank 0: host the process group's store on this node; its `host:port` for the other ranks."""
        from nasplat.distributed.allreduce import host_store
        self.store, address = host_store(ray.util.get_node_ip_address(), self.impl.options["timeout_s"])
        return address

    def connect(self, address: str, group_uid: str) -> str:
        """Join the gang's process group (once in this actor's life)."""
        from nasplat.distributed.allreduce import join_group
        assert not isinstance(self.device, str)  # a gang of several ranks has a torch device (see __init__)
        kind = join_group(address, self.rank, self.world_size, self.device, self.impl.options["timeout_s"],
                          store=self.store)
        self.group_uid, self.group_inits = group_uid, self.group_inits + 1
        return kind

    def attach(self, servers: list[Any]) -> None:
        """Hand the parameter servers to this rank's `AsyncBackend` (the gang's backend is `async_sgd`)."""
        from nasplat.distributed.async_sgd import AsyncBackend
        assert isinstance(self.impl, AsyncBackend), f"only an async backend has parameter servers, not {self.backend}"
        self.impl.attach(servers)

    def identity(self) -> dict[str, Any]:
        """What a test needs to tell that nothing was rebuilt: the pid and the process group this rank is in."""
        import torch.distributed as dist
        group = dist.group.WORLD if dist.is_initialized() else None
        return {"pid": os.getpid(), "group_uid": self.group_uid, "group_inits": self.group_inits,
                "group_object": id(group) if group is not None else 0, "trial_id": self.trial_id}

    def launch(self, trial_id: int, config: Config, seed: int, state: Any = None, epoch: int = 0,
               inherit: bool = False) -> StepOutcome:
        """Build trial `trial_id`'s trainer, load `state` (packed, a `Checkpoint`, or `[ObjectRef]`), step."""
        self.trial_id = trial_id
        self.impl.begin(epoch, new_trial=True)
        ctx = DistributedContext(trial_id=trial_id, rank=self.rank, world_size=self.world_size,
                                 seed=rank_seed(seed, self.rank), device=str(self.device), backend=self.backend,
                                 impl=self.impl)
        self._guard(lambda: self.host.build(trial_id, config, ctx, state, inherit))
        if state is not None:
            self.impl.on_load()
        return self.step()

    def step(self, save: int | None = None) -> StepOutcome:
        """One trainer step (after checkpointing the state as step `save`, if given): its metrics, and the trial's
        checkpoints finished since the last call."""
        if save is not None:
            self.host.save(save)
        metrics = self._guard(self.host.step)
        metrics.update(self.impl.end_step())  # every rank takes part; rank 0's copy speaks for the trial
        return StepOutcome(metrics, tuple(self.host.saved()))

    def exploit(self, state: Any, config: Config, epoch: int = 0, save: int | None = None,
                fallback: Checkpoint | None = None) -> StepOutcome:
        """Load the donor's state on this rank (`fallback` where the donor's object is lost), put `config` in
        effect, (checkpoint it as step `save,`) step; the actor and its group stay."""
        self.impl.begin(epoch, new_trial=False)
        self._guard(lambda: self.host.exploit(state, config, fallback))
        self.impl.on_load()
        return self.step(save)

    def _guard(self, action: Any) -> Any:
        """Run `action`; if the trainer raises, wait for this rank's checkpoint writes and raise `TrialFailed`
        carrying them (none of them goes unreported), else re-raise as it is."""
        try:
            return action()
        except Exception as exc:
            saved = self.host.saved(wait=True)
            if not saved:
                raise
            raise TrialFailed(traceback.format_exc(), saved) from exc

    def finish(self, save: int | None = None) -> list[Checkpoint]:
        """At a trial's end: checkpoint its final state as step `save` (if given), wait for every write of the
        trial and return the checkpoints not yet reported."""
        if save is not None:
            self.host.save(save)
        return self.host.saved(wait=True)

    def state(self) -> Any:
        """The trainer's state, packed for the object store (see `nasplat.executors.packing`)."""
        return self.host.state()
