"""Gangs: the Ray actors of one trial, reserved together in a placement group and reused between trials.

The expensive parts (the placement group, the actors, the process group, the parameter servers) are made once,
in `Gang.__init__` and `Gang.ready`; `launch` on a ready gang only builds the new trial's trainer on every rank.
A one-worker gang is a single actor without a placement group, and its first launch does not wait for the actor
to start (Ray queues the call), so many short trials start at once. torch is imported by the trainer, not here.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Mapping
from typing import Any, TypedDict

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from nasplat.core.checks import check_int
from nasplat.distributed.context import (
    GROUP_BACKENDS,
    check_backend,
    check_options,
)
from nasplat.executors.ray.rank import RankActor
from nasplat.space import Config
from nasplat.storage import Storage, scratch_folder
from nasplat.storage.checkpoints import Checkpoint

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


class _GangShape(TypedDict):
    workers: int
    backend: str
    cpus_per_worker: float
    gpus_per_worker: float
    strategy: str


class GangOptions(_GangShape, total=False):
    """The options of `Gang` that one executor makes all its gangs with (their keyword arguments)."""

    backend_options: Mapping[str, Any]


@functools.cache
def _remote_worker() -> Any:
    """`RankActor` as a Ray actor class, made once per process so Ray exports it once."""
    return ray.remote(RankActor)


class Gang:
    """`workers` actors in one placement group (`PACK` or `SPREAD`); rank 0's metrics speak for the trial. A step
    call (`launch`, `step`, `exploit`) gives one reference per rank to its `StepOutcome`.

    `backend` is "allreduce", "async" or "gossip" (ignored for one worker); `backend_options` are that backend's
    options (see `nasplat.distributed.context.OPTION_DEFAULTS`). `created` counts what the gang built, `startup_s`
    is the time that took (constructor and `ready`), and `last_setup_s` is what the latest `launch` paid of it:
    all of it for the gang's first trial, 0.0 for every later one.
    """

    def __init__(self, trainer_cls: type, *, workers: int = 1, backend: str = "allreduce", cpus_per_worker: float = 1.0,
                 gpus_per_worker: float = 0.0, strategy: str = "PACK", label: str = "nasplat",
                 backend_options: Mapping[str, Any] | None = None, checkpoints: str | None = None) -> None:
        begin = time.perf_counter()
        check_int("workers", workers, minimum=1)
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
                actor.options(num_cpus=cpus_per_worker, num_gpus=gpus_per_worker,
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
        """Rank 0's trainer state in the object store, packed (`nasplat.executors.packing.unpack` reads it)."""
        return self.actors[0].state.remote()

    def bind(self, trainer_cls: type, label: str, checkpoints: str | None) -> list[ray.ObjectRef]:
        """Serve another experiment: every rank hosts `trainer_cls` trials from now on and rank 0 writes their
        checkpoints to `checkpoints`; one reference per rank to its `(host, pid)`. The gang's next trial pays no
        set-up."""
        self.label, self.checkpoints = label, checkpoints
        self.launches = max(self.launches, 1)
        return [a.bind.remote(trainer_cls, label, checkpoints) for a in self.actors]

    def park(self) -> None:
        """Every rank drops its trainer and ends its checkpoint writer (not waited for; later calls queue after)."""
        for actor in self.actors:
            actor.park.remote()

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
            except Exception:  # noqa: BLE001, S110 (a dead server leaves a snapshot file behind; nothing else to do)
                pass
        for a in [*self.actors, *self.servers]:
            ray.kill(a, no_restart=True)
        if self.group is not None:
            remove_placement_group(self.group)
        self.actors, self.servers, self._ready = [], [], False
