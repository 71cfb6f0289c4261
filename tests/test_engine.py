"""The engine loop with the in-process executors: budgets, failures, NaN, results, checkpoints, resume."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys

import pytest

import nasplat
from nasplat import Choice, Float, Int, Trainer
from nasplat.engine.result import ExperimentResult

SPACE = {"x": Float(-2.0, 2.0), "k": Int(1, 5), "act": Choice(["a", "b"])}


class Quadratic(Trainer):
    """Score rises towards -(x-1)^2 over steps; `fail_on` and `nan_on` inject faults by value of k."""

    fail_on: int | None = None
    nan_on: int | None = None

    def setup(self, config, ctx):
        self.x, self.k, self.t = config["x"], config["k"], 0
        if self.k == self.fail_on:
            raise RuntimeError(f"setup refuses k={self.k}")

    def step(self):
        self.t += 1
        score = -(self.x - 1.0) ** 2 - 1.0 / self.t
        if self.k == self.nan_on:
            score = math.nan
        return {"score": score, "t": self.t}

    def state_dict(self):
        return {"t": self.t}

    def load_state_dict(self, state):
        self.t = state["t"]


class FailsOn3(Quadratic):
    fail_on = 3


class NanOn2(Quadratic):
    nan_on = 2


def test_runs_every_trial_to_its_step_budget_and_records_each_step():
    result = nasplat.run(trainer=Quadratic, space=SPACE, metric="score", controller="random", max_trials=6,
                         max_steps=3, concurrency=2, seed=1)
    frame = result.dataframe()
    assert len(frame) == 18
    assert sorted(frame.groupby("trial_id")["step"].max().unique()) == [3]
    assert (frame[frame.step == 3].status == "completed").all()
    assert (frame[frame.step < 3].status == "running").all()
    assert result.best["score"] == frame.score.max()
    assert {"config", "parent_id", "donor_id", "start", "end", "node", "pid"} <= set(frame.columns)


def test_failed_setup_and_nan_metric_fail_the_trial_not_the_experiment():
    for trainer, bad_k in ((FailsOn3, 3), (NanOn2, 2)):
        result = nasplat.run(trainer=trainer, space=SPACE, metric="score", controller="evolution",
                             controller_options={"population_size": 4, "sample_size": 2}, max_trials=30, seed=3)
        counts = result.counts()
        failed = {r["trial_id"] for r in result.rows if r["status"] == "failed"}
        bad = {r["trial_id"] for r in result.rows if r["config"]["k"] == bad_k}
        assert failed == bad and len(bad) > 0
        assert counts["completed"] + counts["failed"] == 30
        assert all(r["config"]["k"] != bad_k for r in result.ranked())


def test_time_budget_on_the_simulated_clock():
    class Costly(Quadratic):
        def step(self):
            return {**super().step(), "time_cost": 10.0}

    result = nasplat.run(trainer=Costly, space=SPACE, metric="score", executor="simulated", concurrency=3,
                         time_budget_s=100.0, seed=0)
    # 3 virtual workers, 10 s per trial: trials start at 0, 10, ..., 90 -> 30 trials, the last ends at 100
    assert len(result.rows) == 30
    assert max(r["end"] for r in result.rows) == pytest.approx(100.0)


def test_simulated_executor_is_deterministic_and_orders_by_finish_time():
    class Variable(Quadratic):
        def step(self):
            return {**super().step(), "time_cost": 1.0 + 10 * (self.k % 3)}

    runs = [nasplat.run(trainer=Variable, space=SPACE, metric="score", executor="simulated", concurrency=4,
                        time_budget_s=200.0, seed=5) for _ in range(2)]
    assert runs[0].rows == runs[1].rows
    ends = [r["end"] for r in runs[0].rows]
    assert ends == sorted(ends)
    assert len({r["trial_id"] for r in runs[0].rows}) > 4


def test_storage_writes_rows_and_journal_and_loads_back(tmp_path):
    result = nasplat.run(trainer=Quadratic, space=SPACE, metric="score", max_trials=5, max_steps=2, seed=0,
                         storage=tmp_path, name="exp")
    folder = tmp_path / "exp"
    lines = (folder / "results.jsonl").read_text().splitlines()
    assert len(lines) == 10 and json.loads(lines[0])["trial_id"] == 0
    journal = [json.loads(line) for line in (folder / "journal.jsonl").read_text().splitlines()]
    assert [entry["ask"] for entry in journal] == [0, 1, 2, 3, 4]
    assert [entry["rows"] for entry in journal] == [0, 2, 4, 6, 8]  # one trial at a time, two rows each
    loaded = ExperimentResult.load(folder)
    assert loaded.best == result.best and loaded.metric == "score"
    with pytest.raises(FileExistsError, match="nasplat resume"):
        nasplat.run(trainer=Quadratic, space=SPACE, metric="score", max_trials=5, storage=tmp_path, name="exp")


CRASHING_SCRIPT = """
import os, signal, sys
import nasplat
from nasplat import Float, Int, Trainer

class Crashy(Trainer):
    def setup(self, config, ctx):
        self.x, self.t, self.trial = config["x"], 0, ctx.trial_id
    def step(self):
        self.t += 1
        marker = os.environ["CRASH_MARKER"]
        if self.trial == 5 and self.t == 2 and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)  # the driver dies mid-trial, mid-experiment
        return {"score": -(self.x - 1.0) ** 2 - 1.0 / self.t}

nasplat.run(trainer=Crashy, space={"x": Float(-2.0, 2.0), "k": Int(1, 5)}, metric="score",
            controller="evolution", controller_options={"population_size": 3, "sample_size": 2},
            max_trials=10, max_steps=3, concurrency=2, seed=4, storage=sys.argv[1], name=sys.argv[2])
"""


def test_resume_after_the_driver_is_killed_loses_and_duplicates_nothing(tmp_path):
    script = tmp_path / "crashy.py"
    script.write_text(CRASHING_SCRIPT)
    env = {**os.environ, "CRASH_MARKER": str(tmp_path / "crashed")}
    killed = subprocess.run([sys.executable, str(script), str(tmp_path), "exp"], env=env, capture_output=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]
    before = ExperimentResult.load(tmp_path / "exp").rows
    assert 0 < len(before) < 30
    env["CRASH_MARKER"] = str(tmp_path / "crashed")  # exists now: the resumed run does not crash
    os.environ["CRASH_MARKER"] = env["CRASH_MARKER"]
    resumed = nasplat.resume(tmp_path / "exp", allow_pickle=True)  # its trainer lives in a script's __main__
    unbroken = subprocess.run([sys.executable, str(script), str(tmp_path), "unbroken"], env=env, capture_output=True)
    assert unbroken.returncode == 0, unbroken.stderr.decode()[-2000:]
    reference = ExperimentResult.load(tmp_path / "unbroken").rows
    key = lambda r: (r["trial_id"], r["step"])  # noqa: E731
    assert len(set(map(key, resumed.rows))) == len(resumed.rows) == 30
    assert sorted(map(key, resumed.rows)) == sorted(map(key, reference))
    on_disk = ExperimentResult.load(tmp_path / "exp").rows
    assert sorted(map(key, on_disk)) == sorted(map(key, reference))
    completed_before = {r["trial_id"] for r in before if r["status"] == "completed"}
    for row in before:  # every row of a trial completed before the crash survives unchanged
        if row["trial_id"] in completed_before:
            assert row in on_disk
    scores = {key(r): r["score"] for r in reference}
    assert all(scores[key(r)] == pytest.approx(r["score"]) for r in on_disk)


def test_bad_arguments_name_the_value_and_what_is_allowed():
    with pytest.raises(ValueError, match="unknown controller 'evolve'.*allowed"):
        nasplat.run(trainer=Quadratic, space=SPACE, metric="score", controller="evolve", max_trials=1)
    with pytest.raises(ValueError, match="max_trials.*got max_trials=0"):
        nasplat.run(trainer=Quadratic, space=SPACE, metric="score", max_trials=0)
    with pytest.raises(ValueError, match="budget needs"):
        nasplat.run(trainer=Quadratic, space=SPACE, metric="score")
    with pytest.raises(ValueError, match="unknown executor 'gpu'"):
        nasplat.run(trainer=Quadratic, space=SPACE, metric="score", max_trials=1, executor="gpu")
    with pytest.raises(ValueError, match="no attribute 'Nope'"):
        nasplat.run(trainer="trainers.pbt_toy:Nope", space=SPACE, metric="score", max_trials=1)


class Lineage(Trainer):
    """State: steps trained so far along the lineage, and the width `w` they were trained at (the 'shape')."""

    def setup(self, config, ctx):
        self.t, self.w = 0, config["w"]

    def step(self):
        self.t += 1
        return {"score": self.config["x"] + 0.01 * self.t, "t": self.t}

    def state_dict(self):
        return {"t": self.t, "w": self.w}

    def load_state_dict(self, state):
        if state["w"] != self.w:
            raise ValueError(f"state of width {state['w']} does not fit width {self.w}")
        self.t = state["t"]


def check_inheritance(frame, inherit: bool) -> None:
    """Every child's first step continues its parent's count when the widths match, else starts at 1."""
    last = frame.groupby("trial_id").t.max()
    children = frame[frame.parent_id.notna() & (frame.step == 1)]
    assert len(children) >= 8
    for _, row in children.iterrows():
        parent = frame[frame.trial_id == row.parent_id].iloc[-1]
        fits = inherit and parent.config["w"] == row.config["w"]
        assert row.t == (last[int(row.parent_id)] + 1 if fits else 1), (row.trial_id, row.parent_id)
    if inherit:  # both kinds of children occurred
        assert (children.t > 1).any() and (children.t == 1).any()


@pytest.mark.parametrize("inherit", [True, False])
def test_evolution_children_inherit_their_parents_state_where_it_fits(inherit):
    from nasplat.executors.local import LocalExecutor

    executor = LocalExecutor(2)
    result = nasplat.run(trainer=Lineage, space={"x": Float(0.0, 1.0), "w": Choice([1, 2])}, metric="score",
                         controller="evolution", executor=executor, max_trials=24, max_steps=2, seed=3,
                         controller_options={"population_size": 4, "sample_size": 2, "inherit_weights": inherit})
    check_inheritance(result.dataframe(), inherit)
    assert len(executor.kept) == (4 if inherit else 0)  # only the population's states are kept


class PauseAtOne(nasplat.RandomSearch):
    """Pauses every trial after its first step; of each three paused, resumes the best one."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.paused: dict[int, float] = {}

    def on_result(self, trial_id, result):
        if result.step == 1:
            self.paused[trial_id] = result.metrics["score"]
            return nasplat.controllers.PAUSE
        return nasplat.controllers.CONTINUE

    def promote(self):
        if len(self.paused) < 3:
            return None
        best = max(self.paused, key=self.paused.get)
        self.paused.clear()
        return best


def test_paused_trials_give_their_slot_back_and_resume_from_their_state_when_promoted(tmp_path):
    controller = PauseAtOne(SPACE, metric="score", seed=0)
    result = nasplat.run(trainer=Quadratic, controller=controller, max_trials=6, max_steps=3, storage=tmp_path,
                         name="pause")
    rows = result.rows
    paused = [r["trial_id"] for r in rows if r["status"] == "paused"]
    assert sorted(paused) == list(range(6))
    completed = [r for r in rows if r["status"] == "completed"]
    assert len(completed) == 2  # one promotion per three paused trials
    for row in completed:  # it continued from its state: t counts on from the paused step
        mine = [r for r in rows if r["trial_id"] == row["trial_id"]]
        assert [(r["step"], r["t"], r["status"]) for r in mine] == [(1, 1, "paused"), (2, 2, "running"),
                                                                   (3, 3, "completed")]
    first_three = [r["score"] for r in rows if r["status"] == "paused"][:3]
    assert completed[0]["trial_id"] == paused[first_three.index(max(first_three))]
    journal = [json.loads(line) for line in (tmp_path / "pause" / "journal.jsonl").read_text().splitlines()]
    assert [e["resume"] for e in journal if "resume" in e] == [c["trial_id"] for c in completed]
