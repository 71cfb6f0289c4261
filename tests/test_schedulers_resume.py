"""A driver SIGKILLed while ASHA has trials paused, then `nasplat resume`: the paused trials are promoted later and
continue from their saved step; the rows end exactly as those of an uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from processes import DIE_AFTER_ROWS

from nasplat.storage import read_rows

BIN = Path(sys.executable).parent

TOY = """
from nasplat import Float, Trainer

SPACE = {"x": Float(0.0, 1.0)}

class Counter(Trainer):
    def setup(self, config, ctx):
        self.x, self.t = config["x"], 0
    def step(self):
        self.t += 1
        return {"score": self.x + 0.01 * self.t, "t": self.t}
    def state_dict(self):
        return {"t": self.t}
    def load_state_dict(self, state):
        self.t = state["t"]
"""

# SIGKILLs itself right after the KILL_AFTER-th row reached results.jsonl (0: never)
DRIVER = DIE_AFTER_ROWS + """
nasplat.run(trainer="toy_asha:Counter", space="toy_asha:SPACE", metric="score", executor="local", concurrency=1,
            max_trials=12, max_steps=9, seed=1, scheduler={"name": "asha", "type": "promote"},
            storage=sys.argv[1], name=sys.argv[2], checkpoint=os.environ["CHECKPOINT"] == "1")
"""


def _drive(tmp_path: Path, name: str, kill_after: int, checkpoint: bool) -> subprocess.CompletedProcess:
    env = {**os.environ, "KILL_AFTER": str(kill_after), "CHECKPOINT": str(int(checkpoint)),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", DRIVER, str(tmp_path), name], env=env, capture_output=True,
                          text=True, timeout=120)


def _rows(folder: Path) -> list[tuple]:
    return [(r["trial_id"], r["step"], r["status"], r["t"], r["score"]) for r in read_rows(folder / "results.jsonl")]


@pytest.mark.parametrize("checkpoint", [True, False])
def test_sigkill_with_paused_trials_then_resume_continues_them_from_their_saved_step(tmp_path, checkpoint):
    (tmp_path / "toy_asha.py").write_text(TOY)
    whole = _drive(tmp_path, "whole", 0, checkpoint)
    assert whole.returncode == 0, whole.stderr[-2000:]
    expected = _rows(tmp_path / "whole")
    kill_after = 14
    killed = _drive(tmp_path, "killed", kill_after, checkpoint)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    before = _rows(tmp_path / "killed")
    paused_then = {r[0]: r[1] for r in before if r[2] == "paused"}
    assert len(before) == kill_after and len(paused_then) >= 4
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    resumed = subprocess.run([str(BIN / "nasplat"), "resume", str(tmp_path / "killed"), "--quiet"], env=env,
                             capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    after = _rows(tmp_path / "killed")
    assert after == expected  # no row lost or repeated, same decisions
    promoted_later = [r for r in after[kill_after:] if r[0] in paused_then and r[1] == paused_then[r[0]] + 1]
    assert promoted_later  # paused before the kill, promoted after it
    assert all(r[3] == r[1] for r in promoted_later)  # continued from the saved step: its counter went on
