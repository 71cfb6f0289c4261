"""The `ray` executor: trials on gangs of Ray actors, reused between trials, results gathered as they arrive."""

from __future__ import annotations

import os
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any

import ray
import ray.cloudpickle

from nasplat.distributed.gang import Gang
from nasplat.executors.base import Checkpoint, Executor, StepEvent
from nasplat.space import Config


@dataclass
class _Step:
    trial_id: int
    refs: list[ray.ObjectRef]
    start: float


@dataclass
class _Slot:
    gang: Gang
    info: ray.ObjectRef | None = None
    node: str = ""
    pid: int = 0
    healthy: bool = True
    snapshot: ray.ObjectRef | None = None  # the running trial's latest state snapshot


class RayExecutor(Executor):
    """Runs each trial on a gang of `workers` actors with `cpus_per_trial`/`gpus_per_trial` per worker.

    `concurrency` defaults to as many gangs as the cluster's CPUs hold. Ray is started on this machine
    unless it is already initialised, `address` is given or `RAY_ADDRESS` is set (then it attaches).
    A gang whose trial ended goes back to the pool and serves the next trial; one that failed is replaced.
    Idle gangs are released when no step finishes within `idle_release_s`, so gangs waiting for resources can start.
    """

    idle_release_s = 1.0

    def __init__(self, concurrency: int | None = None, *, cpus_per_trial: float = 1.0, gpus_per_trial: float = 0.0,
                 workers: int = 1, backend: str = "allreduce", strategy: str = "PACK",
                 backend_options: dict[str, Any] | None = None, address: str | None = None,
                 init_options: dict[str, Any] | None = None) -> None:
        if concurrency is not None and (not isinstance(concurrency, int) or concurrency < 1):
            raise ValueError(f"`concurrency` must be an integer >= 1 (or None for the cluster's CPUs), "
                             f"got {concurrency!r}")
        if not cpus_per_trial > 0:
            raise ValueError(f"`cpus_per_trial` must be > 0, got {cpus_per_trial!r}")
        self.requested_concurrency = concurrency
        self.concurrency = concurrency or 1
        self.gang_options = dict(workers=workers, backend=backend, cpus_per_worker=cpus_per_trial,
                                 gpus_per_worker=gpus_per_trial, strategy=strategy)
        if backend_options:
            self.gang_options["backend_options"] = dict(backend_options)
        self.address, self.init_options = address, dict(init_options or {})
        self.idle: list[_Slot] = []
        self.kept: dict[int, Any] = {}
        self.busy: dict[int, _Slot] = {}
        self.inflight: dict[ray.ObjectRef, _Step] = {}
        self.gangs_started = 0

    # -- lifecycle ---------------------------------------------------------------------------------
    def open(self, trainer: type, experiment: str, checkpoints: Any = None) -> None:
        if not ray.is_initialized():
            address = self.address or os.environ.get("RAY_ADDRESS")
            ray.init(address=address, **self.init_options)
        _ship_by_value(trainer)
        self.trainer_cls, self.experiment, self.checkpoints = trainer, experiment, checkpoints
        self.saves: list[Checkpoint] = []
        if self.requested_concurrency is None:
            cpus = ray.cluster_resources().get("CPU", 1)
            per_trial = self.gang_options["cpus_per_worker"] * self.gang_options["workers"]
            self.concurrency = max(1, int(cpus // per_trial))
        self.t0 = time.perf_counter()

    def reserve(self, slots: int) -> None:
        """Start gangs until `slots` are idle or busy, then wait for every idle one to be up."""
        while len(self.idle) + len(self.busy) < slots:
            self.idle.append(self._new_slot())
        for slot in self.idle:
            slot.gang.ready()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def close(self) -> None:
        for slot in self.idle + list(self.busy.values()):
            slot.gang.kill()
        self.idle, self.busy, self.inflight, self.kept = [], {}, {}, {}

    def _slot(self) -> _Slot:
        return self.idle.pop() if self.idle else self._new_slot()

    def _new_slot(self) -> _Slot:
        label = f"nasplat/{self.experiment}/gang-{self.gangs_started}"
        self.gangs_started += 1
        gang = Gang(self.trainer_cls, label=label, **self.gang_options)
        return _Slot(gang, info=gang.actors[0].info.remote())

    # -- trials ------------------------------------------------------------------------------------
    def launch(self, trial_id: int, config: Config, seed: int, state: Any = None, inherit: bool = False) -> None:
        slot = self._slot()
        slot.snapshot = None
        self.busy[trial_id] = slot
        self._track(trial_id, slot.gang.launch(trial_id, config, seed, state, inherit))

    def _save(self, trial_id: int, step: int | None) -> None:
        if step is not None:
            self.saves.append(Checkpoint(trial_id, step, None, "this executor does not write checkpoints yet"))

    def step(self, trial_id: int, snapshot: bool = False, save: int | None = None) -> None:
        self._save(trial_id, save)
        slot = self.busy[trial_id]
        if snapshot:  # rank 0 puts its state in the object store before it steps on; the driver holds the reference
            slot.snapshot = slot.gang.state()
        self._track(trial_id, slot.gang.step())

    def exploit(self, trial_id: int, donor_id: int, config: Config, save: int | None = None,
                fallback: Checkpoint | None = None) -> Any:
        self._save(trial_id, save)
        donor, receiver = self.busy[donor_id], self.busy[trial_id]
        state = donor.snapshot if donor.snapshot is not None else donor.gang.state()
        receiver.snapshot = None
        self._track(trial_id, receiver.gang.exploit(state, config))
        return state

    def stop(self, trial_id: int, keep_state: bool = False, save: int | None = None) -> None:
        self._save(trial_id, save)
        slot = self.busy.pop(trial_id, None)
        if slot is None:
            return
        if keep_state and slot.healthy:  # queued before the gang's next trial, so it reads this trial's state
            self.kept[trial_id] = slot.gang.state()
        if slot.healthy:
            self.idle.append(slot)
        else:
            slot.gang.kill()

    def _track(self, trial_id: int, refs: list[ray.ObjectRef]) -> None:
        self.inflight[refs[0]] = _Step(trial_id, refs, self.now())

    def wait(self) -> list[StepEvent]:
        if self.saves:
            saves, self.saves = self.saves, []
            return [StepEvent(c.trial_id, None, None, self.now(), self.now(), saved=(c,)) for c in saves]
        if not self.inflight:
            raise RuntimeError("wait() called with no step running")
        pending = list(self.inflight)
        ready, _ = ray.wait(pending, num_returns=1, timeout=self.idle_release_s if self.idle else None)
        if not ready:  # idle gangs may hold the CPUs a waiting gang needs (a retry after a lost node, oversubscription)
            for slot in self.idle:
                slot.gang.kill()
            self.idle = []
            ready, _ = ray.wait(pending, num_returns=1)
        more, _ = ray.wait(pending, num_returns=len(pending), timeout=0)
        return [self._collect(ref) for ref in dict.fromkeys(ready + more)]

    def _collect(self, ref: ray.ObjectRef) -> StepEvent:
        step = self.inflight.pop(ref)
        slot = self.busy.get(step.trial_id)
        metrics, error = None, None
        try:
            metrics = ray.get(step.refs)[0]
        except Exception as exc:  # the trainer raised, or an actor/node died
            error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            if slot is not None:
                slot.healthy = False
        if slot is not None and slot.info is not None:
            try:
                slot.node, slot.pid = ray.get(slot.info)[:2]
            except Exception:
                pass
            slot.info = None
        node, pid = (slot.node, slot.pid) if slot is not None else ("", 0)
        return StepEvent(step.trial_id, metrics, error, step.start, self.now(), node, pid)


def _ship_by_value(trainer: type) -> None:
    """Send the trainer's module with the class when workers may not import it (scripts, sys.path hacks)."""
    module = sys.modules.get(trainer.__module__)
    path = getattr(module, "__file__", None) or ""
    if module is None or module.__name__ == "__main__" or "site-packages" in path:
        return
    if module.__name__.split(".")[0] in ("nasplat", "search_spaces", "trainers"):
        return
    ray.cloudpickle.register_pickle_by_value(module)
