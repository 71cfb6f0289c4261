"""The `ray` executor: trials on gangs of Ray actors, reused between trials, results gathered as they arrive."""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Sequence
from typing import Any

import ray

from nasplat.core.checks import check_int, check_real
from nasplat.executors.base import Executor, StepEvent
from nasplat.executors.ray import park
from nasplat.executors.ray.gang import Gang, GangOptions
from nasplat.executors.ray.rank import StepOutcome
from nasplat.executors.ray.slots import Call, Slot, ship_by_value
from nasplat.executors.saves import SaveTracker
from nasplat.space import Config
from nasplat.storage import Storage
from nasplat.storage.checkpoints import Checkpoint


class RayExecutor(Executor):
    """Runs each trial on a gang of `workers` actors with `cpus_per_trial`/`gpus_per_trial` per worker.

    `concurrency` defaults to as many gangs as the cluster's CPUs hold. Ray is started on this machine
    unless it is already initialised, `address` is given or `RAY_ADDRESS` is set (then it attaches).
    A gang whose trial ended goes back to the pool and serves the next trial; one that failed is replaced.
    Idle gangs are released when no step finishes within `idle_release_s`, so gangs waiting for resources can start.
    With `step_timeout_s`, a step call (a launch's setup and first step, a step, an exploit) that runs longer,
    counted from when its gang is up and done with the previous trial's saves, has the gang's actors killed and is
    reported as a failed step ("step timed out after N s"); the trial's next attempt gets a new gang.
    At `close`, healthy one-rank gangs are parked for `park_s` seconds (`nasplat.executors.ray.park`; 0: killed at
    once), and the next experiment of this driver that needs the same resources adopts them instead of starting
    actors.
    """

    idle_release_s = 1.0
    ray_dashboard = True
    supports_step_timeout = True

    def __init__(self, concurrency: int | None = None, *, cpus_per_trial: float = 1.0, gpus_per_trial: float = 0.0,
                 workers: int = 1, backend: str = "allreduce", strategy: str = "PACK",
                 backend_options: dict[str, Any] | None = None, address: str | None = None,
                 init_options: dict[str, Any] | None = None, park_s: float = 10.0,
                 step_timeout_s: float | None = None) -> None:
        self.step_timeout_s = check_real("step_timeout_s", step_timeout_s, minimum=0, strict=True, optional=True)
        if concurrency is not None:
            check_int("concurrency", concurrency, minimum=1, note="or None for the cluster's CPUs")
        if not cpus_per_trial > 0:
            raise ValueError(f"`cpus_per_trial` must be > 0, got {cpus_per_trial!r}")
        if not park_s >= 0:
            raise ValueError(f"`park_s` must be >= 0 (seconds idle gangs are kept after the run), got {park_s!r}")
        self.requested_concurrency = concurrency
        self.concurrency = concurrency or 1
        self.gang_options: GangOptions = {"workers": workers, "backend": backend, "cpus_per_worker": cpus_per_trial,
                                          "gpus_per_worker": gpus_per_trial, "strategy": strategy}
        if backend_options:
            self.gang_options["backend_options"] = dict(backend_options)
        self.address, self.init_options, self.park_s = address, dict(init_options or {}), park_s
        self.park_key = repr(sorted(self.gang_options.items()))  # parked gangs made with these serve this executor
        self.idle: list[Slot] = []
        self.kept: dict[int, Any] = {}
        self.busy: dict[int, Slot] = {}
        self.inflight: dict[ray.ObjectRef, Call] = {}
        self.saves = SaveTracker()  # saves requested and not yet reported
        self.lost: list[StepEvent] = []  # saves that died with their worker, reported by the next `wait`
        self.checkpoints: str | None = None
        self.gangs_started = 0

    # -- lifecycle ---------------------------------------------------------------------------------
    def open(self, trainer: type, experiment: str, checkpoints: Storage | None = None) -> None:
        if not ray.is_initialized():
            address = self.address or os.environ.get("RAY_ADDRESS")
            ray.init(address=address, **self.init_options)
        ship_by_value(trainer)
        self.trainer_cls, self.experiment = trainer, experiment
        self.checkpoints = checkpoints.location if checkpoints is not None else None  # workers write there
        if self.requested_concurrency is None:
            cpus = ray.cluster_resources().get("CPU", 1)
            per_trial = self.gang_options["cpus_per_worker"] * self.gang_options["workers"]
            self.concurrency = max(1, int(cpus // per_trial))
        self.t0 = time.perf_counter()
        self._adopt()

    def _adopt(self) -> None:
        """Take over parked gangs made with the same options (a one-rank gang only); kill every other parked gang,
        which holds resources this experiment may need."""
        gangs = park.adopt(self.park_key, self.concurrency if self.gang_options["workers"] == 1 else 0)
        label = f"nasplat/{self.experiment}/gang"
        bound = [(gang, gang.bind(self.trainer_cls, f"{label}-a{index}", self.checkpoints)[0])
                 for index, gang in enumerate(gangs)]
        for gang, ref in bound:
            try:
                node, pid = ray.get(ref)
            except Exception:  # noqa: BLE001 (its actor died while parked, or cannot load this trainer: start anew)
                gang.kill()
                continue
            self.idle.append(Slot(gang, node=node, pid=pid, up=self.now()))

    def reserve(self, slots: int) -> None:
        """Start gangs until `slots` are idle or busy, then wait for every idle one to be up."""
        while len(self.idle) + len(self.busy) < slots:
            self.idle.append(self._new_slot())
        for slot in self.idle:
            slot.gang.ready()
            slot.up = self.now() if slot.up is None else slot.up

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def close(self) -> None:
        """Park the healthy idle one-rank gangs (see `park_s`); kill every other."""
        parked = []
        for slot in self.idle:
            if self.park_s > 0 and slot.healthy and not slot.finishing and slot.gang.workers == 1:
                parked.append(slot.gang)
            else:
                slot.gang.kill()
        for slot in self.busy.values():  # a trial left running: its step may still run
            slot.gang.kill()
        park.park(parked, self.park_key, self.park_s)
        self.idle, self.busy, self.inflight, self.kept, self.lost = [], {}, {}, {}, []

    def _new_slot(self) -> Slot:
        label = f"nasplat/{self.experiment}/gang-{self.gangs_started}"
        self.gangs_started += 1
        gang = Gang(self.trainer_cls, label=label, checkpoints=self.checkpoints, **self.gang_options)
        return Slot(gang, info=gang.actors[0].info.remote())

    # -- trials ------------------------------------------------------------------------------------
    def launch(self, trial_id: int, config: Config, seed: int, state: Any = None, inherit: bool = False) -> None:
        """`state` may be a handle (an ObjectRef) or a durable `Checkpoint`, which the workers read themselves."""
        slot = self.idle.pop() if self.idle else self._new_slot()
        slot.snapshot = None
        self.busy[trial_id] = slot
        self._track(trial_id, slot, slot.gang.launch(trial_id, config, seed, state, inherit))

    def step(self, trial_id: int, snapshot: bool = False, save: int | None = None) -> None:
        slot = self.busy[trial_id]
        if snapshot:  # rank 0 puts its state in the object store before it steps on; the driver holds the reference
            slot.snapshot = slot.gang.state()
        self._request(trial_id, save)
        self._track(trial_id, slot, slot.gang.step(save))

    def exploit(self, trial_id: int, donor_id: int, config: Config, save: int | None = None,
                fallback: Checkpoint | None = None) -> Any:
        donor, receiver = self.busy.get(donor_id), self.busy[trial_id]
        state: Any  # the donor's state: an ObjectRef of its snapshot, else what `kept` holds, else `fallback`
        if donor is not None:
            state = donor.snapshot if donor.snapshot is not None else donor.gang.state()
        else:
            state = self.kept.get(donor_id, fallback)
        receiver.snapshot = None
        self._request(trial_id, save)
        # an ObjectRef goes nested in a list: the workers resolve it and read `fallback` if it is lost
        handle = [state] if isinstance(state, ray.ObjectRef) else state
        self._track(trial_id, receiver, receiver.gang.exploit(handle, config, save, fallback))
        return state

    def stop(self, trial_id: int, keep_state: bool = False, save: int | None = None) -> None:
        """End the trial; one whose step is still running (the run gave up waiting for it) loses its gang."""
        slot = self.busy.pop(trial_id, None)
        if slot is None:
            return
        running = any(c.slot is slot and not c.saves_only for c in self.inflight.values())
        if keep_state and slot.healthy and not running:  # queued before the gang's next trial: this trial's state
            self.kept[trial_id] = slot.gang.state()
        self._request(trial_id, save)
        if running:
            self._abandon(slot, "the trial was stopped while its step ran")
        elif slot.healthy:
            if self.saves.owes(trial_id):  # tracked like a step: `wait` reports these saves once written
                self._finish(trial_id, slot, save)
            self.idle.append(slot)
        else:
            self._lose_saves(trial_id, "the trial's worker failed before it confirmed the write", slot)
            slot.gang.kill()

    def _finish(self, trial_id: int, slot: Slot, save: int | None) -> None:
        refs = slot.gang.finish(save)
        slot.finishing += 1
        self.inflight[refs[0]] = Call(trial_id, refs, self.now(), slot, saves_only=True)

    def _request(self, trial_id: int, save: int | None) -> None:
        if save is not None:
            if self.checkpoints is None:
                raise RuntimeError("a save was requested from an executor opened without checkpoint storage")
            self.saves.request(trial_id, save)

    def _lose_saves(self, trial_id: int, reason: str, slot: Slot) -> None:
        """Report the trial's unconfirmed saves as failed (their worker is gone; a manifest may still exist)."""
        if lost := self.saves.lose(trial_id, reason):
            self.lost.append(StepEvent(trial_id, None, None, now := self.now(), now, slot.node, slot.pid, lost))

    def _track(self, trial_id: int, slot: Slot, refs: list[ray.ObjectRef]) -> None:
        call = self.inflight[refs[0]] = Call(trial_id, refs, self.now(), slot)
        if self.step_timeout_s is not None and slot.up is not None and not slot.finishing:
            call.deadline = call.start + self.step_timeout_s

    def wait(self, timeout: float | None = None) -> list[StepEvent]:
        """Every call finished (at least one), the steps past `step_timeout_s` as failed, or [] after `timeout`."""
        if not self.lost and not self.inflight:
            raise RuntimeError("wait() called with no step running")
        begin, released = self.now(), not self.idle  # idle gangs go once nothing finished within `idle_release_s`
        while not self.lost:
            probes = self._start_clocks()
            ends = {ref: call.deadline for ref, call in self.inflight.items() if call.deadline is not None}
            if expired := [ref for ref, end in ends.items() if self.now() >= end]:
                return [self._time_out(ref) for ref in expired] + self._take_lost()
            limits = [*ends.values(), *([] if timeout is None else [begin + timeout]),
                      *([] if released else [begin + self.idle_release_s])]
            pending = list(self.inflight)
            ready, _ = ray.wait(pending + probes, num_returns=1,
                                timeout=max(0.0, min(limits) - self.now()) if limits else None)
            if any(ref in self.inflight for ref in ready):
                more, _ = ray.wait(pending, num_returns=len(pending), timeout=0)
                events = [self._collect(ref) for ref in dict.fromkeys(ready + more) if ref in self.inflight]
                return events + self._take_lost()
            if not released and self.now() - begin >= self.idle_release_s:
                # idle gangs may hold the CPUs a waiting gang needs (a retry after a lost node, oversubscription)
                for slot in self.idle:
                    if not slot.finishing:  # one still writing an ended trial's checkpoints goes back later
                        slot.gang.kill()
                self.idle, released = [slot for slot in self.idle if slot.finishing], True
            if timeout is not None and self.now() - begin >= timeout:
                break
        return self._take_lost()

    def _take_lost(self) -> list[StepEvent]:
        lost, self.lost = self.lost, []  # saves that died with their worker
        return lost

    # -- step timeouts -----------------------------------------------------------------------------
    def _start_clocks(self) -> list[ray.ObjectRef]:
        """Start the timeout of each step whose gang is up (its actors answered) and free of earlier saves; returns
        the `info` calls of the gangs not seen up yet, for `wait` to watch."""
        probes: list[ray.ObjectRef] = []
        for call in self.inflight.values():
            slot = call.slot
            if self.step_timeout_s is None or call.saves_only or call.deadline is not None:
                continue
            if slot.up is None and slot.info is not None and not ray.wait([slot.info], timeout=0)[0]:
                probes.append(slot.info)
            elif not slot.finishing:
                slot.up = self.now() if slot.up is None else slot.up
                call.deadline = self.now() + self.step_timeout_s
        return list(dict.fromkeys(probes))

    def _time_out(self, ref: ray.ObjectRef) -> StepEvent:
        """The step `ref` ran past `step_timeout_s`: kill its gang, report it failed with its lost saves."""
        call, limit = self.inflight[ref], self.step_timeout_s
        self._abandon(call.slot, reason := f"the trial's step timed out after {limit:g} s", keep=call.trial_id)
        return StepEvent(call.trial_id, None, f"step timed out after {limit:g} s (step_timeout_s={limit:g}): its "
                         "gang's actors were killed", call.start, self.now(), call.slot.node, call.slot.pid,
                         self.saves.lose(call.trial_id, reason))

    def _abandon(self, slot: Slot, reason: str, keep: int | None = None) -> None:
        """Kill `slot`'s gang with its calls in flight; their trials' saves are lost (reported by the next `wait`),
        but those of trial `keep`, which the caller reports."""
        for ref in [r for r, c in self.inflight.items() if c.slot is slot]:
            if (trial_id := self.inflight.pop(ref).trial_id) != keep:
                self._lose_saves(trial_id, reason, slot)
        slot.finishing, slot.healthy = 0, False
        slot.gang.kill()

    def _collect(self, ref: ray.ObjectRef) -> StepEvent:
        call = self.inflight.pop(ref)
        slot = call.slot
        slot.finishing -= call.saves_only
        metrics: dict[str, Any] | None = None
        error: str | None = None
        saved: Sequence[Checkpoint] = ()
        try:
            value = ray.get(call.refs)[0]  # rank 0's
            if call.saves_only:
                saved = value  # the checkpoints `finish` returned
            else:
                outcome: StepOutcome = value
                metrics, saved = outcome.metrics, outcome.saved
        except Exception as exc:  # noqa: BLE001 (the trainer raised, or an actor/node died: the step's error)
            saved = list(getattr(getattr(exc, "cause", None), "saved", []))
            if call.saves_only:
                self._lose_saves(call.trial_id, f"the trial's worker died before it confirmed the write ({exc})",
                                 slot)
            else:
                error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
                slot.healthy = False
        if slot.info is not None:
            try:
                slot.node, slot.pid = ray.get(slot.info)[:2]
            except Exception:  # noqa: BLE001, S110 (its actor died: the call's own error says so; no node to show)
                pass
            slot.info = None
            slot.up = self.now() if slot.up is None else slot.up
        return StepEvent(call.trial_id, metrics, error, call.start, self.now(), slot.node, slot.pid,
                         self.saves.report(saved))
