"""The one loop every executor shares: ask the controller, dispatch, gather, decide, record.

Rows and journal entries go out through `nasplat.outbox` in the order the controller saw them, each row after its
checkpoint, so that `nasplat resume` rebuilds the controller exactly by replaying them (`nasplat.replay`).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from nasplat.checkpoint import CheckpointPolicy
from nasplat.controllers.base import Controller, Decision, Exploit, Pause, Result, Stop, TrialSpec
from nasplat.executors.base import Checkpoint, Executor, StepEvent
from nasplat.metrics import MetricError, clean_metrics
from nasplat.outbox import Outbox
from nasplat.trials import Budget, ExperimentFailed, TrialRecord, is_int
from nasplat.results import ExperimentResult, better
from nasplat.storage import ExperimentFolder, Storage


class Engine:
    """Keeps `executor.concurrency` trials running until the budget is spent and every trial has ended."""

    def __init__(self, *, controller: Controller, executor: Executor, trainer: type, budget: Budget,
                 name: str = "experiment", seed: int = 0, max_failures: int = 0, max_failed_trials: int | None = 10,
                 folder: ExperimentFolder | None = None, checkpoint: CheckpointPolicy | None = None,
                 progress: bool = False) -> None:
        if not is_int(max_failures, 0):
            raise ValueError(f"`max_failures` must be an integer >= 0, got {max_failures!r}")
        if max_failed_trials is not None and not is_int(max_failed_trials, 0):
            raise ValueError(f"`max_failed_trials` must be an integer >= 0 or None, got {max_failed_trials!r}")
        if checkpoint is not None and folder is None:
            raise ValueError("checkpoints need `storage`: set `storage` or drop `checkpoint`")
        self.controller, self.executor, self.trainer, self.budget = controller, executor, trainer, budget
        self.name, self.seed, self.max_failures, self.max_failed_trials = name, seed, max_failures, max_failed_trials
        self.folder, self.policy, self.progress = folder, checkpoint, progress
        # every step must report these as finite real numbers: the objectives and the metrics constraints bound
        self.objectives: tuple[str, ...] = tuple(dict.fromkeys(
            [*controller.metrics, *(constraint.metric for constraint in controller.constraints)]))
        self.trials: dict[int, TrialRecord] = {}
        self.active: set[int] = set()  # ids of running trials
        self.outbox = Outbox(folder, self._recorded)
        # checkpoints replaced by a newer one of the same trial: new uri -> old; old ones whose successor a
        # recorded row names may go once that row is synced (before, a resume would still need them)
        self.superseded: dict[str, Checkpoint] = {}
        self.deletable: list[Checkpoint] = []
        self.clock_offset = 0.0
        self.exploits = 0
        self.failed_errors: list[tuple[int, str]] = []  # (trial, error) of trials that ended failed
        self.best_row: dict[str, Any] | None = None
        self._last_progress = 0.0
        # objects with on_row(engine, row), and optionally on_start(engine) / on_end(engine): dashboard metrics,
        # TensorBoard, MLflow
        self.listeners: list[Any] = []

    # -- the loop --------------------------------------------------------------------------------
    def run(self) -> ExperimentResult:
        """Run to the end of the budget; raises `ExperimentFailed` once more than `max_failed_trials` failed."""
        try:
            self.executor.open(self.trainer, self.name, self.folder.checkpoints if self.folder is not None else None)
            needed = getattr(self.controller, "min_concurrency", 1)
            if self.executor.concurrency < needed:
                raise ValueError(f"{type(self.controller).__name__} needs its {needed} members training side by side, "
                                 f"got concurrency={self.executor.concurrency}; raise concurrency to >= {needed}")
            if needed > 1:
                self.executor.reserve(needed)
            if self.progress and self.folder is not None:
                print(f"[nasplat {self.name}] results in {self.folder.location} · live view: nasplat serve "
                      f"{self.folder.path}", file=sys.stderr, flush=True)
            self._notify("on_start")
            for record in self.running():
                self._launch(record)
            while True:
                if not self.failed_out():
                    self._fill()
                if not self.active and not self.outbox.waiting:
                    break
                if self.failed_out() and self.active:
                    for trial_id in list(self.active):  # left running: `nasplat resume` may continue them
                        self.executor.stop(trial_id)
                        self.active.discard(trial_id)
                    continue
                for event in self.executor.wait():
                    self._handle(event)
                if self.folder is not None and self.folder.sync():
                    self._delete_superseded()
        finally:
            self._close()
        if self.failed_out():
            raise ExperimentFailed(self.failure_summary())
        return self.result()

    def _close(self) -> None:
        """Flush what may go out, release the folder and the executor, tell the listeners; each part runs even if
        an earlier one fails."""
        try:
            self.outbox.forget()
            self._print_progress(final=True)
        finally:
            try:
                if self.folder is not None:
                    self.folder.close()
                    self._delete_superseded()
            finally:
                try:
                    self.executor.close()
                finally:
                    self._notify("on_end")

    def _notify(self, hook: str) -> None:
        """Call `hook(engine)` on every listener that has it."""
        for listener in self.listeners:
            method = getattr(listener, hook, None)
            if method is not None:
                method(self)

    @property
    def path(self) -> Path | None:
        """The local experiment folder (the working copy, for a URI), or None without storage."""
        return self.folder.path if self.folder is not None else None

    def now(self) -> float:
        return self.clock_offset + self.executor.now()

    def running(self) -> list[TrialRecord]:
        return [self.trials[t] for t in sorted(self.active)]

    def time_left(self) -> bool:
        return self.budget.time_s is None or self.now() < self.budget.time_s

    def budget_left(self) -> bool:
        """Whether a new trial may start (a paused one may be resumed as long as there is time left)."""
        if self.budget.max_trials is not None and len(self.trials) >= self.budget.max_trials:
            return False
        return self.time_left()

    def failed_out(self) -> bool:
        """Whether more trials failed than `max_failed_trials` allows."""
        return self.max_failed_trials is not None and len(self.failed_errors) > self.max_failed_trials

    def failure_summary(self) -> str:
        first = "; ".join(f"trial {t}: {_last_line(e)}" for t, e in self.failed_errors[:3])
        return (f"{len(self.failed_errors)} trials failed, more than max_failed_trials={self.max_failed_trials}; "
                f"stopped. First errors: {first}")

    def _fill(self) -> None:
        while len(self.active) < self.executor.concurrency:
            promoted = self.controller.promote() if self.time_left() else None
            if promoted is not None:
                record = self.resume_trial(promoted)
                self.outbox.ask({"resume": promoted, "rows": None, "time": round(self.now(), 6)})
                kept = self.executor.kept.pop(promoted, None)
                if kept is not None:
                    record.restart = (kept, record.step)
                self._launch(record)
                continue
            if not self.budget_left():
                return
            spec = self.controller.ask()
            if spec is None:
                return
            record = self.add_trial(spec)
            self.outbox.ask({"ask": spec.trial_id, "rows": None, "time": round(self.now(), 6)})
            if spec.inherit_from is not None:
                record.inherit = self.executor.kept_state(spec.inherit_from)
            self._launch(record)

    def add_trial(self, spec: TrialSpec) -> TrialRecord:
        """Take on a trial the controller proposed."""
        if spec.trial_id in self.trials:
            raise RuntimeError(f"controller proposed trial id {spec.trial_id} twice")
        record = TrialRecord(spec.trial_id, spec.config, spec.parent_id)
        self.trials[spec.trial_id] = record
        self.active.add(spec.trial_id)
        return record

    def resume_trial(self, trial_id: int) -> TrialRecord:
        """Take a paused trial back on (the controller promoted it)."""
        record = self.trials.get(trial_id)
        if record is None or record.status != "paused":
            raise RuntimeError(f"controller promoted trial {trial_id}, which is not paused "
                               f"(status: {None if record is None else record.status})")
        record.status = "running"
        self.active.add(trial_id)
        return record

    def _launch(self, record: TrialRecord) -> None:
        """Start (or restart) the trial from the newest state it can reach: an in-memory state (an exploit's donor
        state, a paused trial's own) or its latest durable checkpoint, whichever is further (memory on a tie); else
        from scratch (or its parent's state)."""
        state, inherit = None, False
        memory, durable = record.restart, record.checkpoint
        if durable is not None and (memory is None or durable.step > memory[1]):
            state, record.step = durable, durable.step
        elif memory is not None:
            state, record.step = memory
        else:
            record.step = 0
            state, inherit = record.inherit, record.inherit is not None
        trial_seed = int(np.random.SeedSequence([self.seed, record.trial_id, record.attempt]).generate_state(1)[0])
        self.executor.launch(record.trial_id, record.config, trial_seed, state, inherit=inherit)

    # -- results ---------------------------------------------------------------------------------
    def _handle(self, event: StepEvent) -> None:
        for checkpoint in event.saved:
            self._saved(checkpoint)
        record = self.trials.get(event.trial_id)
        if (event.metrics is None and event.error is None) or record is None or record.trial_id not in self.active:
            self.outbox.flush()
            return
        if event.error is not None:
            self._fail(record, event, event.error, retry=True)
            return
        try:
            metrics = clean_metrics(event.metrics, self.objectives)
        except MetricError as exc:
            self._fail(record, event, str(exc), retry=False)
            return
        row = self._row(record, event, "running", record.step + 1, metrics)
        status, decision = self.advance(record, metrics, record.step + 1)
        exploit = isinstance(decision, Exploit) and status == "running"
        row["status"], row["donor_id"] = status, decision.donor_id if exploit else None
        if (rung := self.controller.rung_of(record.trial_id)) is not None:
            row["rung"] = rung
        perturbation = status == "running" and self.controller.snapshot_due(record.trial_id, record.step)
        save = record.step if self.policy is not None and self.policy.due(
            record.step, perturbation=perturbation, ending=status != "running") else None
        if status == "paused" and self.folder is not None:
            save = record.step  # a paused trial's state is kept durably always, in memory where it fits
        self.outbox.row(row, wait=(record.trial_id, save) if save is not None else None)
        if status == "paused":
            self.executor.stop(record.trial_id, keep_state=True, save=save)
        elif status != "running":
            self._release(record, save)
        elif exploit:
            donor = self.trials[decision.donor_id]
            handle = self.executor.exploit(record.trial_id, decision.donor_id, decision.config, save=save,
                                           fallback=donor.checkpoint)
            record.restart = (handle, record.step)
        else:
            self.executor.step(record.trial_id, snapshot=perturbation, save=save)

    def advance(self, record: TrialRecord, metrics: dict[str, Any], step: int) -> tuple[str, Decision]:
        """Hand a step's metrics to the controller and apply its decision to the record (no executor involved:
        resuming replays recorded rows through here). Returns the trial's new status and the decision."""
        record.step, record.metrics = step, metrics
        result = Result(metrics, step)
        decision = self.controller.on_result(record.trial_id, result)
        done = step - record.behind >= self.budget.max_steps or metrics.get("done") is True
        status = "completed" if done else "stopped" if isinstance(decision, Stop) else (
            "paused" if isinstance(decision, Pause) else "running")
        if status == "paused":
            record.status = "paused"
            self.active.discard(record.trial_id)
        elif status != "running":
            self.end(record, status, result)
        elif isinstance(decision, Exploit):
            self.exploits += 1
            record.config = decision.config
            if decision.donor_step is not None:  # it goes on from the donor's progress at that step
                record.behind = step - decision.donor_step + self.trials[decision.donor_id].behind
        return status, decision

    def end(self, record: TrialRecord, status: str, result: Result) -> None:
        """The trial ended: tell the controller."""
        record.status = status
        self.active.discard(record.trial_id)
        if status == "failed":
            record.error = result.error
            self.failed_errors.append((record.trial_id, result.error or "failed"))
        self.controller.tell(record.trial_id, result)

    def _fail(self, record: TrialRecord, event: StepEvent, error: str, *, retry: bool) -> None:
        self.outbox.forget(record.trial_id)  # its attempt's unfinished checkpoints will never be reported
        if retry and record.attempt < self.max_failures:
            self.outbox.row(self._row(record, event, "retried", record.step + 1, {}, error=error))
            record.attempt += 1
            if record.restart is not None and record.checkpoint is not None \
                    and record.checkpoint.step >= record.restart[1]:
                record.restart = None  # the in-memory state may be what was lost (its node died): take the durable one
            self.executor.stop(record.trial_id)
            self._launch(record)
            return
        self.outbox.row(self._row(record, event, "failed", record.step + 1, {}, error=error))
        self.end(record, "failed", Result({}, record.step + 1, failed=True, error=error))
        self._release(record, None)

    def _release(self, record: TrialRecord, save: int | None) -> None:
        """Stop an ended trial on the executor, keeping its state where the controller may want it as a parent."""
        parents = self.controller.parents()
        self.executor.stop(record.trial_id, keep_state=parents is not None and record.trial_id in parents, save=save)
        if parents is not None:
            self.executor.drop_states(parents | {t for t, r in self.trials.items() if r.status == "paused"})

    def _row(self, record: TrialRecord, event: StepEvent, status: str, step: int, metrics: dict[str, Any], *,
             error: str | None = None) -> dict[str, Any]:
        row: dict[str, Any] = {
            "trial_id": record.trial_id, "step": step, "attempt": record.attempt, "status": status,
            "config": record.config, "parent_id": record.parent_id, "donor_id": None,
            "start": self.clock_offset + event.start, "end": self.clock_offset + event.end,
            "node": event.node, "pid": event.pid, "error": error,
        }
        row.update(metrics)
        return row

    # -- recording and checkpoints -------------------------------------------------------------------
    @property
    def rows(self) -> list[dict[str, Any]]:
        """The rows recorded so far, in order."""
        return self.outbox.rows

    def _recorded(self, row: dict[str, Any]) -> None:
        """A row went out: note the best, tell the listeners."""
        if row.get("checkpoint") in self.superseded:
            self.deletable.append(self.superseded.pop(row["checkpoint"]))
        self.note_best(row)
        for listener in self.listeners:
            listener.on_row(self, row)
        self._print_progress()

    def note_best(self, row: dict[str, Any]) -> None:
        value = row.get(self.controller.metric)
        if row["status"] in ("failed", "retried") or not isinstance(value, (int, float)) or isinstance(value, bool):
            return
        if self.best_row is None or better(value, self.best_row[self.controller.metric], self.controller.mode):
            self.best_row = row

    def _saved(self, checkpoint: Checkpoint) -> None:
        """A requested checkpoint is durable (or failed): its row may go out, the trial's older one goes."""
        self.outbox.saved((checkpoint.trial_id, checkpoint.step), checkpoint.uri)
        if checkpoint.uri is None:
            if not (checkpoint.error or "").startswith("superseded"):  # a newer one of the trial took its turn
                print(f"[nasplat {self.name}] checkpoint of trial {checkpoint.trial_id} at step {checkpoint.step} "
                      f"failed: {_last_line(checkpoint.error or '')}", file=sys.stderr, flush=True)
            return
        record = self.trials.get(checkpoint.trial_id)
        if record is None:
            return
        previous, record.checkpoint = record.checkpoint, checkpoint
        if previous is not None and previous.uri != checkpoint.uri:
            self.superseded[checkpoint.uri] = previous  # deleted once a synced row names its successor
        if self.policy is not None and record.status in ("completed", "stopped"):
            self._prune()

    def _delete_superseded(self) -> None:
        """Delete the checkpoints whose successors synced rows name."""
        for checkpoint in self.deletable:
            _delete(checkpoint)
        self.deletable.clear()

    def _prune(self) -> None:
        """Keep the checkpoints of the `keep_best` best ended trials (and of every running or paused one); delete
        the rest."""
        assert self.policy is not None
        scored = [(r.metrics[self.controller.metric], r.trial_id) for r in self.trials.values()
                  if r.status in ("completed", "stopped") and r.checkpoint is not None
                  and isinstance(r.metrics.get(self.controller.metric), (int, float))]
        scored.sort(reverse=self.controller.mode == "max")
        for _, trial_id in scored[self.policy.keep_best:]:
            record = self.trials[trial_id]
            if record.checkpoint is not None:
                _delete(record.checkpoint)
                record.checkpoint = None

    def result(self) -> ExperimentResult:
        """The rows so far, ranked by the controller's objectives and constraints."""
        c = self.controller
        return ExperimentResult(list(self.rows), c.metric, c.mode, self.path, dict(self.trials), metrics=c.metrics,
                                modes=c.modes, constraints=c.constraints)

    # -- console ---------------------------------------------------------------------------------
    def progress_line(self) -> str:
        counts = self.status_counts()
        best = self.best_row
        best_text = f"best {self.controller.metric}={best[self.controller.metric]:.4g} (trial {best['trial_id']})" \
            if best else "no result yet"
        return (f"[nasplat {self.name}] {counts['completed'] + counts['stopped']} done · {counts['running']} running · "
                f"{counts['paused']} paused · {counts['failed']} failed · {best_text} · {self.now():.1f}s")

    def status_counts(self) -> dict[str, int]:
        counts = {"completed": 0, "stopped": 0, "running": 0, "paused": 0, "failed": 0}
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


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else text


def _delete(checkpoint: Checkpoint) -> None:
    """Delete a checkpoint's folder, and its trial's folder once empty; a failure only costs disk space."""
    try:
        Storage(checkpoint.uri).delete("")
        trial = Storage(checkpoint.uri.rsplit("/", 1)[0])
        if not trial.list():
            trial.delete("")
    except OSError:
        pass
