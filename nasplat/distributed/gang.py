"""Gangs: the Ray actors of one trial, reserved together in a placement group and reused between trials.

The expensive parts (the placement group, the actors, the process group, the parameter servers) are made once,
in `Gang.__init__` and `Gang.ready`; `launch` on a ready gang only builds the new trial's trainer on every rank.
A one-worker gang is a single actor without a placement group, and its first launch does not wait for the actor
to start (Ray queues the call), so many short trials start at once. torch is imported by the trainer, not here.
"""

from __future__ import annotations

import functools
import os
import socket
import sys
import time
import traceback
import uuid
from collections.abc import Mapping
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from nasplat.distributed.context import (GROUP_BACKENDS, DistributedContext, check_backend, check_options,
                                         make_backend, rank_seed, worker_device)
from nasplat.executors.base import Checkpoint
from nasplat.space import Config
from nasplat.storage import Storage, scratch_folder
from nasplat.trainer import Trainer

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


SAVED = "nasplat.saved"  # rank 0's metrics carry the checkpoints finished since its last call under this key


class TrialFailed(Exception):
    """A trainer raised; carries the checkpoints the worker finished writing before it gave up (`saved`)."""

    def __init__(self, message: str, saved: list[Checkpoint]) -> None:
        super().__init__(message)
        self.saved = saved

    def __reduce__(self) -> tuple[Any, ...]:
        return TrialFailed, (self.args[0], self.saved)


class Worker:
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
        kind = join_group(address, self.rank, self.world_size, self.device, self.impl.options["timeout_s"],
                          store=self.store)
        self.group_uid, self.group_inits = group_uid, self.group_inits + 1
        return kind

    def attach(self, servers: list[Any]) -> None:
        self.impl.attach(servers)

    def identity(self) -> dict[str, Any]:
        """What a test needs to tell that nothing was rebuilt: the pid and the process group this rank is in."""
        import torch.distributed as dist
        group = dist.group.WORLD if dist.is_initialized() else None
        return {"pid": os.getpid(), "group_uid": self.group_uid, "group_inits": self.group_inits,
                "group_object": id(group) if group is not None else 0, "trial_id": self.trial_id}

    def launch(self, trial_id: int, config: Config, seed: int, state: Any = None, epoch: int = 0,
               inherit: bool = False) -> dict[str, Any]:
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

    def step(self, save: int | None = None) -> dict[str, Any]:
        """One trainer step (after checkpointing the state as step `save`, if given)."""
        if save is not None:
            self.host.save(save)
        metrics = self._guard(self.host.step)
        metrics.update(self.impl.end_step())  # every rank takes part; rank 0's copy speaks for the trial
        saved = self.host.saved()
        if saved:
            metrics[SAVED] = saved
        return metrics

    def exploit(self, state: Any, config: Config, epoch: int = 0, save: int | None = None,
                fallback: Checkpoint | None = None) -> dict[str, Any]:
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
        """The trainer's state, packed for the object store (see `nasplat.distributed.packing`)."""
        return self.host.state()


@functools.cache
def _remote_worker() -> Any:
    """The Worker as a Ray actor class, made once per process so Ray exports it once."""
    return ray.remote(Worker)


class Gang:
    """`workers` actors in one placement group (`PACK` or `SPREAD`); rank 0's metrics speak for the trial.

    `backend` is "allreduce", "async" or "gossip" (ignored for one worker); `backend_options` are that backend's
    options (see `nasplat.distributed.context.OPTION_DEFAULTS`). `created` counts what the gang built, `startup_s`
    is the time that took (constructor and `ready`), and `last_setup_s` is what the latest `launch` paid of it:
    all of it for the gang's first trial, 0.0 for every later one.
    """

    def __init__(self, trainer_cls: type, *, workers: int = 1, backend: str = "allreduce", cpus_per_worker: float = 1.0,
                 gpus_per_worker: float = 0.0, strategy: str = "PACK", label: str = "nasplat",
                 backend_options: Mapping[str, Any] | None = None, checkpoints: str | None = None) -> None:
        begin = time.perf_counter()
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"`workers` must be an integer >= 1, got {workers=!r}")
        if strategy not in STRATEGIES:
            raise ValueError(f"`strategy` must be one of {list(STRATEGIES)}, got {strategy=!r}")
        if not cpus_per_worker > 0 or gpus_per_worker < 0:
            raise ValueError(f"need cpus_per_worker > 0 and gpus_per_worker >= 0, got {cpus_per_worker=}, "
                             f"{gpus_per_worker=}")
        self.workers, self.backend, self.label = workers, check_backend(backend), label
        self.checkpoints = checkpoints
        self.options = check_options(backend, backend_options)
        self.device = "cuda" if gpus_per_worker > 0 else "cpu"
        self.group = None
        actor = _remote_worker()
        if workers > 1:
            bundle = {"CPU": cpus_per_worker, **({"GPU": gpus_per_worker} if gpus_per_worker else {})}
            self.group = placement_group([dict(bundle)] * workers, strategy=strategy)
        try:
            self.actors = [
                actor.options(num_cpus=cpus_per_worker, num_gpus=gpus_per_worker, name=f"{label}/rank-{rank}",
                              scheduling_strategy=self._placement(rank)).remote(
                    trainer_cls, rank, workers, label, backend, self.options, self.device,
                    max(1, int(cpus_per_worker)), checkpoints)
                for rank in range(workers)
            ]
        except Exception:  # e.g. the label's actor names are taken: give the reservation back
            if self.group is not None:
                remove_placement_group(self.group)
            raise
        self.servers: list[Any] = []
        self.node, self.pid, self.node_id, self.group_uid = "", 0, "", ""
        self.created = {"placement_groups": int(workers > 1), "actors": workers, "process_groups": 0, "servers": 0}
        self.startup_s, self.last_setup_s = time.perf_counter() - begin, 0.0
        self.launches, self._epoch, self._ready = 0, 0, False

    def _placement(self, rank: int) -> Any:
        return None if self.group is None else PlacementGroupSchedulingStrategy(self.group, rank)

    def ready(self, timeout: float | None = None) -> None:
        """Wait until every actor is up, then form the process group (allreduce, gossip) or start the parameter
        servers (async); once per gang. Remembers rank 0's node and pid."""
        if self._ready:
            return
        begin = time.perf_counter()
        if self.group is not None:
            try:
                ray.get(self.group.ready(), timeout=timeout)
            except ray.exceptions.GetTimeoutError:
                raise TimeoutError(f"gang {self.label!r}: the placement group of {self.workers} bundles "
                                   f"{self.group.bundle_specs[0]} was not placed within {timeout} s") from None
        infos = ray.get([a.info.remote() for a in self.actors])
        (self.node, self.pid), self.node_id = infos[0], ray.get(self.actors[0].node_id.remote())
        if self.workers > 1 and self.backend in GROUP_BACKENDS:
            address = ray.get(self.actors[0].rendezvous.remote())
            self.group_uid = uuid.uuid4().hex
            ray.get([a.connect.remote(address, self.group_uid) for a in self.actors])
            self.created["process_groups"] += 1
        if self.workers > 1 and self.backend == "async":
            self._start_servers()
        self._ready = True
        self.startup_s += time.perf_counter() - begin

    def _start_servers(self) -> None:
        """`num_servers` parameter servers on rank 0's node (no CPU reserved: they mostly wait), restarted by Ray
        after a failure; each snapshots into the experiment's checkpoint storage (`ps/<gang>/shard-<i>.pkl`), or
        into a scratch folder on that node without one."""
        from nasplat.distributed.parameter_server import ParameterServer

        server = ray.remote(ParameterServer)
        placement = NodeAffinitySchedulingStrategy(self.node_id, soft=False)
        gang = uuid.uuid4().hex
        folder = (Storage(self.checkpoints).uri(f"ps/{gang}") if self.checkpoints
                  else str(scratch_folder(f"nasplat-ps-{gang[:8]}-")))
        self.servers = [server.options(num_cpus=0, max_restarts=-1, max_task_retries=0, scheduling_strategy=placement,
                                       name=f"{self.label}/ps-{index}").remote(
                            index, folder)
                        for index in range(self.options["num_servers"])]
        ray.get([s.info.remote() for s in self.servers])
        ray.get([a.attach.remote(self.servers) for a in self.actors])
        self.created["servers"] += len(self.servers)

    def launch(self, trial_id: int, config: Config, seed: int, state: Any = None,
               inherit: bool = False) -> list[ray.ObjectRef]:
        """Set trial `trial_id` up on every rank and run its first step; a ready gang builds nothing new.
        A multi-worker gang is made ready first (its ranks must meet); a one-worker gang is not waited for."""
        if self.workers > 1:
            self.ready()
        self.last_setup_s = self.startup_s if self.launches == 0 else 0.0  # only a gang's first trial pays it
        self.launches += 1
        self._epoch += 1
        return [a.launch.remote(trial_id, config, seed, state, self._epoch, inherit) for a in self.actors]

    def step(self, save: int | None = None) -> list[ray.ObjectRef]:
        """Step every rank; with `save=k`, rank 0 first checkpoints the trial's state as step k."""
        return [a.step.remote(save if rank == 0 else None) for rank, a in enumerate(self.actors)]

    def exploit(self, state: Any, config: Config, save: int | None = None,
                fallback: Checkpoint | None = None) -> list[ray.ObjectRef]:
        """Load `state` (a state dict, a `Checkpoint`, or `[ObjectRef]`: nested, so that each rank resolves it and
        loads `fallback` where the object is lost) on every rank, put `config` in effect, (save,) step."""
        self._epoch += 1
        return [a.exploit.remote(state, config, self._epoch, save if rank == 0 else None, fallback)
                for rank, a in enumerate(self.actors)]

    def finish(self, save: int | None = None) -> list[ray.ObjectRef]:
        """Rank 0 checkpoints the ended trial's state as step `save` (if given) and returns, once written, every
        checkpoint of the trial it has not reported yet."""
        return [self.actors[0].finish.remote(save)]

    def state(self) -> ray.ObjectRef:
        """Rank 0's trainer state in the object store, packed (`nasplat.distributed.packing.unpack` reads it)."""
        return self.actors[0].state.remote()

    def identity(self) -> list[dict[str, Any]]:
        """Per rank: pid, process-group uid, how many times it joined a group, the group object's id."""
        return ray.get([a.identity.remote() for a in self.actors])

    def kill(self) -> None:
        """Kill the actors and servers and give the placement group back; a second call does nothing."""
        if not self.actors:
            return
        if self.servers:
            try:
                ray.get([s.close.remote() for s in self.servers], timeout=5)
            except Exception:  # a dead server leaves a snapshot file behind; nothing else to do
                pass
        for a in [*self.actors, *self.servers]:
            ray.kill(a, no_restart=True)
        if self.group is not None:
            remove_placement_group(self.group)
        self.actors, self.servers, self._ready = [], [], False
