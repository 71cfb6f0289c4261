"""What the engine knows and decides without an executor: its trials' records, the controller's decisions applied
to them, the rows recorded and the best so far.

`loop.Engine` drives this state from the executor's events; `nasplat.engine.replay` drives it from the rows and
journal read back from the folder. Both go through the methods here only, so the invariants live in one place.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nasplat.controllers.base import Decision, Exploit, Pause, Result, Searcher, Stop, TrialSpec
from nasplat.core.checks import is_real
from nasplat.core.pareto import better
from nasplat.core.rows import Status, mark_retried
from nasplat.engine.answers import RecordedAnswers
from nasplat.engine.console import last_line
from nasplat.engine.outbox import Outbox
from nasplat.engine.records import Budget, TrialRecord
from nasplat.engine.result import ExperimentResult
from nasplat.storage import ExperimentFolder
from nasplat.storage.checkpoints import Checkpoint
from nasplat.storage.locate import checkpoint_locations, locate_checkpoint, relative_location


class EngineState:
    """The trials `controller` proposed under `budget`, and what was recorded of them (through `outbox`, into
    `folder` where there is one). With `deterministic` (the trainer's `Trainer.deterministic`), a trial whose config
    completed before is answered from the record (`answers`, `nasplat.engine.answers`)."""

    def __init__(self, controller: Searcher, budget: Budget, *, max_failed_trials: int | None,
                 folder: ExperimentFolder | None, deterministic: bool = False) -> None:
        self.controller, self.budget, self.folder = controller, budget, folder
        self.answers = RecordedAnswers(deterministic and controller.min_concurrency == 1)
        self.max_failed_trials = max_failed_trials
        # every step must report these as finite real numbers: the objectives and the metrics constraints bound
        self.objectives: tuple[str, ...] = tuple(dict.fromkeys(
            [*controller.metrics, *(constraint.metric for constraint in controller.constraints)]))
        self.trials: dict[int, TrialRecord] = {}
        self.active: set[int] = set()  # ids of running trials
        self.outbox = Outbox(folder, self._recorded)
        self.clock_offset = 0.0  # seconds the experiment ran before this driver (a resume) started its clock
        self.exploits = 0
        self.failed_errors: list[tuple[int, str]] = []  # (trial, error) of trials that ended failed
        self.best_row: dict[str, Any] | None = None

    @property
    def path(self) -> Path | None:
        """The local experiment folder (the working copy, for a URI), or None without storage."""
        return self.folder.path if self.folder is not None else None

    @property
    def home(self) -> str | None:
        """The experiment folder's own location (its URI, for one), which rows' checkpoint locations are relative
        to; None without storage."""
        return self.folder.home if self.folder is not None else None

    def recorded_location(self, uri: str) -> str:
        """A durable checkpoint's location as its row records it: relative to the experiment folder."""
        return relative_location(self.home, uri) if self.home is not None else uri

    def locate(self, recorded: str) -> str | None:
        """Where the checkpoint a row records lies complete in this folder (beside it first, for a location from
        before they were relative), or None where it is missing or incomplete; without a folder, as recorded."""
        return locate_checkpoint(self.home, recorded) if self.home is not None else recorded

    def running(self) -> list[TrialRecord]:
        """The running trials' records, by trial id."""
        return [self.trials[t] for t in sorted(self.active)]

    def failed_out(self) -> bool:
        """Whether more trials failed than `max_failed_trials` allows."""
        return self.max_failed_trials is not None and len(self.failed_errors) > self.max_failed_trials

    def failure_summary(self) -> str:
        """The message of `ExperimentFailed`: how many trials failed, and the first errors."""
        first = "; ".join(f"trial {t}: {last_line(e)}" for t, e in self.failed_errors[:3])
        return (f"{len(self.failed_errors)} trials failed, more than max_failed_trials={self.max_failed_trials}; "
                f"stopped. First errors: {first}")

    def status_counts(self) -> dict[str, int]:
        """How many trials are in each status."""
        counts: dict[str, int] = {status: 0 for status in (Status.COMPLETED, Status.STOPPED, Status.RUNNING,
                                                           Status.PAUSED, Status.FAILED)}
        for record in self.trials.values():
            counts[record.status] += 1
        return counts

    # -- the controller's decisions ------------------------------------------------------------------
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
        if record is None or record.status != Status.PAUSED:
            raise RuntimeError(f"controller promoted trial {trial_id}, which is not paused "
                               f"(status: {None if record is None else record.status})")
        record.status = Status.RUNNING
        self.active.add(trial_id)
        return record

    def advance(self, record: TrialRecord, metrics: dict[str, Any], step: int) -> tuple[Status, Decision]:
        """Hand a step's metrics to the controller and apply its decision to the record (no executor involved:
        resuming replays recorded rows through here). Returns the trial's new status and the decision."""
        record.step, record.metrics = step, metrics
        if self.answers.enabled:
            self.answers.observe(record.trial_id, step, metrics)
        result = Result(metrics, step)
        decision = self.controller.on_result(record.trial_id, result)
        done = step - record.behind >= self.budget.max_steps or metrics.get("done") is True
        status = Status.COMPLETED if done else Status.STOPPED if isinstance(decision, Stop) else (
            Status.PAUSED if isinstance(decision, Pause) else Status.RUNNING)
        if status == Status.PAUSED:
            record.status = Status.PAUSED
            self.active.discard(record.trial_id)
        elif status != Status.RUNNING:
            self.end(record, status, result)
        elif isinstance(decision, Exploit):
            self.exploits += 1
            record.config = decision.config
            if decision.donor_step is not None:  # it goes on from the donor's progress at that step
                record.behind = step - decision.donor_step + self.trials[decision.donor_id].behind
        return status, decision

    def end(self, record: TrialRecord, status: Status, result: Result) -> None:
        """The trial ended: tell the controller."""
        record.status = status
        self.active.discard(record.trial_id)
        if self.answers.enabled:
            self.answers.ended(record.trial_id, record.config, status == Status.COMPLETED)
        if status == Status.FAILED:
            record.error = result.error
            self.failed_errors.append((record.trial_id, result.error or "failed"))
        self.controller.tell(record.trial_id, result)

    # -- the record --------------------------------------------------------------------------------
    @property
    def rows(self) -> list[dict[str, Any]]:
        """The rows recorded so far, in order."""
        return self.outbox.rows

    def _recorded(self, row: dict[str, Any]) -> None:
        """A row went out: note the best (`Engine` also tells its listeners)."""
        self.note_best(row)

    def note_best(self, row: dict[str, Any]) -> None:
        """Keep `row` as the best so far if it beats it on the controller's metric; failed, retried rows never do."""
        metric = self.controller.metric
        if row["status"] in (Status.FAILED, Status.RETRIED) or not is_real(row.get(metric)):
            return
        if self.best_row is None or better(row[metric], self.best_row[metric], self.controller.mode):
            self.best_row = row

    def recount_best(self, trial_id: int | None = None, after_step: int = 0) -> None:
        """Find the best so far again without the rows a retry went back over (`mark_retried`), nor `trial_id`'s
        rows after `after_step` (its retry goes on from that step now)."""
        self.best_row = None
        for row in mark_retried(self.rows):
            if row["trial_id"] != trial_id or row["step"] <= after_step:
                self.note_best(row)

    def result(self) -> ExperimentResult:
        """The rows so far, ranked by the controller's objectives and constraints."""
        c = self.controller
        return ExperimentResult(list(self.rows), c.metric, c.mode, self.path, dict(self.trials), metrics=c.metrics,
                                modes=c.modes, constraints=c.constraints, location=self.home)

    # -- resuming: what `nasplat.engine.replay` does to the state ------------------------------------
    def replayed(self, row: dict[str, Any]) -> None:
        """Take `row`, read back from the folder, as recorded: the best so far, and the checkpoint it names (if any) as
        its trial's latest, inside this folder (`checkpoint_locations`; a running trial's is looked up by
        `rewind_running`), and the trial it was answered from (`cached_from`) for a trial not ended. It is not
        written again, and no listener is told."""
        if row.get("cached_from") is not None and self.trials[row["trial_id"]].status in (Status.RUNNING,
                                                                                           Status.PAUSED):
            self.answers.answered_from(row["trial_id"], row["cached_from"])
        if row.get("checkpoint"):
            uri = checkpoint_locations(self.home, row["checkpoint"])[0]
            self.trials[row["trial_id"]].checkpoint = Checkpoint(row["trial_id"], row["step"], uri)
        self.outbox.replayed(row)
        self.note_best(row)

    def set_attempt(self, trial_id: int, attempt: int) -> None:
        """The trial is on its `attempt`-th attempt (0 first; each retry adds one)."""
        self.trials[trial_id].attempt = attempt

    def rewind_running(self, checkpoints: Mapping[int, Checkpoint | None] | None = None) -> None:
        """Put each running trial back at its latest durable checkpoint's step (0 without one: it starts over), with
        no in-memory state to go on from: where a resumed run continues it. `checkpoints` gives the checkpoint
        found complete for some of them (None: none is), in place of the one their rows name."""
        for record in self.running():
            if checkpoints is not None and record.trial_id in checkpoints:
                record.checkpoint = checkpoints[record.trial_id]
            record.step = record.checkpoint.step if record.checkpoint is not None else 0
            record.restart = None

    def restore_clock(self, offset: float) -> None:
        """Let the experiment's clock go on from `offset` seconds (the latest time recorded before a resume)."""
        self.clock_offset = offset

    def reopen_logs(self, rows: list[dict[str, Any]], journal: list[dict[str, Any]], *, rewrite: bool) -> None:
        """Open the folder's rows and journal for appending (without a folder: nothing); with `rewrite`, replace them
        by `rows` and `journal` first (a resume dropped some)."""
        if self.folder is None:
            return
        if rewrite:
            self.folder.rewrite(rows, journal)
        else:
            self.folder.open_logs()
