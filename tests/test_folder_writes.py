"""Writes that cannot destroy (issue 30): a folder is created and locked in one step, the lock is never opened
through a link, `export` writes atomically and never into an experiment folder or over a file unasked (a full disk
names ENOSPC and keeps the old file), CSV cells are escaped against formulas, a run whose last checkpoint could not be
written says so and exits 1 (nothing loads an older state unasked), and a retried step's rows are well defined.

Real folders, real processes where two drivers race, a real full filesystem (a small tmpfs, `disk` from
test_storage_faults) where the disk fills."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from test_storage_faults import _fill, disk  # noqa: F401 - `disk`: the tmpfs fixture

import nasplat
from nasplat import Choice, Float, Trainer
from nasplat.cli import main
from nasplat.engine.result import ExperimentResult
from nasplat.integrations.export import export_rows
from nasplat.oneshot.search import SharedWeights
from nasplat.storage import LOCK_FILE, ROWS_FILE, read_rows

SPACE = {"x": Float(0.0, 1.0)}


class Steps(Trainer):
    """Reports `score = x + step / 100` and keeps its step count and a small tensor in its state."""

    def setup(self, config, ctx):
        self.x, self.t, self.w = config["x"], 0, torch.zeros(8)

    def step(self):
        self.t += 1
        return {"score": self.x + self.t / 100, "t": self.t}

    def state_dict(self):
        return {"t": self.t, "w": self.w}

    def load_state_dict(self, state):
        self.t, self.w = state["t"], state["w"]


def _run(storage: Path, name: str = "exp", seed: int = 0, **options) -> ExperimentResult:
    return nasplat.run(trainer=Steps, space=SPACE, metric="score", max_trials=2, max_steps=2, seed=seed,
                       storage=storage, name=name, **options)


@pytest.fixture(autouse=True)
def _no_tensorboard(monkeypatch):
    monkeypatch.setenv("NASPLAT_TENSORBOARD", "0")


# -- 1. create and lock in one step ----------------------------------------------------------------------------

DELAYED = '''
import sys
from nasplat.storage.files import FolderLock

real = FolderLock.acquire

def delayed(self):  # the test's own pause, just before this driver takes the lock; the lock itself is real
    print("at-lock", flush=True)
    sys.stdin.readline()
    real(self)

FolderLock.acquire = delayed
import nasplat
from nasplat import Float
from test_folder_writes import Steps
nasplat.run(trainer=Steps, space={"x": Float(0.0, 1.0)}, metric="score", max_trials=3, max_steps=1, seed=9,
            storage=sys.argv[1], name="exp")
'''


def test_a_driver_delayed_before_the_lock_finds_the_experiment_another_finished_and_leaves_it_whole(tmp_path):
    (tmp_path / "delayed.py").write_text(DELAYED)
    env = {**os.environ, "NASPLAT_TENSORBOARD": "0",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    late = subprocess.Popen([sys.executable, "delayed.py", str(tmp_path / "store")], cwd=tmp_path, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert late.stdout.readline().strip() == "at-lock"  # it waits just before the lock, until told to go on
        first = _run(tmp_path / "store")  # meanwhile another driver runs a whole experiment there
        before = (tmp_path / "store" / "exp" / ROWS_FILE).read_bytes()
        out, err = late.communicate("go\n", timeout=240)
    finally:
        if late.poll() is None:
            late.kill()
    assert late.returncode != 0, out
    assert f"{tmp_path / 'store' / 'exp'} already holds an experiment; continue it with `nasplat resume" in err
    assert (tmp_path / "store" / "exp" / ROWS_FILE).read_bytes() == before  # the finished run is whole
    assert ExperimentResult.load(tmp_path / "store" / "exp").rows == first.rows


def test_rows_and_journal_are_created_exclusively_never_truncated(tmp_path):
    folder = tmp_path / "store" / "exp"
    folder.mkdir(parents=True)
    (folder / "journal.jsonl").write_text('{"ask": 0, "rows": 0}\n')  # left by something else: not ours to empty
    with pytest.raises(FileExistsError, match=r"journal.jsonl exists already: .* is not a fresh experiment folder"):
        _run(tmp_path / "store")
    assert (folder / "journal.jsonl").read_text() == '{"ask": 0, "rows": 0}\n'


# -- 2. the lock is never opened through a link -------------------------------------------------------------------

@pytest.mark.parametrize("link", ["symbolic", "hard"])
def test_a_lock_that_is_a_link_is_refused_in_one_line_and_its_target_untouched(tmp_path, capsys, link):
    _run(tmp_path / "store", checkpoint=True)
    folder = tmp_path / "store" / "exp"
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (folder / LOCK_FILE).unlink()
    os.symlink(victim, folder / LOCK_FILE) if link == "symbolic" else os.link(victim, folder / LOCK_FILE)
    capsys.readouterr()
    assert main(["resume", str(folder), "--quiet"]) == 2
    err = capsys.readouterr().err.splitlines()
    what = "a symbolic link" if link == "symbolic" else "a hard link to another file"
    assert err == [f"nasplat resume: error: {folder / LOCK_FILE} is " + (
        "a symbolic link; nasplat writes an experiment's files only as plain files of its folder, never through a "
        "link: remove the link" if link == "symbolic" else
        "a hard link to another file; an experiment's lock must be a plain file of its own: remove it")], err
    assert victim.read_text() == "precious\n"


@pytest.mark.parametrize("name", [ROWS_FILE, "journal.jsonl"])
def test_rows_or_journal_that_are_symbolic_links_are_refused_and_their_target_untouched(tmp_path, capsys, name):
    _run(tmp_path / "store", checkpoint={"every": 1})
    folder = tmp_path / "store" / "exp"
    victim = tmp_path / "victim.txt"
    victim.write_text(open(folder / name).read() + "precious, no newline")  # resume would cut a last partial line
    (folder / name).unlink()
    os.symlink(victim, folder / name)
    before = victim.read_text()
    capsys.readouterr()
    assert main(["resume", str(folder), "--quiet"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"nasplat resume: error: {folder / name} is a symbolic link; nasplat writes an experiment's files only as "
        "plain files of its folder, never through a link: remove the link"]
    assert victim.read_text() == before


@pytest.mark.parametrize("executor", ["local", "processes"])
def test_a_replaced_checkpoint_is_deleted_once_a_synced_row_names_its_successor(tmp_path, executor):
    """A checkpoint every step of 6: each trial keeps only its last (the older ones went as the rows naming their
    successors synced), and that one is the checkpoint its last row names and loads back."""
    result = nasplat.run(trainer=Steps, space=SPACE, metric="score", max_trials=2, max_steps=6, seed=0,
                         storage=tmp_path / "store", name="exp", checkpoint={"every": 1}, executor=executor)
    folder = tmp_path / "store" / "exp"
    on_disk = {str(p.parent.relative_to(folder)) for p in (folder / "checkpoints").rglob("state.pt")}
    named = {r["trial_id"]: r.get("checkpoint") for r in result.rows if r["step"] == 6}
    assert on_disk == set(named.values()) == {"checkpoints/trial-0/step-6", "checkpoints/trial-1/step-6"}
    assert result.load_state(0)["t"] == 6


# -- 3. export: atomic, never into an experiment folder, never over a file unasked, ENOSPC named ----------------

def test_export_refuses_the_experiments_own_folder_and_its_rows_stay(tmp_path, capsys):
    _run(tmp_path / "store")
    folder = tmp_path / "store" / "exp"
    rows = (folder / ROWS_FILE).read_bytes()
    for target, force in ((folder / ROWS_FILE, []), (folder / "rows.csv", ["--force"]),
                          (folder / "checkpoints" / "x.csv", [])):
        assert main(["export", str(folder), "--format", "csv", "-o", str(target), *force]) == 2
        assert capsys.readouterr().err.splitlines() == [
            f"nasplat export: error: export output {target} is inside the experiment folder {folder}: nasplat never "
            "writes an export there; name a file elsewhere with -o"]
    assert (folder / ROWS_FILE).read_bytes() == rows and not (folder / "rows.csv").exists()
    assert main(["status", str(folder)]) == 0


def test_export_refuses_an_existing_file_unless_forced_and_writes_no_temp_file(tmp_path, capsys, monkeypatch):
    _run(tmp_path / "store")
    folder = tmp_path / "store" / "exp"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rows.csv").write_text("mine\n")
    assert main(["export", str(folder), "-o", "rows.csv"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "nasplat export: error: export output rows.csv exists already; pass --force (force=True) to replace it"]
    assert (tmp_path / "rows.csv").read_text() == "mine\n"
    with pytest.raises(FileExistsError, match="exists already"):
        export_rows(folder, "csv", tmp_path / "rows.csv")
    assert main(["export", str(folder), "-o", "rows.csv", "--force"]) == 0
    assert len(pd.read_csv(tmp_path / "rows.csv")) == 4
    assert export_rows(folder) == Path("exp.parquet") and len(pd.read_parquet("exp.parquet")) == 4  # the default
    assert export_rows(folder, "csv", "rows.csv", force=True) == Path("rows.csv")
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["exp.parquet", "rows.csv"]  # no temp left


class Big(Steps):
    """A 1 MiB tensor in its state: its `pt` export does not fit on a full small disk."""

    def setup(self, config, ctx):
        super().setup(config, ctx)
        self.w = torch.full((256 * 1024,), config["x"])


def test_a_pt_export_onto_a_full_disk_names_enospc_and_keeps_the_file_it_was_to_replace(disk, tmp_path, capsys):
    nasplat.run(trainer=Big, space=SPACE, metric="score", max_trials=1, max_steps=1, seed=0, storage=tmp_path / "s",
                name="exp", checkpoint=True)
    folder, target = tmp_path / "s" / "exp", disk / "best.pt"
    _fill(disk / "filler", leave=0)
    capsys.readouterr()
    assert main(["export", str(folder), "-o", str(disk / "new.pt")]) == 2  # not torch's "unexpected pos ..."
    assert capsys.readouterr().err.splitlines() == [
        f"nasplat export: error: ENOSPC (No space left on device): cannot write {disk / 'new.pt'}"]
    assert sorted(p.name for p in disk.iterdir()) == ["filler"]  # nothing half written left behind
    (disk / "filler").unlink()
    assert main(["export", str(folder), "-o", str(target)]) == 0
    before = target.read_bytes()
    _fill(disk / "filler", leave=0)
    capsys.readouterr()
    assert main(["export", str(folder), "-o", str(target), "--force"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"nasplat export: error: ENOSPC (No space left on device): cannot write {target}"], err
    assert target.read_bytes() == before and sorted(p.name for p in disk.iterdir()) == ["best.pt", "filler"]
    assert torch.load(target)["state_dict"]["t"] == 1


# -- 4. CSV cells a spreadsheet would run --------------------------------------------------------------------------

FORMULAS = ["=1+2", "+SUM(A1)", "-2+3", "@cmd", "\tx", "\ry", "plain", "a=b"]


def test_csv_export_escapes_cells_that_start_a_formula_and_parquet_keeps_them(tmp_path):
    rows = [{"trial_id": i, "step": 1, "status": "completed", "config": {"name": v}, "score": float(i), "echo": v}
            for i, v in enumerate(FORMULAS)]
    folder = tmp_path / "exp"
    folder.mkdir()
    (folder / ROWS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))  # a folder from elsewhere
    export_rows(folder, "csv", tmp_path / "rows.csv")
    export_rows(folder, "parquet", tmp_path / "rows.parquet")
    with open(tmp_path / "rows.csv", newline="", encoding="utf-8") as f:
        table = list(csv.DictReader(f))
    safe = ["'=1+2", "'+SUM(A1)", "'-2+3", "'@cmd", "'\tx", "'\ry", "plain", "a=b"]
    assert [r["config.name"] for r in table] == safe and [r["echo"] for r in table] == safe
    assert list(pd.read_parquet(tmp_path / "rows.parquet")["config.name"]) == FORMULAS  # data as it is


# -- 5. a run whose last checkpoint could not be written ----------------------------------------------------------

class FillsAtEnd(Big):
    """At its last step ($FILL_STEP) grows the file $FILL_FILE until 64 KiB are left on its disk: the rows still
    fit there, the step's 1 MiB checkpoint does not."""

    def step(self):
        if self.t + 1 == int(os.environ["FILL_STEP"]):
            _fill(Path(os.environ["FILL_FILE"]), leave=64 * 1024)
        return {**super().step(), "time_cost": 1.0}


def test_a_run_whose_last_checkpoint_hit_enospc_exits_1_and_nothing_loads_an_older_state_unasked(
        disk, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FILL_STEP", "3")
    monkeypatch.setenv("FILL_FILE", str(disk / "filler"))
    spec = {"name": "exp", "trainer": "test_folder_writes:FillsAtEnd", "space": "test_folder_writes:SPACE",
            "metric": "score", "controller": "random", "budget": {"max_trials": 1, "max_steps": 3},
            "executor": "simulated", "checkpoint": {"every": 1}, "storage": str(disk / "store")}
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(spec))
    assert main(["run", "exp.yaml", "--quiet"]) == 1
    err = capsys.readouterr().err
    path = disk / "store" / "exp" / "checkpoints" / "trial-0" / "step-3"
    assert (f"nasplat run: error: the last checkpoint of trial 0 (step 3) could not be written: ENOSPC (No space "
            f"left on device): cannot write {path}") in err, err
    assert "; among them the last one of trial 0: its final state is not stored" in err
    from nasplat.engine.result import CheckpointLost

    folder = disk / "store" / "exp"
    result = ExperimentResult.load(folder)
    assert [(r["step"], r["status"], bool(r.get("checkpoint"))) for r in result.rows] == [
        (1, "running", True), (2, "running", True), (3, "completed", False)]
    assert result.rows[-1]["checkpoint_error"].startswith("ENOSPC (No space left on device): cannot write")
    lost = (r"trial 0's checkpoint at its last step 3 was not written \(ENOSPC .*\); the newest one left is at "
            r"step 2: ask for it with step=2 \(nasplat export --step 2\) if an older state will do")
    with pytest.raises(CheckpointLost, match=lost):
        result.checkpoint  # noqa: B018 - the property is what is tested
    with pytest.raises(CheckpointLost, match=lost):
        SharedWeights.load(result)
    assert result.find_checkpoint(0, step=2).step == 2 and result.load_state(0, step=3)["t"] == 2  # asked for
    (disk / "filler").unlink()
    assert main(["export", str(folder), "-o", str(tmp_path / "w.pt")]) == 2
    assert "the newest one left is at step 2" in capsys.readouterr().err
    assert main(["export", str(folder), "--step", "2", "-o", str(tmp_path / "w.pt")]) == 0
    assert torch.load(tmp_path / "w.pt")["step"] == 2


# -- 6. a retried step's rows --------------------------------------------------------------------------------------

class HangsAtFour(Trainer):
    """Its first attempt reports `score = 10 + step` and hangs at step 4 (after creating `config["flag"]`); a
    later attempt (the flag is there) reports `score = step`: the two attempts' rows differ."""

    def setup(self, config, ctx):
        self.flag, self.t = Path(config["flag"]), 0

    def step(self):
        self.t += 1
        first = not self.flag.exists()
        if first and self.t == 4:
            self.flag.touch()
            threading.Event().wait()
        return {"score": float(self.t + (10 if first else 0))}

    def state_dict(self):
        return {"t": self.t}

    def load_state_dict(self, state):
        self.t = state["t"]


class BestAtEnd:
    """A callback keeping the engine's best row so far (the progress line's) when the run ends."""

    def on_end(self, engine):
        self.best = engine.best_row


def test_a_step_retried_after_a_timeout_leaves_each_step_once_live_and_the_void_attempt_marked(tmp_path):
    flag, watch = tmp_path / "hung", BestAtEnd()
    result = nasplat.run(trainer=HangsAtFour, space={"flag": Choice([str(flag)])}, metric="score",
                         executor="processes", concurrency=1, max_trials=1, max_steps=4, max_failures=1,
                         step_timeout_s=1, seed=0, storage=tmp_path / "s", name="exp", callbacks=[watch])
    assert (watch.best["attempt"], watch.best["score"]) == (1, 4.0)  # the live best forgot the void 13.0 too
    assert flag.exists()  # the first attempt did hang at step 4; with no checkpoint the retry started over
    on_disk = read_rows(tmp_path / "s" / "exp" / ROWS_FILE)
    assert [(r["step"], r["attempt"], r["status"]) for r in on_disk] == [
        (1, 0, "running"), (2, 0, "running"), (3, 0, "running"), (4, 0, "retried"),
        (1, 1, "running"), (2, 1, "running"), (3, 1, "running"), (4, 1, "completed")]  # as it was appended
    for read in (result, ExperimentResult.load(tmp_path / "s" / "exp")):
        assert [(r["step"], r["attempt"], r["status"], r.get("score")) for r in read.rows] == [
            (1, 0, "retried", 11.0), (2, 0, "retried", 12.0), (3, 0, "retried", 13.0), (4, 0, "retried", None),
            (1, 1, "running", 1.0), (2, 1, "running", 2.0), (3, 1, "running", 3.0), (4, 1, "completed", 4.0)]
        frame = read.dataframe()
        live = frame[frame["status"] != "retried"]
        assert list(live["step"]) == [1, 2, 3, 4] and set(live["attempt"]) == {1}
        assert (read.best["step"], read.best["score"]) == (4, 4.0)  # not the void 13.0 of the first attempt
        assert read.ranked() == [read.rows[-1]] and read.pareto_front() == [read.rows[-1]]
        assert read.final_status() == {0: "completed"}
    from nasplat.report.frame import ReportFrame

    assert list(ReportFrame.load(tmp_path / "s" / "exp").ok["value"]) == [1.0, 2.0, 3.0, 4.0]  # the report's points
