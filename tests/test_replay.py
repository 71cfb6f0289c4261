"""`nasplat.engine.replay` on synthetic rows and journals: real controllers, a real `Engine` whose executor is never
opened (no Ray, no training). Resuming must rebuild exactly the records and the controller state the rows say, cut a
running trial back to its last checkpointed row, and refuse a record the controller cannot reproduce."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nasplat.controllers import Controller, PopulationBasedTraining, RandomSearch, Result
from nasplat.engine import Budget, Engine
from nasplat.engine.replay import resume_engine
from nasplat.executors.local import LocalExecutor
from nasplat.schedulers import ASHA
from nasplat.space import Float
from nasplat.storage import CHECKPOINTS, JOURNAL_FILE, ROWS_FILE, ExperimentFolder, Storage, read_rows
from nasplat.storage.checkpoints import Checkpoint, write_checkpoint
from nasplat.trainer import Trainer

SPACE = {"x": Float(0.0, 1.0)}
NO_DROP = "dropped 0 rows recorded after the last checkpoint of a running trial"


class Idle(Trainer):
    """Never run: the executor is never opened."""

    def setup(self, config: dict[str, Any], ctx: Any) -> None:
        raise AssertionError("replay must not train")

    def step(self) -> dict[str, Any]:
        raise AssertionError("replay must not train")


def engine_for(controller: Controller, max_steps: int, folder: ExperimentFolder | None = None) -> Engine:
    return Engine(controller=controller, executor=LocalExecutor(concurrency=2), trainer=Idle, name="replayed",
                  budget=Budget(max_trials=50, max_steps=max_steps), folder=folder)


def row(trial: int, step: int, status: str = "running", score: float | None = 0.0, *, attempt: int = 0,
        checkpoint: str | None = None, donor: int | None = None, end: float = 1.0, error: str | None = None,
        **extra: Any) -> dict[str, Any]:
    """A row as the engine records it (`Engine._row`); failed and retried rows carry no metrics (`score=None`)."""
    item: dict[str, Any] = {"trial_id": trial, "step": step, "attempt": attempt, "status": status, "config": {},
                            "parent_id": None, "donor_id": donor, "start": end - 0.5, "end": end, "node": "n",
                            "pid": 1, "error": error, **extra}
    if score is not None:
        item["score"] = score
    if checkpoint is not None:
        item["checkpoint"] = checkpoint
    return item


def ask(trial: int, rows: int, time: float = 0.0) -> dict[str, Any]:
    return {"ask": trial, "rows": rows, "time": time}


def resume(trial: int, rows: int, time: float = 0.0) -> dict[str, Any]:
    return {"resume": trial, "rows": rows, "time": time}


def asha() -> ASHA:
    """Rungs at steps 1 and 3 of 9; a trial reaching one pauses, the top third of a rung is promoted."""
    return ASHA(RandomSearch(SPACE, metric="score", seed=0), max_steps=9, type="promote")


def three_paused() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Trials 0, 1, 2 each paused at rung 0 (step 1) with a checkpoint; trial 1 scored best."""
    rows = [row(t, 1, "paused", score, checkpoint=f"ck/trial-{t}/step-1", rung=0)
            for t, score in enumerate([0.2, 0.9, 0.5])]
    return rows, [ask(0, 0), ask(1, 1), ask(2, 2)]


def test_a_finished_run_replays_into_its_records_best_row_clock_and_controller_state():
    rows = [row(0, 1, score=0.3, end=1.0), row(1, 1, score=0.7, end=1.5), row(0, 2, "completed", 0.4, end=2.0),
            row(1, 2, "completed", 0.6, end=2.5)]
    journal = [ask(0, 0, time=0.0), ask(1, 1, time=3.25)]  # the latest time on record is the journal's
    engine = engine_for(RandomSearch(SPACE, metric="score", seed=4), max_steps=2)

    line = resume_engine(engine, rows, journal)

    assert line == f"resumed: kept 4 rows of 2 trials, {NO_DROP}; 0 running trials continue"
    assert engine.rows == rows and engine.best_row is rows[1]
    assert engine.clock_offset == 3.25
    assert [(r.trial_id, r.status, r.step, r.metrics) for r in engine.trials.values()] == [
        (0, "completed", 2, {"score": 0.4}), (1, "completed", 2, {"score": 0.6})]
    assert engine.active == set() and engine.running() == []
    reference = RandomSearch(SPACE, metric="score", seed=4)
    first = [reference.ask(), reference.ask()]
    assert [engine.trials[t].config for t in (0, 1)] == [spec.config for spec in first]
    assert engine.controller.ask() == reference.ask()  # it goes on exactly where the killed driver was


def test_a_running_trial_is_cut_back_to_its_last_checkpointed_row_and_the_journal_remapped(tmp_path: Path):
    rows = [row(0, 1), row(1, 1, checkpoint="checkpoints/trial-1/step-1"), row(1, 2, end=7.0), row(0, 2),
            row(0, 3, "completed", 0.5)]
    journal = [ask(0, 0), ask(1, 1), ask(2, 3), ask(3, 5)]
    folder = ExperimentFolder(tmp_path / "exp")
    folder.create({})
    write_checkpoint(Storage(str(tmp_path / "exp" / CHECKPOINTS)), 1, 1, {"t": 1})  # the one the row names
    for item in rows:
        folder.append_row(item)
    for entry in journal:
        folder.append_journal(entry)
    folder.close()
    folder = ExperimentFolder(tmp_path / "exp")
    read, journal_read = folder.open_existing()
    engine = engine_for(RandomSearch(SPACE, metric="score", seed=0), max_steps=3, folder=folder)

    line = resume_engine(engine, read, journal_read)

    assert line == ("resumed: kept 4 rows of 4 trials, dropped 1 rows recorded after the last checkpoint of a "
                    "running trial; 3 running trials continue (trial 1 from step 1, trial 2 from the start, "
                    "trial 3 from the start)")
    kept = [rows[0], rows[1], rows[3], rows[4]]
    assert engine.rows == kept
    one = engine.trials[1]
    assert (one.status, one.step, one.restart) == ("running", 1, None)
    assert one.checkpoint == Checkpoint(1, 1, str(tmp_path / "exp" / "checkpoints" / "trial-1" / "step-1"))
    assert engine.trials[0].status == "completed" and engine.active == {1, 2, 3}
    assert engine.clock_offset == 1.0  # the dropped row's end (7.0) is not on record any more
    assert folder.rows is not None and folder.journal is not None  # open for appending
    folder.close()
    assert read_rows(tmp_path / "exp" / ROWS_FILE) == kept
    assert [e["rows"] for e in read_rows(tmp_path / "exp" / JOURNAL_FILE)] == [0, 1, 2, 4]


def test_nothing_dropped_leaves_the_folder_as_it_was_and_opens_it_for_appending(tmp_path: Path):
    folder = ExperimentFolder(tmp_path / "exp")
    folder.create({})
    rows, journal = [row(0, 1, "completed", 0.5)], [ask(0, 0)]
    folder.append_journal(journal[0])
    folder.append_row(rows[0])
    folder.close()
    before = (tmp_path / "exp" / ROWS_FILE).read_bytes()
    folder = ExperimentFolder(tmp_path / "exp")
    engine = engine_for(RandomSearch(SPACE, metric="score"), max_steps=1, folder=folder)
    assert resume_engine(engine, *folder.open_existing()).startswith("resumed: kept 1 rows of 1 trials, dropped 0")
    engine.outbox.row(row(1, 1, "completed", 0.1))  # appended after what was there
    folder.close()
    assert read_rows(tmp_path / "exp" / ROWS_FILE) == [*rows, row(1, 1, "completed", 0.1)]
    assert (tmp_path / "exp" / ROWS_FILE).read_bytes().startswith(before)


def test_paused_trials_stay_paused_with_their_checkpoints_and_the_rungs_rebuilt():
    rows, journal = three_paused()
    engine = engine_for(asha(), max_steps=9)

    line = resume_engine(engine, rows, journal)

    assert line == f"resumed: kept 3 rows of 3 trials, {NO_DROP}; 0 running trials continue"
    assert [(r.status, r.step, r.checkpoint) for r in engine.trials.values()] == [
        ("paused", 1, Checkpoint(t, 1, f"ck/trial-{t}/step-1")) for t in range(3)]
    assert engine.active == set()
    assert engine.controller.paused == {0, 1, 2}
    assert engine.controller.recorded[0][0] == {0: 0.2, 1: 0.9, 2: 0.5}
    assert engine.controller.promote() == 1  # the best of rung 0 is promoted first, as it would have been


@pytest.mark.parametrize("step_2_recorded", [False, True])
def test_a_paused_trial_resumed_late_continues_from_its_pause_checkpoint(step_2_recorded):
    """Promoted before the kill: with no row after its promotion (resumed late) or with an unsaved one (dropped),
    the trial runs again from its paused step; the other paused trials stay paused."""
    rows, journal = three_paused()
    journal.append(resume(1, 3))
    if step_2_recorded:
        rows.append(row(1, 2, score=0.95))
    engine = engine_for(asha(), max_steps=9)

    line = resume_engine(engine, rows, journal)

    assert line == (f"resumed: kept 3 rows of 3 trials, dropped {int(step_2_recorded)} rows recorded after the last "
                    "checkpoint of a running trial; 1 running trials continue (trial 1 from step 1)")
    assert engine.rows == rows[:3]
    assert engine.active == {1}
    assert [engine.trials[t].status for t in range(3)] == ["paused", "running", "paused"]
    assert (engine.trials[1].step, engine.trials[1].checkpoint.step) == (1, 1)
    assert engine.controller.promoted[0][0] == {1} and engine.controller.paused == {0, 2}
    assert engine.controller.promote() is None  # rung 0 holds 3: only its top one is promoted


def test_promotions_replay_through_the_journal_resume_entries():
    rows, journal = three_paused()
    journal += [resume(1, 3), ask(3, 5), ask(4, 6)]
    rows += [row(1, 2, score=0.8), row(1, 3, "paused", 0.85, checkpoint="ck/trial-1/step-3", rung=1),
             row(3, 1, "paused", 0.1, checkpoint="ck/trial-3/step-1", rung=0)]
    engine = engine_for(asha(), max_steps=9)

    line = resume_engine(engine, rows, journal)

    assert line == f"resumed: kept 6 rows of 5 trials, {NO_DROP}; 1 running trials continue (trial 4 from the start)"
    assert engine.rows == rows
    assert [(r.status, r.step) for r in engine.trials.values()] == [
        ("paused", 1), ("paused", 3), ("paused", 1), ("paused", 1), ("running", 0)]
    assert engine.trials[1].checkpoint == Checkpoint(1, 3, "ck/trial-1/step-3")
    assert engine.controller.rung_of(1) == 1 and engine.controller.recorded[0][1] == {1: 0.85}


def test_a_promotion_the_controller_does_not_make_is_a_clear_error():
    rows, journal = three_paused()
    journal.append(resume(0, 3))
    with pytest.raises(ValueError, match=r"cannot resume: the journal says paused trial 0 was resumed next, but ASHA "
                                         r"promotes 1; a controller must be deterministic"):
        resume_engine(engine_for(asha(), max_steps=9), rows, journal)


def test_retried_attempts_are_counted_and_failed_trials_end_failed():
    error = "Traceback (most recent call last):\n  ...\nRuntimeError: worker lost"
    rows = [row(0, 1, score=0.1), row(0, 2, "retried", None, error=error), row(1, 1, "failed", None, error=error),
            row(0, 1, score=0.2, attempt=1), row(0, 2, "completed", 0.3, attempt=1)]
    engine = engine_for(RandomSearch(SPACE, metric="score"), max_steps=2)

    line = resume_engine(engine, rows, [ask(0, 0), ask(1, 0)])

    assert line == f"resumed: kept 5 rows of 2 trials, {NO_DROP}; 0 running trials continue"
    assert (engine.trials[0].status, engine.trials[0].attempt, engine.trials[0].step) == ("completed", 1, 2)
    assert (engine.trials[1].status, engine.trials[1].error) == ("failed", error)
    assert engine.failed_errors == [(1, error)] and engine.controller.failed_trials == [1]
    assert engine.best_row is rows[4]


def test_a_running_trials_retried_rows_are_kept_and_its_next_attempt_counted():
    rows = [row(0, 1, checkpoint="ck/trial-0/step-1"), row(0, 2, "retried", None, error="lost"),
            row(0, 2, attempt=1), row(1, 1), row(1, 2, "retried", None, error="lost"), row(1, 1, attempt=1)]
    engine = engine_for(RandomSearch(SPACE, metric="score"), max_steps=5)

    line = resume_engine(engine, rows, [ask(0, 0), ask(1, 0)])

    assert line == ("resumed: kept 3 rows of 2 trials, dropped 3 rows recorded after the last checkpoint of a running "
                    "trial; 2 running trials continue (trial 0 from step 1, trial 1 from the start)")
    assert engine.rows == [rows[0], rows[1], rows[4]]
    assert [(r.attempt, r.step, r.status) for r in engine.trials.values()] == [(1, 1, "running"), (1, 0, "running")]


def pbt_rows(donor: int | None) -> list[dict[str, Any]]:
    """Two members, perturbation every 2 steps: at step 2 member 1 (the worse) copies member 0; both checkpointed
    there, so their step-3 rows are dropped."""
    return [row(0, 1, score=1.0), row(1, 1, score=0.5),
            row(0, 2, score=1.0, checkpoint="ck/trial-0/step-2"),
            row(1, 2, score=0.5, donor=donor, checkpoint="ck/trial-1/step-2"),
            row(0, 3, score=1.0), row(1, 3, score=0.5)]


def pbt() -> PopulationBasedTraining:
    return PopulationBasedTraining(SPACE, metric="score", population_size=2, perturbation_interval=2, seed=0)


def test_exploits_replay_the_donor_and_the_perturbed_config():
    engine = engine_for(pbt(), max_steps=4)

    line = resume_engine(engine, pbt_rows(donor=0), [ask(0, 0), ask(1, 0)])

    assert line == ("resumed: kept 4 rows of 2 trials, dropped 2 rows recorded after the last checkpoint of a running "
                    "trial; 2 running trials continue (trial 0 from step 2, trial 1 from step 2)")
    reference = pbt()
    initial = [reference.ask(), reference.ask()]
    for step in (1, 2):
        reference.on_result(0, Result({"score": 1.0}, step))
        decision = reference.on_result(1, Result({"score": 0.5}, step))
    assert engine.controller.exploits == reference.exploits == [(2, 1, 0)]
    assert engine.exploits == 1
    assert engine.trials[1].config == decision.config == engine.controller.configs[1] != initial[1].config
    assert engine.trials[0].config == initial[0].config and engine.trials[1].behind == 0


def test_a_controller_that_decides_differently_is_reported_and_the_record_kept(capsys):
    engine = engine_for(pbt(), max_steps=4)
    line = resume_engine(engine, pbt_rows(donor=None), [ask(0, 0), ask(1, 0)])  # the record shows no exploit
    assert line.endswith("2 running trials continue (trial 0 from step 2, trial 1 from step 2); warning: the "
                         "controller decided differently from the record at 1 rows (is it deterministic given its "
                         "seed?), the record was kept")
    assert capsys.readouterr().err == "[nasplat replayed] replay: 1 decisions differ from the record\n"

    engine = engine_for(RandomSearch(SPACE, metric="score"), max_steps=3)
    rows = [row(0, 1), row(0, 2, "stopped", 0.5)]  # random search never stops a trial early
    line = resume_engine(engine, rows, [ask(0, 0)])
    assert line == (f"resumed: kept 2 rows of 1 trials, {NO_DROP}; 0 running trials continue; warning: the controller "
                    "decided differently from the record at 1 rows (is it deterministic given its seed?), the record "
                    "was kept")
    assert (engine.trials[0].status, engine.active) == ("stopped", set())


@pytest.mark.parametrize("controller, journal, proposes", [
    (pbt, [ask(0, 0), ask(1, 0), ask(2, 0)], "trial 2 was proposed next, but PopulationBasedTraining proposes None"),
    (lambda: RandomSearch(SPACE, metric="score"), [ask(3, 0)],
     "trial 3 was proposed next, but RandomSearch proposes 0"),
])
def test_a_journal_naming_a_trial_the_controller_does_not_propose_is_a_clear_error(controller, journal, proposes):
    with pytest.raises(ValueError, match=rf"cannot resume: the journal says {proposes}; a controller must be "
                                         r"deterministic given its seed for `nasplat resume` to rebuild it"):
        resume_engine(engine_for(controller(), max_steps=4), [], journal)


def test_a_row_of_a_trial_never_proposed_or_a_journal_entry_without_a_trial_is_a_clear_error():
    with pytest.raises(ValueError, match=r"row 2 of results.jsonl names trial 5, step 1, which the journal never "
                                         r"proposed"):
        resume_engine(engine_for(RandomSearch(SPACE, metric="score"), max_steps=1),
                      [row(0, 1, "completed"), row(5, 1)], [ask(0, 0)])
    with pytest.raises(ValueError, match=r"journal.jsonl holds an entry without a trial id: \{'rows': 0"):
        resume_engine(engine_for(RandomSearch(SPACE, metric="score"), max_steps=3), [], [{"rows": 0, "time": 0.0}])


def test_the_engine_takes_replayed_rows_silently_and_rewinds_running_trials_to_their_checkpoints():
    """The engine methods replay goes through: a replayed row is recorded (best, checkpoint) without telling the
    listeners; rewinding drops in-memory state and goes back to the checkpoint (the start without one)."""
    engine = engine_for(RandomSearch(SPACE, metric="score"), max_steps=9)
    heard: list[dict[str, Any]] = []

    class Listener:
        def on_row(self, engine: Engine, item: dict[str, Any]) -> None:
            heard.append(item)

    engine.listeners.append(Listener())
    for _ in range(2):
        engine.add_trial(engine.controller.ask())
    replayed = row(0, 4, score=0.5, checkpoint="ck/trial-0/step-4")
    engine.replayed(replayed)
    engine.set_attempt(1, 2)
    for record in engine.trials.values():
        record.step, record.restart = 6, ("in memory", 6)
    engine.rewind_running()
    engine.restore_clock(12.5)

    assert engine.rows == [replayed] and engine.best_row is replayed and heard == []
    assert [(r.step, r.restart, r.checkpoint, r.attempt) for r in engine.trials.values()] == [
        (4, None, Checkpoint(0, 4, "ck/trial-0/step-4"), 0), (0, None, None, 2)]
    assert engine.clock_offset == 12.5
