"""Crash consistency and the folder lock: a driver SIGKILLed anywhere, then resumed, ends with exactly the rows of an
uninterrupted run; a second driver on a held folder is refused, and takes over once the holder is dead."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from nasplat.storage import read_rows

BIN = Path(sys.executable).parent

# A deterministic experiment whose driver SIGKILLs itself at the KILL_AT-th write event: a row or journal line cut
# in half, a file fsynced but not yet renamed into place, or a rename done but not yet synced.
DRIVER = """
import os, signal, sys
from pathlib import Path

import nasplat
from nasplat import Choice, Float, Int, Trainer
from nasplat.executors.local import LocalExecutor
from nasplat.storage import files, folder

events, kill_at = [0], int(os.environ.get("KILL_AT", "0"))

def tick():
    events[0] += 1
    return events[0] == kill_at

append, replace, fsync = files.RowLog.append, os.replace, os.fsync

def torn_append(self, item):
    if tick():
        text = files.json.dumps(item, default=files.json_default)
        self.file.write(text[: len(text) // 2])
        self.file.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    append(self, item)

def killing(function):
    def call(*args):
        if tick():
            os.kill(os.getpid(), signal.SIGKILL)
        return function(*args)
    return call

files.RowLog.append = torn_append
os.replace, os.fsync = killing(replace), killing(fsync)

# The folder syncs on a clock, and the checkpoint writer's thread releases waiting rows (each release a sync) when
# it happens to finish; syncing at every call and writing checkpoints in line make the write events, and so the
# kill points, the same in every run, however busy the machine.
sync = folder.ExperimentFolder.sync
folder.ExperimentFolder.sync = lambda self, force=False: sync(self, force=True)
LocalExecutor.background_writes = False

class Toy(Trainer):
    def setup(self, config, ctx):
        self.x, self.t = config["x"], 0
    def step(self):
        self.t += 1
        return {"score": -(self.x - 0.3) ** 2 + 0.01 * self.t + (0.05 if self.config["op"] == "b" else 0.0)}
    def state_dict(self):
        return {"t": self.t}
    def load_state_dict(self, state):
        self.t = state["t"]

SPACE = {"x": Float(0.0, 1.0), "k": Int(1, 4), "op": Choice(["a", "b", "c"])}
if sys.argv[1] == "run":
    nasplat.run(trainer=Toy, space=SPACE, metric="score", controller="evolution",
                controller_options={"population_size": 4, "sample_size": 2}, max_trials=12, max_steps=3, seed=7,
                storage=sys.argv[2], name="exp", checkpoint={"every": 1})
else:
    nasplat.resume(Path(sys.argv[2]) / "exp", allow_pickle=True)  # Toy lives in this script's __main__
print("EVENTS", events[0])
"""

FIELDS = ("trial_id", "step", "attempt", "status", "config", "parent_id", "donor_id", "score", "error")


def _drive(script: Path, *args: str, kill_at: int = 0) -> subprocess.CompletedProcess:
    env = {**os.environ, "KILL_AT": str(kill_at)}
    return subprocess.run([sys.executable, str(script), *args], env=env, capture_output=True, text=True, timeout=120)


def _rows(folder: Path) -> list[tuple]:
    return sorted(tuple(json.dumps(row.get(k), sort_keys=True) for k in FIELDS)
                  for row in read_rows(folder / "results.jsonl"))


@pytest.mark.slow
def test_sigkill_at_30_points_then_resume_ends_with_the_rows_of_an_uninterrupted_run(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    clean = _drive(script, "run", str(tmp_path / "clean"))
    assert clean.returncode == 0, clean.stderr[-3000:]
    total = int(clean.stdout.split("EVENTS")[-1])
    reference = _rows(tmp_path / "clean" / "exp")
    assert len(reference) == 36 and total > 60
    points = sorted({round(1 + i * (total - 2) / 29) for i in range(30)})
    assert len(points) == 30
    for point in points:
        storage = tmp_path / f"kill-{point}"
        killed = _drive(script, "run", str(storage), kill_at=point)
        assert killed.returncode == -signal.SIGKILL, (point, killed.stderr[-2000:])
        if not (storage / "exp" / "results.jsonl").exists():  # killed before the folder was complete: run again
            again = _drive(script, "run", str(storage))
            assert again.returncode == 0, (point, again.stderr[-2000:])
        else:
            resumed = _drive(script, "resume", str(storage))
            assert resumed.returncode == 0, (point, resumed.stderr[-2000:])
        assert _rows(storage / "exp") == reference, f"rows differ after a kill at write event {point}"


HOLDER = """
import os, time
from nasplat import Float, Trainer

space = {"x": Float(0.0, 1.0)}

class Sleepy(Trainer):
    def setup(self, config, ctx):
        self.x = config["x"]
    def step(self):
        if os.environ.get("HOLD") == "1":
            print("STEPPED", flush=True)
            time.sleep(600)
        return {"score": self.x}
"""
RUN_HOLDER = ("import sys, nasplat; nasplat.run(trainer='holder:Sleepy', space='holder:space', metric='score', "
              "max_trials=2, storage=sys.argv[1], name='held')")


def test_a_second_driver_is_refused_with_the_holder_named_and_takes_over_a_dead_holder(tmp_path):
    (tmp_path / "holder.py").write_text(HOLDER)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    holder = subprocess.Popen([sys.executable, "-c", RUN_HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                              env={**env, "HOLD": "1"})
    try:
        assert holder.stdout.readline().strip() == "STEPPED"  # the holder owns the folder and is mid-step
        second = subprocess.run([str(BIN / "nasplat"), "resume", str(tmp_path / "held"), "--quiet"],
                                capture_output=True, text=True, timeout=120, env=env)
        assert second.returncode == 2, second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and f"pid {holder.pid}" in lines[0] and "in use by another nasplat driver" in lines[0]
    finally:
        holder.kill()
        holder.wait()
    resumed = subprocess.run([str(BIN / "nasplat"), "resume", str(tmp_path / "held"), "--quiet"],
                             capture_output=True, text=True, timeout=120, env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = read_rows(tmp_path / "held" / "results.jsonl")
    assert sorted((r["trial_id"], r["status"]) for r in rows) == [(0, "completed"), (1, "completed")]
