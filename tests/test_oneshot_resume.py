"""A supernet training trial whose driver is SIGKILLed goes on from its checkpoint step after `nasplat resume`, and
ends where an uninterrupted run ends (issue 20)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from nasplat.engine.result import ExperimentResult
from nasplat.storage import CHECKPOINTS, ROWS_FILE, Storage, read_rows
from nasplat.storage.checkpoints import list_checkpoints

ROOT = Path(__file__).resolve().parents[1]
EPOCHS = 5
HOLD_AT = 3  # the epoch whose step waits for the kill; the checkpoints of epochs 1 and 2 are durable by then

DRIVER = f"""
import os, sys, threading
import nasplat
from nasplat import Choice
from trainers.supernet import NB201SupernetTrainer

class Held(NB201SupernetTrainer):
    '''The supernet trainer, except that in the first run its epoch {HOLD_AT} says so and waits for the kill.'''
    def step(self):
        with open(os.environ["STEPS_LOG"], "a") as log:  # the epochs this driver trained
            log.write(f"{{self.epoch + 1}}\\n")
        if os.environ.get("HOLD") == "1" and self.epoch == {HOLD_AT - 1}:
            print("HELD", flush=True)
            threading.Event().wait(120)
        return super().step()

kwargs = dict(trainer=Held, space={{"channels": Choice([4]), "train_size": Choice([640]), "eval_paths": Choice([2])}},
              metric="valid_acc", max_trials=1, max_steps={EPOCHS}, seed=7, storage=sys.argv[2], name="supernet",
              checkpoint={{"every": 1}}, progress=False)
if sys.argv[1] == "run":
    nasplat.run(**kwargs)
else:
    nasplat.resume(sys.argv[2] + "/supernet", progress=False, allow_pickle=True)
"""


def _driver(tmp_path: Path, command: str, storage: str, *, hold: bool) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]), "HOLD": "1" if hold else "0",
           "STEPS_LOG": str(tmp_path / f"{command}-{Path(storage).name}.steps")}
    return subprocess.Popen([sys.executable, str(tmp_path / "driver.py"), command, storage], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_a_sigkilled_supernet_trial_resumes_from_its_checkpoint_step_and_ends_as_if_never_killed(tmp_path: Path) -> None:
    (tmp_path / "driver.py").write_text(DRIVER)
    killed = _driver(tmp_path, "run", str(tmp_path / "killed"), hold=True)
    try:
        assert killed.stdout is not None and killed.stdout.readline().strip() == "HELD", killed.stderr.read()
    finally:
        killed.send_signal(signal.SIGKILL)
        killed.wait()
    folder = tmp_path / "killed" / "supernet"
    before = read_rows(folder / ROWS_FILE)
    durable = [c.step for c in list_checkpoints(Storage(str(folder / CHECKPOINTS)), 0)]
    assert [r["step"] for r in before] == list(range(1, len(before) + 1)) and 1 <= len(before) < HOLD_AT
    last = max(durable)  # a row waits for its step's checkpoint: every recorded step has a durable one
    assert set(range(1, len(before) + 1)) <= set(durable) and last < HOLD_AT
    resumed = _driver(tmp_path, "resume", str(tmp_path / "killed"), hold=False)
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read() if resumed.stderr else ""
    whole = _driver(tmp_path, "run", str(tmp_path / "whole"), hold=False)
    assert whole.wait(timeout=300) == 0, whole.stderr.read() if whole.stderr else ""

    trained = [int(e) for e in (tmp_path / "resume-killed.steps").read_text().split()]
    assert trained == list(range(last + 1, EPOCHS + 1))  # on from the checkpoint step, not from scratch
    rows = ExperimentResult.load(folder).rows
    assert [r["step"] for r in rows] == list(range(1, EPOCHS + 1))  # every epoch once, none lost, none twice
    assert rows[:len(before)] == before  # the rows from before the kill, unchanged
    per_epoch = rows[0]["paths_trained"]
    assert [r["epoch"] for r in rows] == [float(s) for s in range(1, EPOCHS + 1)]
    assert [r["paths_trained"] for r in rows] == [per_epoch * s for s in range(1, EPOCHS + 1)]  # not from scratch
    reference = ExperimentResult.load(tmp_path / "whole" / "supernet").rows
    for got, want in zip(rows, reference):  # the same paths and batches after the resume: the same numbers
        assert got["train_loss"] == pytest.approx(want["train_loss"], rel=1e-5)
        assert got["valid_acc"] == pytest.approx(want["valid_acc"], abs=1e-6)
