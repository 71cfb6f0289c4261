"""Storage faults that used to lose a run: a full disk (a real tmpfs, mounted here where the machine allows), a
folder copied elsewhere with its original deleted, checkpoints missing or cut short, and `file://` storage."""

from __future__ import annotations

import errno
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import nasplat
from nasplat import Float, Trainer
from nasplat.cli import main
from nasplat.engine.result import ExperimentResult
from nasplat.storage import ROWS_FILE, Storage, StorageError, read_rows, write_atomic
from nasplat.storage.checkpoints import MANIFEST_FILE, STATE_FILE, list_checkpoints, load_checkpoint, write_checkpoint

NASPLAT = Path(sys.executable).parent / "nasplat"
SPACE = {"x": Float(0.0, 1.0)}

MODULE = '''
import os, signal, time
from pathlib import Path
import torch
from nasplat import Trainer

class Counter(Trainer):
    """Counts its steps in its state; SIGKILLs its own process (the driver, on `local`) at $KILL_AT=trial:step."""
    def setup(self, config, ctx):
        self.x, self.t, self.trial = config["x"], 0, ctx.trial_id
        self.w = torch.full((16,), float(self.trial))
    def step(self):
        home = os.environ.get("EXPERIMENT")  # the first run's folder
        done = Path(home or ".", "checkpoints", f"trial-{self.trial}", f"step-{self.t}", "manifest.json")
        for _ in range(3000):  # there, the step before is checkpointed first (its manifest is written last)
            if home is None or self.t == 0 or done.exists():
                break
            time.sleep(0.01)
        self.t += 1
        if os.environ.get("KILL_AT") == f"{self.trial}:{self.t}":
            os.kill(os.getpid(), signal.SIGKILL)
        return {"score": self.x + 0.01 * self.t, "t": self.t}
    def state_dict(self):
        return {"t": self.t, "w": self.w}
    def load_state_dict(self, state):
        self.t, self.w = state["t"], state["w"]
'''

DRIVER = '''
import sys
import nasplat
from nasplat import Float
nasplat.run(trainer="faults_counter:Counter", space={"x": Float(0.0, 1.0)}, metric="score", max_trials=3,
            max_steps=5, concurrency=2, seed=1, storage=sys.argv[1], name="exp", checkpoint={"every": 1})
'''


class Heavy(Trainer):
    """A step count and a 1 MiB tensor in its state: its checkpoints do not fit on the small disk, its rows do.
    `fill`: a file that the step `fill_at` grows until the disk is full."""

    fill: Path | None = None
    fill_at = 0

    def setup(self, config, ctx):
        self.x, self.t, self.w = config["x"], 0, torch.zeros(256 * 1024)

    def step(self):
        self.t += 1
        if self.fill is not None and self.t == self.fill_at:
            _fill(self.fill, leave=0)
        return {"score": self.x + 0.01 * self.t, "t": self.t, "time_cost": 1.0}

    def state_dict(self):
        return {"t": self.t, "w": self.w}

    def load_state_dict(self, state):
        self.t, self.w = state["t"], state["w"]


def _fill(path: Path, leave: int) -> None:
    """Grow `path` until its filesystem has at most `leave` bytes free (0: until a write is refused)."""
    with open(path, "ab", buffering=0) as f:
        try:
            while (free := os.statvfs(path.parent).f_bavail * os.statvfs(path.parent).f_frsize) > leave:
                f.write(b"\0" * min(64 * 1024, max(4096, free - leave)))
        except OSError as exc:
            assert exc.errno == errno.ENOSPC


@pytest.fixture
def disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A 4 MiB tmpfs mounted at tmp_path/disk (skipped where this machine does not let the test mount one)."""
    where = tmp_path / "disk"
    where.mkdir()
    if sys.platform != "linux" or os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs Linux and root; the full-disk tests need a real full filesystem")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode}); the full-disk tests need "
                    "a real full filesystem")
    monkeypatch.setenv("NASPLAT_TENSORBOARD", "0")
    try:
        yield where
    finally:
        Heavy.fill = None
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_checkpoints_on_a_full_disk_name_enospc_and_the_path_and_the_run_says_how_many_it_lost(disk, capsys):
    (disk / "store").mkdir()
    _fill(disk / "filler", leave=384 * 1024)
    result = nasplat.run(trainer=Heavy, space=SPACE, metric="score", max_trials=2, max_steps=3, seed=0,
                         executor="simulated", storage=disk / "store", name="exp", checkpoint={"every": 1})
    err = capsys.readouterr().err.splitlines()
    assert sorted((r["trial_id"], r["step"]) for r in result.rows) == [(t, s) for t in (0, 1) for s in (1, 2, 3)]
    assert not any(r.get("checkpoint") for r in result.rows)  # the rows are all there, no checkpoint is
    failed = [line for line in err if "checkpoint of trial" in line and "failed" in line]
    path = disk / "store" / "exp" / "checkpoints" / "trial-0" / "step-1"
    assert failed[0].startswith("[nasplat exp] checkpoint of trial 0 at step 1 failed: ENOSPC (No space left on "
                                f"device): cannot write {path}"), err
    assert len(failed) == 3 and failed[-1].endswith("further failures are counted at the end"), err
    assert "unexpected pos" not in "\n".join(err)
    summary = [line for line in err if "could not be written" in line]
    assert summary == [f"[nasplat exp] 6 checkpoints could not be written; the first, of trial 0 at step 1: "
                       f"ENOSPC (No space left on device): cannot write {path}/{STATE_FILE}. Their trials went on; "
                       "a retry or resume starts from an earlier checkpoint or from scratch; among them the last "
                       "one of trials 0, 1: their final state is not stored"], err
    with pytest.raises(StorageError) as info:
        write_atomic(disk / "store" / "more.bin", b"\0" * (1 << 20))
    assert info.value.errno == errno.ENOSPC and str(pickle.loads(pickle.dumps(info.value))) == str(info.value)


def test_rows_on_a_full_disk_stop_the_run_with_enospc_and_the_file_and_resume_goes_on(disk):
    Heavy.fill, Heavy.fill_at = disk / "filler", 2
    with pytest.raises(StorageError) as info:
        nasplat.run(trainer=Heavy, space=SPACE, metric="score", max_trials=1, max_steps=400, seed=0,
                    storage=disk / "store", name="exp")
    folder = disk / "store" / "exp"
    assert str(info.value).startswith(f"ENOSPC (No space left on device): cannot append to {folder / ROWS_FILE}; "
                                      "the run stops here")
    kept = read_rows(folder / ROWS_FILE)  # whole lines; a part of the refused one is dropped when read
    assert 2 <= len(kept) < 400 and [r["step"] for r in kept] == list(range(1, len(kept) + 1))
    Heavy.fill = None
    (disk / "filler").unlink()
    rows = nasplat.resume(folder).rows
    assert [r["step"] for r in rows] == list(range(1, 401)) and rows[-1]["status"] == "completed"


@pytest.fixture
def killed(tmp_path: Path) -> Path:
    """A run of three trials (checkpoints every step) whose driver was SIGKILLed in trial 1's third step."""
    (tmp_path / "faults_counter.py").write_text(MODULE)
    (tmp_path / "driver.py").write_text(DRIVER)
    env = {**os.environ, "KILL_AT": "1:3", "NASPLAT_TENSORBOARD": "0", "EXPERIMENT": str(tmp_path / "original" / "exp"),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "driver.py", str(tmp_path / "original")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
    return tmp_path / "original" / "exp"


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NASPLAT_TENSORBOARD": "0"}
    return subprocess.run([str(NASPLAT), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _every_step_once_from_its_state(folder: Path) -> None:
    rows = read_rows(folder / ROWS_FILE)
    pairs = sorted((r["trial_id"], r["step"]) for r in rows)
    assert pairs == [(t, s) for t in range(3) for s in range(1, 6)], pairs
    assert all(r["t"] == r["step"] and r["status"] in ("running", "completed") for r in rows), rows


def test_a_killed_runs_copy_resumes_from_its_own_checkpoints_and_a_missing_one_starts_over(killed, tmp_path):
    copy, damaged = tmp_path / "elsewhere" / "exp", tmp_path / "damaged" / "exp"
    shutil.copytree(killed, copy)
    shutil.copytree(killed, damaged)
    shutil.rmtree(killed.parent)
    before = read_rows(copy / ROWS_FILE)
    assert all(r["checkpoint"] == f"checkpoints/trial-{r['trial_id']}/step-{r['step']}"
               for r in before if r.get("checkpoint"))  # relative to the folder, which may move
    assert _cli(tmp_path, "status", str(copy)).returncode == 0
    done = _cli(tmp_path, "resume", str(copy))
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"results: {copy}" in done.stdout
    _every_step_once_from_its_state(copy)

    latest = max((r for r in before if r["trial_id"] == 1 and r.get("checkpoint")), key=lambda r: r["step"])
    manifest = damaged / latest["checkpoint"] / MANIFEST_FILE
    manifest.write_bytes(manifest.read_bytes()[:-7])  # cut short: not complete any more
    done = _cli(tmp_path, "resume", str(damaged))
    assert done.returncode == 0, done.stderr[-3000:]
    assert (f"resume: trial 1's checkpoint at step {latest['step']} ({latest['checkpoint']}) is missing or "
            "incomplete") in done.stderr
    _every_step_once_from_its_state(damaged)


class Weights(Trainer):
    """A tensor set from its config in its state, for `nasplat export --format pt`."""

    def setup(self, config, ctx):
        self.w = torch.full((64,), config["x"])

    def step(self):
        return {"score": float(self.w[0])}

    def state_dict(self):
        return {"w": self.w}

    def load_state_dict(self, state):
        self.w = state["w"]


def test_a_finished_runs_copy_reads_its_own_checkpoints_status_and_export_work_there(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("NASPLAT_TENSORBOARD", "0")
    result = nasplat.run(trainer=Weights, space=SPACE, metric="score", max_trials=3, seed=2, storage=tmp_path / "a",
                         name="exp", checkpoint=True)
    original, copy = tmp_path / "a" / "exp", tmp_path / "b" / "exp"
    shutil.copytree(original, copy)
    best = result.checkpoint
    assert best is not None and best.uri == str(original / "checkpoints" / f"trial-{best.trial_id}" / "step-1")
    planted = original / "checkpoints" / f"trial-{best.trial_id}" / "step-1" / STATE_FILE
    torch.save({"w": torch.full((64,), -1.0)}, planted)  # the original's, still there, differs from the copy's
    manifest = json.loads((planted.parent / MANIFEST_FILE).read_text())
    manifest["files"][STATE_FILE] = planted.stat().st_size  # and is complete
    (planted.parent / MANIFEST_FILE).write_text(json.dumps(manifest))
    assert main(["export", str(copy), "--format", "pt", "-o", str(tmp_path / "copy.pt")]) == 0
    assert torch.equal(torch.load(tmp_path / "copy.pt")["state_dict"]["w"], torch.full((64,), best_x(result)))
    shutil.rmtree(tmp_path / "a")
    assert main(["status", str(copy)]) == 0
    assert main(["export", str(copy), "--format", "pt", "-o", str(tmp_path / "x.pt")]) == 0
    assert torch.load(tmp_path / "x.pt")["trial_id"] == best.trial_id
    capsys.readouterr()


def best_x(result: ExperimentResult) -> float:
    return float(torch.tensor(result.best["config"]["x"], dtype=torch.float32))


def test_a_manifest_cut_short_or_naming_other_sizes_is_incomplete(tmp_path):
    storage = Storage(tmp_path / "checkpoints")
    for step in (1, 2, 3):
        write_checkpoint(storage, 0, step, {"t": step, "w": torch.zeros(32)}, {"x": 0.5})
    (tmp_path / "checkpoints" / "trial-0" / "step-2" / MANIFEST_FILE).write_text('{"trial_id": 0, "st')
    with open(tmp_path / "checkpoints" / "trial-0" / "step-3" / STATE_FILE, "ab") as f:
        f.write(b"\0")  # not the size its manifest names
    assert [c.step for c in list_checkpoints(storage, 0)] == [1]
    rows = [{"trial_id": 0, "step": s, "status": "running", "score": 1.0, "config": {},
             "checkpoint": f"checkpoints/trial-0/step-{s}"} for s in (1, 2, 3)]
    found = ExperimentResult(rows, "score", path=tmp_path).find_checkpoint(0, step=3)  # an older one, asked for
    assert (found.step, found.uri) == (1, str(tmp_path / "checkpoints" / "trial-0" / "step-1"))
    with pytest.raises(LookupError, match="trial 0's checkpoint at its last step 3 is missing or incomplete in "
                                          "storage; the newest one left is at step 1: ask for it with step=1"):
        ExperimentResult(rows, "score", path=tmp_path).find_checkpoint(0)  # not taken silently
    with pytest.raises(FileNotFoundError, match="is not a complete checkpoint .*cannot be read"):
        load_checkpoint(str(tmp_path / "checkpoints" / "trial-0" / "step-2"))
    old = {"trial_id": 0, "step": 1, "bytes": (tmp_path / "checkpoints/trial-0/step-1" / STATE_FILE).stat().st_size}
    (tmp_path / "checkpoints" / "trial-0" / "step-1" / MANIFEST_FILE).write_text(json.dumps(old))
    assert load_checkpoint(str(tmp_path / "checkpoints" / "trial-0" / "step-1"))["t"] == 1  # a manifest before files


def test_file_uri_storage_prints_the_uri_and_reads_its_checkpoints(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("NASPLAT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("NASPLAT_TENSORBOARD", "0")
    monkeypatch.chdir(tmp_path)
    uri = f"file://{tmp_path / 'remote'}"
    (tmp_path / "exp.yaml").write_text(
        "name: exp\ntrainer: test_storage_faults:Weights\nspace: test_storage_faults:SPACE\nmetric: score\n"
        "controller: random\nbudget: {max_trials: 2, max_steps: 1}\nexecutor: local\ncheckpoint: true\n")
    assert main(["run", "exp.yaml", "--quiet", "--storage", uri]) == 0
    assert f"results: {uri}/exp  (nasplat status {uri}/exp" in capsys.readouterr().out
    result = ExperimentResult.load(f"{uri}/exp")
    assert result.location == f"{uri}/exp" and result.checkpoint.uri.startswith(f"{uri}/exp/checkpoints/")
    assert torch.equal(result.load_state()["w"], torch.full((64,), best_x(result)))
    assert main(["export", f"{uri}/exp", "--format", "pt", "-o", str(tmp_path / "w.pt")]) == 0
