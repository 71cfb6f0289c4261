"""What a trainer reports and how trials fail: a bad value fails one trial, never the experiment; endless failures
stop the run with a summary; retries keep their errors; storage is plain data and its damage is named."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import nasplat
from nasplat import ExperimentFailed, Float, Trainer
from nasplat.engine.result import ExperimentResult
from nasplat.engine.step_metrics import MetricError, clean_metrics

SPACE = {"x": Float(0.0, 1.0)}


def test_metrics_accept_real_numbers_of_every_kind_and_refuse_what_is_not_one():
    clean = clean_metrics({"a": np.float32(0.5), "b": torch.tensor(2.0), "c": np.array(3), "d": 7, "e": "note",
                           "f": True, "g": None, "h": 2 ** 80}, objectives=("a",))
    assert clean == {"a": 0.5, "b": 2.0, "c": 3, "d": 7, "e": "note", "f": True, "g": None, "h": float(2 ** 80)}
    assert type(clean["a"]) is float and type(clean["c"]) is int
    for raw, message in [({"a": True}, "'a' must be a finite real number, got True"),
                         ({"a": float("nan")}, "'a' must be a finite real number"),
                         ({"b": 1.0}, "'a' is missing"),
                         ({1: 1.0, "a": 1.0}, "metric names must be strings, got 1"),
                         ({"a": 1.0, "step": 3}, "'step' is reserved"),
                         ({"a": 10 ** 400}, "too large for a float"),
                         ({"a": 1.0, "v": [1, 2]}, "'v' must be a real number, a string"),
                         ({"a": np.ones(3)}, "must be a scalar, got an array of shape (3,)"),
                         ([("a", 1.0)], "must return a mapping")]:
        with pytest.raises(MetricError) as caught:
            clean_metrics(raw, objectives=("a",))
        assert message in str(caught.value)


class Reports(Trainer):
    """Reports whatever `config["x"]` selects: good for x < 0.5, a bad value otherwise."""

    bad: object = True

    def setup(self, config, ctx):
        self.x = config["x"]

    def step(self):
        return {"score": self.x if self.x < 0.5 else type(self).bad}


@pytest.mark.parametrize("bad, message", [(True, "must be a finite real number, got True"),
                                          (float("inf"), "must be a finite real number, got inf"),
                                          ({1: 2}, "must be a real number, a string, a boolean or None, got dict"),
                                          ("high", "must be a finite real number, got 'high'"),
                                          (10 ** 400, "is too large for a float")])
def test_a_bad_report_fails_only_its_trial(bad, message):
    trainer = type("Bad", (Reports,), {"bad": bad})
    result = nasplat.run(trainer=trainer, space=SPACE, metric="score", max_trials=20, seed=2, max_failed_trials=None)
    failed = [row for row in result.rows if row["status"] == "failed"]
    assert {row["trial_id"] for row in failed} == {row["trial_id"] for row in result.rows if row["config"]["x"] >= 0.5}
    assert failed and all("metric 'score'" in row["error"] and message in row["error"] for row in failed)
    assert result.counts()["completed"] == 20 - len(failed)


class AlwaysFails(Trainer):
    def setup(self, config, ctx):
        raise RuntimeError(f"cannot build x={config['x']:.3f}")

    def step(self):
        return {}


def test_more_failed_trials_than_allowed_stop_the_run_with_the_first_errors(tmp_path):
    message = r"4 trials failed, more than max_failed_trials=3.*trial 0: RuntimeError: cannot build x="
    with pytest.raises(ExperimentFailed, match=message):
        nasplat.run(trainer=AlwaysFails, space=SPACE, metric="score", max_trials=1000, time_budget_s=1e9,
                    max_failed_trials=3, storage=tmp_path, name="doomed", concurrency=2)
    rows = ExperimentResult.load(tmp_path / "doomed").rows
    assert [row["status"] for row in rows] == ["failed"] * 4


class Cost(Trainer):
    def setup(self, config, ctx):
        self.x = config["x"]

    def step(self):
        return {"score": self.x, "time_cost": 0.0}


def test_a_step_that_costs_no_simulated_time_fails_instead_of_stopping_the_clock():
    with pytest.raises(ExperimentFailed, match="needs a finite 'time_cost' metric > 0"):
        nasplat.run(trainer=Cost, space=SPACE, metric="score", executor="simulated", time_budget_s=10.0)


class FlakyOnce(Trainer):
    """Fails at step 2 of every trial's first attempt (the attempt shows in the seed the engine derives)."""

    seen: set = set()

    def setup(self, config, ctx):
        self.x, self.t, self.first = config["x"], 0, (ctx.trial_id not in FlakyOnce.seen)
        FlakyOnce.seen.add(ctx.trial_id)

    def step(self):
        self.t += 1
        if self.first and self.t == 2:
            raise ValueError("lost the GPU")
        return {"score": self.x + self.t}


def test_a_retry_is_a_new_attempt_whose_failed_predecessor_keeps_its_row_and_error():
    FlakyOnce.seen = set()
    result = nasplat.run(trainer=FlakyOnce, space=SPACE, metric="score", max_trials=3, max_steps=3, max_failures=1)
    keys = [(r["trial_id"], r["attempt"], r["step"], r["status"]) for r in result.rows]
    for trial in range(3):
        mine = [k[1:] for k in keys if k[0] == trial]
        assert mine == [(0, 1, "retried"), (0, 2, "retried"), (1, 1, "running"), (1, 2, "running"),
                        (1, 3, "completed")]  # the retry started over: its first attempt's step 1 is void too
    retried = [r for r in result.rows if r["status"] == "retried" and r["step"] == 2]  # each failed step's own
    assert len(retried) == 3 and all("ValueError: lost the GPU" in r["error"] for r in retried)


def test_a_yaml_experiment_is_stored_as_plain_json_and_damage_is_named(tmp_path):
    nasplat.run(trainer="trainers.pbt_toy:PBTToy", space="trainers.pbt_toy:space", metric="Q", max_trials=3,
                storage=tmp_path, name="plain")
    folder = tmp_path / "plain"
    assert json.loads((folder / "experiment.json").read_text())["trainer"] == "trainers.pbt_toy:PBTToy"
    assert not (folder / "experiment.pkl").exists()
    lines = (folder / "results.jsonl").read_text().splitlines()
    lines[1] = lines[1][:-3] + "#"
    (folder / "results.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"results.jsonl, line 2: not a JSON object"):
        ExperimentResult.load(folder)
    with pytest.raises(ValueError, match=r"results.jsonl, line 2: not a JSON object"):
        nasplat.resume(folder)
