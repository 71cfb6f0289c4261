"""`SaveTracker` (the saves each executor owes) and `StepOutcome` (a gang rank's typed step result)."""

from __future__ import annotations

import pickle

from nasplat.executors.local import LocalExecutor
from nasplat.executors.ray.rank import StepOutcome
from nasplat.executors.saves import SaveTracker
from nasplat.storage import Storage
from nasplat.storage.checkpoints import Checkpoint
from nasplat.trainer import Trainer


def durable(trial_id: int, step: int) -> Checkpoint:
    return Checkpoint(trial_id, step, f"mem://trial-{trial_id}/step-{step}")


def test_saves_finished_out_of_order_leave_the_tracker_one_by_one():
    saves = SaveTracker()
    for step in (2, 4, 6):
        saves.request(0, step)
    saves.request(1, 3)
    assert saves.pending(0) == (2, 4, 6) and saves.owes(0) and saves.owes(1) and saves.owes()
    assert saves.report([durable(0, 6)]) == (durable(0, 6),)
    assert saves.pending(0) == (2, 4)
    assert saves.report([durable(1, 3), durable(0, 2)]) == (durable(1, 3), durable(0, 2))
    assert saves.pending(0) == (4,) and not saves.owes(1) and saves.pending(1) == ()
    saves.report([Checkpoint(0, 4, None, "disk full")])  # a failed write is reported too: no longer owed
    assert not saves.owes(0) and not saves.owes()


def test_a_save_asked_twice_is_owed_twice_and_an_unasked_one_passes_through():
    saves = SaveTracker()
    saves.request(0, 5)
    saves.request(0, 5)
    saves.report([durable(0, 5)])
    assert saves.pending(0) == (5,)
    assert saves.report([durable(7, 1)]) == (durable(7, 1),)  # not tracked: reported as it came
    saves.report([durable(0, 5)])
    assert not saves.owes()


def test_lose_reports_every_pending_save_of_the_failed_attempt_once_as_failed():
    saves = SaveTracker()
    for step in (3, 1):
        saves.request(0, step)
    saves.request(1, 2)
    saves.report([durable(0, 3)])
    lost = saves.lose(0, "the worker process writing it died")
    assert lost == (Checkpoint(0, 1, None, "the worker process writing it died"),)
    assert saves.lose(0, "again") == () and not saves.owes(0)
    assert saves.pending(1) == (2,)  # another trial's saves stay owed


def test_every_requested_save_is_reported_exactly_once():
    saves, reported = SaveTracker(), []
    requested = [(trial, step) for trial in range(3) for step in range(1, 5)]
    for trial, step in requested:
        saves.request(trial, step)
    reported += saves.report([durable(t, s) for t, s in reversed(requested) if s % 2 == 0])
    reported += saves.report([durable(2, 1)])
    for trial in range(3):
        reported += saves.lose(trial, "gone")
    assert sorted((c.trial_id, c.step) for c in reported) == sorted(requested)
    assert not saves.owes()


def test_step_outcome_keeps_the_saves_out_of_its_metrics_and_reads_as_them():
    saved = (durable(0, 1),)
    outcome = StepOutcome({"loss": 0.5, "epoch": 2}, saved)
    assert outcome["epoch"] == 2 and dict(outcome) == {"loss": 0.5, "epoch": 2} and len(outcome) == 2
    assert "nasplat.saved" not in outcome and outcome.saved == saved
    assert pickle.loads(pickle.dumps(outcome)) == outcome
    assert StepOutcome({"x": 1}).saved == ()


class Counting(Trainer):
    def setup(self, config, ctx):
        self.t = 0

    def step(self):
        self.t += 1
        return {"t": self.t}

    def state_dict(self):
        return {"t": self.t}

    def load_state_dict(self, state):
        self.t = state["t"]


def test_the_local_executor_reports_each_save_once_and_owes_none_after(tmp_path):
    executor = LocalExecutor(1)
    executor.open(Counting, "saves", Storage(tmp_path))
    try:
        executor.launch(0, {}, seed=0)
        events = executor.wait()
        for step in (1, 2):
            executor.step(0, save=step)
            events += executor.wait()
        executor.stop(0, save=3)
        assert executor.saves.owes(0)
        events += executor.wait()
        saved = [c for event in events for c in event.saved]
        assert sorted(c.step for c in saved) == [1, 2, 3]  # each once: durable, or superseded by the next one
        assert all((c.uri is None) != (c.error is None) for c in saved) and max(saved, key=lambda c: c.step).uri
        assert not executor.saves.owes()
        assert all("nasplat.saved" not in (event.metrics or {}) for event in events)
    finally:
        executor.close()
