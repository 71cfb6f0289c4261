"""The one loop every executor shares: ask the controller, dispatch, gather, decide, record.

Rows and journal entries go out through `nasplat.engine.outbox` in the order the controller saw them, each row after its
checkpoint, so that `nasplat resume` rebuilds the controller exactly by replaying them (`nasplat.engine.replay`). What
the engine knows and decides without an executor is `nasplat.engine.state.EngineState`, which `Engine` extends.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from nasplat.controllers.base import Exploit, Result, Searcher
from nasplat.core.checks import check_int
from nasplat.core.rows import Status
from nasplat.engine import console
from nasplat.engine.checkpoints import CheckpointBook
from nasplat.engine.listener import notify
from nasplat.engine.records import Budget, ExperimentFailed, TrialRecord
from nasplat.engine.result import ExperimentResult
from nasplat.engine.state import EngineState
from nasplat.engine.step_metrics import MetricError, clean_metrics
from nasplat.executors import reserve_members, step_timeout_in_force
from nasplat.executors.base import Executor, StepEvent
from nasplat.storage import ExperimentFolder
from nasplat.storage.checkpoints import Checkpoint, CheckpointPolicy
from nasplat.trainer import Trainer


class Engine(EngineState):
    """Keeps `executor.concurrency` trials running until the budget is spent and every trial has ended (or, past
    the time budget, until its grace is over: see `Budget.deadline`; not on a simulated clock, whose steps take no
    wall time: `Executor.virtual_clock`)."""

    def __init__(self, *, controller: Searcher, executor: Executor, trainer: type[Trainer], budget: Budget,
                 name: str = "experiment", seed: int = 0, max_failures: int = 0, max_failed_trials: int | None = 10,
                 folder: ExperimentFolder | None = None, checkpoint: CheckpointPolicy | None = None,
                 progress: bool = False) -> None:
        check_int("max_failures", max_failures, minimum=0)
        check_int("max_failed_trials", max_failed_trials, minimum=0, optional=True)
        if checkpoint is not None and folder is None:
            raise ValueError("checkpoints need `storage`: set `storage` or drop `checkpoint`")
        # the executor's timeout is the one in force; the budget's grace follows it
        budget = dataclasses.replace(budget, step_timeout_s=step_timeout_in_force(executor, budget.step_timeout_s))
        super().__init__(controller, budget, max_failed_trials=max_failed_trials, folder=folder,
                         deterministic=trainer.deterministic)
        self.executor, self.trainer = executor, trainer
        self.name, self.seed, self.max_failures = name, seed, max_failures
        self.policy, self.progress = checkpoint, progress
        self.book = CheckpointBook(checkpoint, self.home)  # which checkpoints are written, which go, and when
        self.printer = console.ProgressPrinter(self.progress_line if progress else None)  # at most once a second
        # `nasplat.engine.listener.Listener`s, or objects with some of its hooks: dashboard metrics,
        # TensorBoard, MLflow
        self.listeners: list[Any] = []

    # -- the loop --------------------------------------------------------------------------------
    def run(self) -> ExperimentResult:
        """Run to the end of the budget; raises `ExperimentFailed` once more than `max_failed_trials` failed."""
        try:
            self.executor.open(self.trainer, self.name, self.folder.checkpoints if self.folder is not None else None)
            deadline = None if self.executor.virtual_clock else self.budget.deadline(self.now())
            reserve_members(self.executor, self.controller.min_concurrency, type(self.controller).__name__)
            if self.progress and self.folder is not None:
                console.say(self.name, f"results in {self.folder.location} · live view: nasplat serve {self.folder.path}")
            notify(self.listeners, "on_start", self)
            for record in self.running():
                self._launch(record)
            while True:
                if not self.failed_out():
                    self._fill()
                if not self.active and not self.outbox.waiting:
                    break
                if self.failed_out() and self.active:
                    self._leave_running()
                    continue
                timeout = deadline - self.now() if deadline is not None and self.active else None
                if timeout is not None and timeout <= 0:
                    self._leave_running(after_deadline=True)
                    continue
                if self.answers.pending:  # steps answered from the record (`answers`) come first
                    events = [self.answers.pending.popleft()]
                elif timeout is None:
                    events = self.executor.wait()
                else:
                    events = self.executor.wait(timeout=timeout)
                for event in events:
                    self._handle(event)
                if self.folder is not None and self.folder.sync():
                    self.book.delete_superseded()
        finally:
            self._close()
        if self.failed_out():
            raise ExperimentFailed(self.failure_summary())
        return self.result()

    def _leave_running(self, *, after_deadline: bool = False) -> None:
        """Stop every running trial on the executor (a step in flight is abandoned) and leave it running in the
        record: `nasplat resume` may continue it."""
        stopped = sorted(self.active)
        self.answers.pending.clear()
        for trial_id in stopped:
            if trial_id not in self.answers.answering:
                self.executor.stop(trial_id)
            self.active.discard(trial_id)
        if after_deadline:
            console.say(self.name, f"time budget of {self.budget.time_s:g} s spent and its grace of "
                        f"{self.budget.grace_s:g} s over: stopped the trials still running {stopped}, left resumable "
                        "(nasplat resume continues them)")

    def _close(self) -> None:
        """Flush what may go out, release the folder and the executor, tell the listeners; each part runs even if
        an earlier one fails."""
        try:
            self.outbox.forget()
            self.printer.print(final=True)
        finally:
            self._report_lost_checkpoints()
            try:
                if self.folder is not None:
                    self.folder.close()
                    self.book.delete_superseded()
            finally:
                try:
                    self.executor.close()
                finally:
                    notify(self.listeners, "on_end", self)

    def now(self) -> float:
        """The experiment's clock: seconds on the executor's clock, plus those of the runs before a resume."""
        return self.clock_offset + self.executor.now()

    def time_left(self) -> bool:
        """Whether the time budget (if any) is not spent yet."""
        return self.budget.time_s is None or self.now() < self.budget.time_s

    def budget_left(self) -> bool:
        """Whether a new trial may start (a paused one may be resumed as long as there is time left)."""
        if self.budget.max_trials is not None and len(self.trials) >= self.budget.max_trials:
            return False
        return self.time_left()

    def _fill(self) -> None:
        while len(self.active) < self.executor.concurrency:
            promoted = self.controller.promote() if self.time_left() else None
            if promoted is not None:
                record = self.resume_trial(promoted)
                self.outbox.ask({"resume": promoted, "rows": None, "time": round(self.now(), 6)})
                kept = self.executor.take_kept(promoted)
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

    def _launch(self, record: TrialRecord) -> None:
        """Start (or restart) the trial from the newest state it can reach (`TrialRecord.start`); without one,
        answer it from the record where a trial of an equal config completed (`answers`), else start it from
        scratch (or its parent's state)."""
        start, inherit = record.start(), False
        if start is not None:
            state, record.step = start
        elif record.inherit is None and self.answers.enabled and self.answers.answer_next(record, self.executor.now()):
            return
        else:
            record.step = 0
            state, inherit = record.inherit, record.inherit is not None
        self.executor.launch(record.trial_id, record.config, record.seed(self.seed), state, inherit=inherit)

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
        row = record.row(event, Status.RUNNING, record.step + 1, metrics, clock_offset=self.clock_offset)
        source = self.answers.answering.get(record.trial_id) if self.answers.enabled else None
        status, decision = self.advance(record, metrics, record.step + 1)
        exploit = decision if isinstance(decision, Exploit) and status == Status.RUNNING else None
        row["status"], row["donor_id"] = status, exploit.donor_id if exploit is not None else None
        if (rung := self.controller.rung_of(record.trial_id)) is not None:
            row["rung"] = rung
        if source is not None:
            self._record_answer(record, row, status, source, exploit is not None)
            return
        perturbation = status == Status.RUNNING and self.controller.snapshot_due(record.trial_id, record.step)
        save = self.book.save_step(record.step, status, perturbation=perturbation, stored=self.folder is not None)
        self.outbox.row(row, wait=(record.trial_id, save) if save is not None else None)
        if status == Status.PAUSED:
            self.executor.stop(record.trial_id, keep_state=True, save=save)
        elif status != Status.RUNNING:
            self._release(record, save)
        elif exploit is not None:
            donor = self.trials[exploit.donor_id]
            handle = self.executor.exploit(record.trial_id, exploit.donor_id, exploit.config, save=save,
                                           fallback=donor.checkpoint)
            record.restart = (handle, record.step)
        else:
            self.executor.step(record.trial_id, snapshot=perturbation, save=save)

    def _record_answer(self, record: TrialRecord, row: dict[str, Any], status: Status, source: int,
                       exploit: bool) -> None:
        """Record a step answered from trial `source`'s rows and go on: the next step answered likewise; nothing
        to checkpoint or stop on the executor (a paused one is answered on from where it stands when promoted)."""
        if exploit:  # `answers` is off for searches that exploit (`min_concurrency > 1`)
            raise RuntimeError(f"trial {record.trial_id}, answered from the record, was told to exploit")
        row["cached_from"] = source
        self.outbox.row(row)
        if status == Status.RUNNING:
            self.answers.answer_next(record, self.executor.now())
        elif status != Status.PAUSED:
            self._release(record, None, hosted=False)

    def _fail(self, record: TrialRecord, event: StepEvent, error: str, *, retry: bool) -> None:
        self.outbox.forget(record.trial_id)  # its attempt's unfinished checkpoints will never be reported
        if retry and record.attempt < self.max_failures:
            self.outbox.row(record.row(event, Status.RETRIED, record.step + 1, {}, clock_offset=self.clock_offset,
                                       error=error))
            record.attempt += 1
            if record.restart is not None and record.checkpoint is not None \
                    and record.checkpoint.step >= record.restart[1]:
                record.restart = None  # the in-memory state may be what was lost (its node died): take the durable one
            self.executor.stop(record.trial_id)
            self._launch(record)
            if self.best_row is not None and self.best_row["trial_id"] == record.trial_id:
                self.recount_best(record.trial_id, record.step)  # the failed attempt's later steps count no more
            return
        self.outbox.row(record.row(event, Status.FAILED, record.step + 1, {}, clock_offset=self.clock_offset,
                                   error=error))
        self.end(record, Status.FAILED, Result({}, record.step + 1, failed=True, error=error))
        self._release(record, None)

    def _release(self, record: TrialRecord, save: int | None, *, hosted: bool = True) -> None:
        """Stop an ended trial on the executor (where it is `hosted`), keeping its state where the controller may
        want it as a parent."""
        parents = self.controller.parents()
        if hosted:
            self.executor.stop(record.trial_id, keep_state=parents is not None and record.trial_id in parents,
                               save=save)
        if parents is not None:
            self.executor.drop_states(parents | {t for t, r in self.trials.items() if r.status == Status.PAUSED})

    # -- recording and checkpoints -------------------------------------------------------------------
    def _recorded(self, row: dict[str, Any]) -> None:
        """A row went out: its checkpoint's predecessor may go once synced; note the best, tell the listeners."""
        self.book.recorded(row)
        super()._recorded(row)
        notify(self.listeners, "on_row", self, row)
        self.printer.print()

    def _saved(self, checkpoint: Checkpoint) -> None:
        """A requested checkpoint is durable (or failed): its row may go out, naming it relative to the experiment
        folder, and the trial's older one goes. The first three failed writes are printed, the run's end counts
        them all (`_report_lost_checkpoints`)."""
        recorded = self.recorded_location(checkpoint.uri) if checkpoint.uri is not None else None
        superseded = (checkpoint.error or "").startswith("superseded")  # a newer one of the trial took its turn
        failure = console.last_line(checkpoint.error or "no error given") if recorded is None and not superseded \
            else None
        record = self.trials.get(checkpoint.trial_id) if checkpoint.uri is not None else None
        if record is not None:  # before its row goes out: the older one goes once a synced row names this one
            previous, record.checkpoint = record.checkpoint, checkpoint
            self.book.replaced(previous, checkpoint, recorded)
        self.outbox.saved((checkpoint.trial_id, checkpoint.step), recorded, failure)
        if checkpoint.uri is None:
            if not superseded and (line := self.book.failed(checkpoint)) is not None:
                console.say(self.name, line)
            return
        if record is not None and self.policy is not None and record.status in (Status.COMPLETED, Status.STOPPED):
            self.book.prune(self.trials, self.controller.metric, self.controller.mode)

    def _report_lost_checkpoints(self) -> None:
        """At the run's end, one line on stderr if checkpoints could not be written: how many, the first error."""
        if self.book.lost:
            last = (trial_id for trial_id, _, _ in self.result().lost_checkpoints())
            console.say(self.name, self.book.lost_summary(last))

    # -- console ---------------------------------------------------------------------------------
    def progress_line(self) -> str:
        """The console line: trials done, running, paused and failed, the best so far, the clock."""
        return console.progress_line(self.name, self.status_counts(), self.best_row, self.controller.metric,
                                     self.now())
