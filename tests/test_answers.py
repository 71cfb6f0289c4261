"""A deterministic trainer's config already completed is answered from the record, not run again (issue 32): every
evaluation distinct, the search's decisions and result unchanged, a resume after a kill the same (< 60 s)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest

import nasplat
from nasplat import Choice, Int, Trainer
from nasplat.oneshot import SharedWeights, search_trainer
from nasplat.space import Space
from nasplat.storage import read_rows
from nasplat.trainer import WorkerContext, start
from search_spaces import nb201
from trainers.supernet import NB201PathTrainer, NB201SupernetTrainer

SUPERNET = {"channels": 4, "train_size": 640, "epochs": 2, "eval_paths": 1}
SMALL = Space({edge: Choice(["skip_connect", "nor_conv_3x3"]) for edge in nb201.EDGES})  # 64 paths
DECIDED = ("trial_id", "step", "status", "config", "parent_id", "valid_acc")


@pytest.fixture(scope="module")
def weights() -> SharedWeights:
    trainer = start(NB201SupernetTrainer(), SUPERNET, WorkerContext(seed=0))
    for _ in range(2):
        trainer.step()
    return SharedWeights(trainer.state_dict())


class Counted(NB201PathTrainer):
    """A path trial that counts its evaluations (the local executor runs them in this process)."""

    evaluated: ClassVar[list[str]] = []

    def step(self) -> dict[str, Any]:
        Counted.evaluated.append(json.dumps(self.config, sort_keys=True))
        return super().step()


class Rerun(Counted):
    """The same trial, not declared deterministic: every duplicate is evaluated again (the code before issue 32)."""

    deterministic = False


def search(trainer: type, weights: SharedWeights) -> nasplat.ExperimentResult:
    Counted.evaluated = []
    return nasplat.run(trainer=search_trainer(trainer, weights, SUPERNET), space=SMALL, metric="valid_acc",
                       controller="evolution", controller_options={"population_size": 8, "sample_size": 3},
                       max_trials=100, seed=11)


def test_a_weight_sharing_search_evaluates_each_path_once_and_decides_as_if_it_ran_them_all(
        weights: SharedWeights) -> None:
    assert NB201PathTrainer.deterministic and not Rerun.deterministic
    again = search(Rerun, weights)
    rerun_evaluations = list(Counted.evaluated)
    once = search(Counted, weights)
    evaluations = list(Counted.evaluated)
    assert len(rerun_evaluations) == 100 and len(set(rerun_evaluations)) < 60, len(set(rerun_evaluations))
    assert len(evaluations) == len(set(evaluations)) == len(set(rerun_evaluations))  # each distinct path once
    assert [tuple(json.dumps(r[k], sort_keys=True) for k in DECIDED) for r in once.rows] == \
        [tuple(json.dumps(r[k], sort_keys=True) for k in DECIDED) for r in again.rows]  # the same decisions
    assert once.best["config"] == again.best["config"] and len(once.rows) == 100
    first: dict[str, int] = {}
    for row in once.rows:
        key = json.dumps(row["config"], sort_keys=True)
        if key in first:  # a duplicate: recorded as a trial, answered by the first trial of its path
            assert row["cached_from"] == first[key] and row["node"] == "" and row["start"] == row["end"]
            assert row["eval_ms"] == next(r["eval_ms"] for r in once.rows if r["trial_id"] == first[key])
        else:
            first[key] = row["trial_id"]
            assert "cached_from" not in row and row["pid"] == os.getpid()
    assert sum("cached_from" in r for r in once.rows) == 100 - len(evaluations)


class Counter(Trainer):
    """Deterministic in its config: counts its steps; its score rises with them."""

    deterministic = True

    def setup(self, config: dict[str, Any], ctx: WorkerContext) -> None:
        self.t = 0

    def step(self) -> dict[str, Any]:
        self.t += 1
        return {"score": self.t * (1 + self.config["k"]) + (0.5 if self.config["op"] == "b" else 0.0)}

    def state_dict(self) -> dict[str, Any]:
        return {"t": self.t}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.t = state["t"]


def test_a_paused_answered_trial_is_answered_on_where_it_stands() -> None:
    space = {"k": Int(0, 1), "op": Choice(["a", "b"])}  # 4 configs for 16 trials
    result = nasplat.run(trainer=Counter, space=space, metric="score", max_trials=16, max_steps=9, seed=3,
                         scheduler={"name": "asha", "type": "promote"})
    answered = [r for r in result.rows if "cached_from" in r]
    assert answered and {r["status"] for r in answered} >= {"paused"}
    for row in answered:  # each step answered by its source's row of the same step
        source = next(r for r in result.rows if r["trial_id"] == row["cached_from"] and r["step"] == row["step"])
        assert row["score"] == source["score"] and row["config"] == source["config"]
    trials = {r["trial_id"] for r in result.rows}
    for trial_id in trials:
        steps = [r["step"] for r in result.rows if r["trial_id"] == trial_id]
        assert steps == list(range(1, len(steps) + 1)), (trial_id, steps)


DRIVER = """
import os, signal, sys
from pathlib import Path

import nasplat
from nasplat import Choice, Int, Trainer
from nasplat.storage import files, folder

count, kill_at = [0], int(os.environ.get("KILL_AT", "0"))
append = files.RowLog.append

def killing_append(self, item):
    if "trial_id" in item:
        count[0] += 1
        if count[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
    append(self, item)

files.RowLog.append = killing_append
sync = folder.ExperimentFolder.sync
folder.ExperimentFolder.sync = lambda self, force=False: sync(self, force=True)

class Counter(Trainer):
    deterministic = True
    def setup(self, config, ctx):
        self.t = 0
    def step(self):
        self.t += 1
        return {"score": self.t * (1 + self.config["k"]) + (0.5 if self.config["op"] == "b" else 0.0)}
    def state_dict(self):
        return {"t": self.t}
    def load_state_dict(self, state):
        self.t = state["t"]

SPACE = {"k": Int(0, 1), "op": Choice(["a", "b"])}
if sys.argv[1] == "run":
    nasplat.run(trainer=Counter, space=SPACE, metric="score", max_trials=16, max_steps=9, seed=3,
                scheduler={"name": "asha", "type": "promote"}, storage=sys.argv[2], name="exp", checkpoint={"every": 2})
else:
    nasplat.resume(Path(sys.argv[2]) / "exp", allow_pickle=True)  # Counter lives in this script's __main__
print("ROWS", count[0])
"""
FIELDS = ("trial_id", "step", "status", "config", "score", "cached_from", "error")


def _drive(script: Path, *args: str, kill_at: int = 0) -> subprocess.CompletedProcess:
    env = {**os.environ, "KILL_AT": str(kill_at), "NASPLAT_TENSORBOARD": "0"}
    return subprocess.run([sys.executable, str(script), *args], check=False, env=env, capture_output=True, text=True,
                          timeout=120)


def _rows(folder: Path) -> list[tuple[str, ...]]:
    rows = read_rows(folder / "results.jsonl")
    return [tuple(json.dumps(row.get(k), sort_keys=True) for k in FIELDS) for row in rows]


def test_a_run_killed_anywhere_and_resumed_records_the_decisions_of_an_uninterrupted_run(tmp_path: Path) -> None:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    clean = _drive(script, "run", str(tmp_path / "clean"))
    assert clean.returncode == 0, clean.stderr[-3000:]
    reference = _rows(tmp_path / "clean" / "exp")
    total = int(clean.stdout.split("ROWS")[-1])
    answered = [i for i, row in enumerate(reference) if row[5] != "null"]
    assert total == len(reference) and answered and json.dumps("paused") in {reference[i][2] for i in answered}
    points = sorted({answered[len(answered) // 2] + 1, answered[-1] + 1, total // 3})
    for point in points:
        storage = tmp_path / f"kill-{point}"
        killed = _drive(script, "run", str(storage), kill_at=point)
        assert killed.returncode == -signal.SIGKILL, (point, killed.stderr[-2000:])
        resumed = _drive(script, "resume", str(storage))
        assert resumed.returncode == 0, (point, resumed.stderr[-2000:])
        assert "warning" not in resumed.stdout + resumed.stderr, (point, resumed.stderr[-2000:])
        assert sorted(_rows(storage / "exp")) == sorted(reference), f"rows differ after a kill at row {point}"
