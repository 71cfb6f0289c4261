"""The one loop every executor shares: ask the controller, dispatch, gather, decide, record, checkpoint."""

from __future__ import annotations

import json
import math
import pickle
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from nasplat.controllers.base import Controller, Exploit, Result, Stop, TrialSpec
from nasplat.executors.base import Executor, StepEvent
from nasplat.results import RESERVED, STATE_FILE, ExperimentResult, better, ResultStore, truncate_rows, write_atomic
from nasplat.space import Config


@dataclass
class TrialRecord:
    """The engine's view of one trial."""

    trial_id: int
    config: Config
    parent_id: int | None = None
    status: str = "running"  # running | completed | stopped | failed
    step: int = 0
    attempt: int = 0
    metrics: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    restart: tuple[Any, int] | None = None  # (state handle, step) to retry from, set by exploits
    inherit: Any = None  # the parent's final state handle the trial starts from (evolution's inherit_weights)


@dataclass
class Budget:
    """When to stop asking for trials: after `max_trials` trials and/or `time_s` seconds on the executor clock."""

    max_trials: int | None = None
    time_s: float | None = None
    max_steps: int = 1

    def __post_init__(self) -> None:
        if self.max_trials is None and self.time_s is None:
            raise ValueError("a budget needs `max_trials` and/or `time_budget_s`; got neither")
        if self.max_trials is not None and (not isinstance(self.max_trials, int) or self.max_trials < 1):
            raise ValueError(f"`max_trials` must be an integer >= 1, got {self.max_trials!r}")
        if self.time_s is not None and not self.time_s > 0:
            raise ValueError(f"`time_budget_s` must be > 0, got {self.time_s!r}")
        if not isinstance(self.max_steps, int) or self.max_steps < 1:
            raise ValueError(f"`max_steps` must be an integer >= 1, got {self.max_steps!r}")


class Engine:
    """Keeps `executor.concurrency` trials running until the budget is spent and every trial has ended."""

    def __init__(self, *, controller: Controller, executor: Executor, trainer: type, budget: Budget,
                 name: str = "experiment", seed: int = 0, max_failures: int = 0, storage: Path | None = None,
                 progress: bool = False, checkpoint_interval_s: float = 1.0) -> None:
        if not isinstance(max_failures, int) or max_failures < 0:
            raise ValueError(f"`max_failures` must be an integer >= 0, got {max_failures!r}")
        self.controller, self.executor, self.trainer, self.budget = controller, executor, trainer, budget
        self.name, self.seed, self.max_failures = name, seed, max_failures
        self.storage, self.progress, self.checkpoint_interval_s = storage, progress, checkpoint_interval_s
        self.trials: dict[int, TrialRecord] = {}
        self.active: set[int] = set()  # ids of running trials
        self.store = ResultStore(storage)
        self.clock_offset = 0.0
        self.exploits = 0
        self.best_row: dict[str, Any] | None = None
        self._last_checkpoint = self._last_progress = 0.0
        self._ended_since_checkpoint = False  # a trial ended: its rows must be covered by the next checkpoint
        # objects with on_row(engine, row), and optionally on_start(engine) / on_end(engine): dashboard metrics,
        # TensorBoard, MLflow
        self.listeners: list[Any] = []

    # -- the loop --------------------------------------------------------------------------------
    def run(self) -> ExperimentResult:
        self.executor.open(self.trainer, self.name)
        needed = getattr(self.controller, "min_concurrency", 1)
        if self.executor.concurrency < needed:
            raise ValueError(f"{type(self.controller).__name__} needs its {needed} members training side by side, "
                             f"got concurrency={self.executor.concurrency}; raise concurrency to >= {needed}")
        if needed > 1:
            self.executor.reserve(needed)
        self.checkpoint()
        if self.progress and self.storage is not None:
            print(f"[nasplat {self.name}] results in {self.storage} · live view: nasplat serve {self.storage}",
                  file=sys.stderr, flush=True)
        self._notify("on_start")
        try:
            for record in self.running():
                self._launch(record, fresh=True)
            while True:
                self._fill()
                if not self.active:
                    break
                for event in self.executor.wait():
                    self._handle(event)
                self._maybe_checkpoint()
        finally:
            self.checkpoint()
            self._print_progress(final=True)
            self.store.close()
            self.executor.close()
            self._notify("on_end")
        return self.result()

    def _notify(self, hook: str) -> None:
        """Call `hook(engine)` on every listener that has it."""
        for listener in self.listeners:
            method = getattr(listener, hook, None)
            if method is not None:
                method(self)

    def now(self) -> float:
        return self.clock_offset + self.executor.now()

    def running(self) -> list[TrialRecord]:
        return [self.trials[t] for t in self.active]

    def budget_left(self) -> bool:
        if self.budget.max_trials is not None and len(self.trials) >= self.budget.max_trials:
            return False
        return self.budget.time_s is None or self.now() < self.budget.time_s

    def _fill(self) -> None:
        while len(self.active) < self.executor.concurrency and self.budget_left():
            spec = self.controller.ask()
            if spec is None:
                return
            self._start(spec)

    def _start(self, spec: TrialSpec) -> None:
        if spec.trial_id in self.trials:
            raise RuntimeError(f"controller proposed trial id {spec.trial_id} twice")
        record = TrialRecord(spec.trial_id, spec.config, spec.parent_id)
        if spec.inherit_from is not None:
            record.inherit = self.executor.kept_state(spec.inherit_from)
        self.trials[spec.trial_id] = record
        self.active.add(spec.trial_id)
        self._launch(record, fresh=True)

    def _launch(self, record: TrialRecord, *, fresh: bool) -> None:
        state = None
        if fresh:
            record.step, record.restart = 0, None
        elif record.restart is not None:
            state, record.step = record.restart
        else:
            record.step = 0
        trial_seed = int(np.random.SeedSequence([self.seed, record.trial_id, record.attempt]).generate_state(1)[0])
        if state is None and record.inherit is not None:
            self.executor.launch(record.trial_id, record.config, trial_seed, record.inherit, inherit=True)
        else:
            self.executor.launch(record.trial_id, record.config, trial_seed, state)

    # -- results ---------------------------------------------------------------------------------
    def _handle(self, event: StepEvent) -> None:
        record = self.trials[event.trial_id]
        if record.status != "running":
            return
        if event.error is not None:
            self._fail(record, event, event.error, retry=True)
            return
        metrics = event.metrics or {}
        value = metrics.get(self.controller.metric)
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            self._fail(record, event, f"metric {self.controller.metric!r} is {value!r}: not a finite number "
                                      f"(reported metrics: {sorted(metrics)})", retry=False)
            return
        record.step += 1
        record.metrics = metrics
        result = Result(metrics, record.step)
        decision = self.controller.on_result(record.trial_id, result)
        done = record.step >= self.budget.max_steps or bool(metrics.get("done", False))
        status = "stopped" if isinstance(decision, Stop) and not done else "completed" if done else "running"
        donor = decision.donor_id if isinstance(decision, Exploit) and not done else None
        self._record(record, event, status, metrics=metrics, donor_id=donor)
        if status != "running":
            self._finish(record, status, result)
        elif isinstance(decision, Exploit):
            self.exploits += 1
            record.config = decision.config
            record.restart = (self.executor.exploit(record.trial_id, decision.donor_id, decision.config), record.step)
        else:
            self.executor.step(record.trial_id, snapshot=self.controller.snapshot_due(record.trial_id, record.step))

    def _fail(self, record: TrialRecord, event: StepEvent, error: str, *, retry: bool) -> None:
        if retry and record.attempt < self.max_failures:
            record.attempt += 1
            self.executor.stop(record.trial_id)
            self._launch(record, fresh=False)
            return
        record.error = error
        self._record(record, event, "failed", metrics=event.metrics or {}, step=record.step + 1, error=error)
        self._finish(record, "failed", Result(event.metrics or {}, record.step + 1, failed=True, error=error))

    def _finish(self, record: TrialRecord, status: str, result: Result) -> None:
        record.status = status
        self._ended_since_checkpoint = True
        self.active.discard(record.trial_id)
        self.controller.tell(record.trial_id, result)
        parents = self.controller.parents()
        self.executor.stop(record.trial_id, keep_state=parents is not None and record.trial_id in parents)
        if parents is not None:
            self.executor.drop_states(parents)

    def _record(self, record: TrialRecord, event: StepEvent, status: str, *, metrics: dict[str, Any],
                step: int | None = None, donor_id: int | None = None, error: str | None = None) -> None:
        row: dict[str, Any] = {
            "trial_id": record.trial_id, "step": record.step if step is None else step, "attempt": record.attempt,
            "status": status, "config": record.config, "parent_id": record.parent_id, "donor_id": donor_id,
            "start": self.clock_offset + event.start, "end": self.clock_offset + event.end,
            "node": event.node, "pid": event.pid, "error": error,
        }
        for key, value in metrics.items():
            row[f"metric.{key}" if key in RESERVED else key] = value
        if status != "running":
            record.status = status  # before the listeners see the row: they count the trial as ended
        self.store.append(row)
        value = row.get(self.controller.metric)
        if status != "failed" and isinstance(value, (int, float)) and math.isfinite(value) and (
                self.best_row is None or better(value, self.best_row[self.controller.metric], self.controller.mode)):
            self.best_row = row
        for listener in self.listeners:
            listener.on_row(self, row)
        self._print_progress()

    # -- persistence -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        trials = {tid: TrialRecord(r.trial_id, r.config, r.parent_id, r.status, r.step, r.attempt, r.metrics, r.error)
                  for tid, r in self.trials.items()}
        return {"controller": self.controller.state_dict(), "trials": trials, "clock": self.now(),
                "offset": self.store.offset(), "exploits": self.exploits}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a snapshot: rows written after it are dropped and its running trials start over."""
        self.controller.load_state_dict(state["controller"])
        self.trials, self.clock_offset, self.exploits = state["trials"], state["clock"], state["exploits"]
        self.active = {t for t, r in self.trials.items() if r.status == "running"}
        if self.storage is not None:
            self.store.close()
            truncate_rows(self.storage, state["offset"], {r.trial_id for r in self.running()})
            self.store = ResultStore(self.storage)

    def checkpoint(self) -> None:
        """Write the engine and controller state atomically (temp file + rename)."""
        if self.storage is None:
            return
        write_atomic(self.storage / STATE_FILE, pickle.dumps(self.state_dict()))
        self._last_checkpoint, self._ended_since_checkpoint = time.monotonic(), False

    def _maybe_checkpoint(self) -> None:
        """After every batch of results in which a trial ended (so that a resume never re-runs a finished trial),
        and every `checkpoint_interval_s` seconds while trials run."""
        if self.storage is not None and (self._ended_since_checkpoint or
                                         time.monotonic() - self._last_checkpoint >= self.checkpoint_interval_s):
            self.checkpoint()

    def result(self) -> ExperimentResult:
        return ExperimentResult(self.store.rows, self.controller.metric, self.controller.mode, self.storage,
                                dict(self.trials))

    # -- console ---------------------------------------------------------------------------------
    def progress_line(self) -> str:
        counts = self.status_counts()
        best = self.best_row
        best_text = f"best {self.controller.metric}={best[self.controller.metric]:.4g} (trial {best['trial_id']})" \
            if best else "no result yet"
        return (f"[nasplat {self.name}] {counts['completed'] + counts['stopped']} done · {counts['running']} running · "
                f"{counts['failed']} failed · {best_text} · {self.now():.1f}s")

    def status_counts(self) -> dict[str, int]:
        counts = {"completed": 0, "stopped": 0, "running": 0, "failed": 0}
        for record in self.trials.values():
            counts[record.status] += 1
        return counts

    def _print_progress(self, final: bool = False) -> None:
        if not self.progress:
            return
        now = time.monotonic()
        if final or now - self._last_progress >= 1.0:
            self._last_progress = now
            end = "\n" if final or not sys.stderr.isatty() else "\r"
            print(self.progress_line(), end=end, file=sys.stderr, flush=True)


def write_meta(folder: Path, **meta: Any) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(folder / "meta.json", json.dumps(meta, indent=2).encode())
