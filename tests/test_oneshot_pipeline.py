"""Issue 30: the one-shot pipeline (supernet, search, retrain) in one YAML file, run by `nasplat run` in a real
process, SIGKILLed during each stage and resumed; the retrained network is the searched path, on digits, and no
folder of it holds a pickle."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import nasplat
from nasplat.cli import main
from nasplat.oneshot import measure
from nasplat.report import render_report
from search_spaces import nb201
from search_spaces.nb201_supernet import NB201Supernet, build_subnet
from trainers.supernet import signal_data

ROOT = Path(__file__).resolve().parents[1]
EPOCHS, PATHS, RETRAIN_EPOCHS = 3, 6, 3

PIPELINE = f"""
name: digits-oneshot
pipeline:
  supernet:
    trainer: held:Supernet
    space: {{dataset: digits, channels: 8, epochs: {EPOCHS}, eval_paths: 2}}
    metric: valid_acc
    controller: random
    budget: {{max_trials: 1, max_steps: {EPOCHS}}}
  search:
    trainer: held:Paths
    space: search_spaces.nb201:space
    metric: valid_acc
    controller: random
    seed: 3
    budget: {{max_trials: {PATHS}}}
  retrain: {{trainer: "held:Cell", epochs: {RETRAIN_EPOCHS}}}
"""

# The stages' trainers, each of which waits for the kill at the step $HOLD names ("stage:step"), after saying so.
HELD = """
import os, threading
from trainers.nb201_cell import NB201CellTrainer
from trainers.supernet import NB201PathTrainer, NB201SupernetTrainer

def hold(stage, step):
    if os.environ.get("HOLD") == f"{stage}:{step}":
        print(f"HELD {stage}", flush=True)
        threading.Event().wait(300)

class Supernet(NB201SupernetTrainer):
    def step(self):
        hold("supernet", self.epoch + 1)
        return super().step()

class Paths(NB201PathTrainer):
    RETRAIN_TRAINER = "held:Cell"
    def step(self):
        hold("search", self.ctx.trial_id)
        return super().step()

class Cell(NB201CellTrainer):
    def step(self):
        hold("retrain", self.epoch + 1)
        return super().step()
"""


def nasplat_cli(tmp_path: Path, *args: str, hold: str = "") -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]), "HOLD": hold}
    return subprocess.Popen([sys.executable, "-m", "nasplat.cli", *args], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def kill_when_held(process: subprocess.Popen, stage: str) -> str:
    """Read the process's output up to `HELD <stage>`, then SIGKILL its whole process group; its output."""
    seen = []
    assert process.stdout is not None
    for line in process.stdout:
        seen.append(line)
        if line.strip() == f"HELD {stage}":
            break
    else:
        pytest.fail(f"never held in {stage}: {''.join(seen)}{process.stderr.read() if process.stderr else ''}")
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=60)
    return "".join(seen)


def finish(process: subprocess.Popen) -> str:
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, err
    return out


@pytest.mark.slow  # five nasplat processes, each starting torch
def test_the_pipeline_killed_in_each_stage_resumes_to_the_searched_network_on_digits(tmp_path: Path) -> None:
    (tmp_path / "pipeline.yaml").write_text(PIPELINE)
    (tmp_path / "held.py").write_text(HELD)
    run = ("run", "pipeline.yaml", "--storage", "results", "--quiet")
    out = kill_when_held(nasplat_cli(tmp_path, *run, hold="supernet:2"), "supernet")
    assert "pipeline stage supernet: " in out and "(started)" in out
    out = kill_when_held(nasplat_cli(tmp_path, *run, hold="search:3"), "search")
    assert "supernet (resumed)" in out and "search (started)" in out
    out = kill_when_held(nasplat_cli(tmp_path, *run, hold="retrain:2"), "retrain")
    assert "supernet (finished: skipped)" in out and "search (resumed)" in out and "retrain (started)" in out
    home = tmp_path / "results" / "digits-oneshot"
    out = finish(nasplat_cli(tmp_path, "resume", str(home), "--quiet"))  # the pipeline, from its pipeline.json
    assert "search (finished: skipped)" in out and "retrain (resumed)" in out
    out = finish(nasplat_cli(tmp_path, *run))
    assert all(f"{stage} (finished: skipped)" in out for stage in ("supernet", "search", "retrain"))

    supernet = nasplat.ExperimentResult.load(home / "supernet").rows
    assert [r["step"] for r in supernet] == list(range(1, EPOCHS + 1)) and supernet[-1]["status"] == "completed"
    search = nasplat.ExperimentResult.load(home / "search")
    assert sorted({r["trial_id"] for r in search.rows}) == list(range(PATHS))
    assert all(r["status"] == "completed" and r["supernet_step"] == EPOCHS for r in search.rows)
    best = search.best
    cell = {e: best["config"][e] for e in nb201.EDGES}
    searched = sum(p.numel() for p in NB201Supernet(8, 10, channels=8).extract(cell).parameters())

    retrained = nasplat.ExperimentResult.load(home / "retrain")
    rows = retrained.rows
    assert [r["step"] for r in rows] == list(range(1, RETRAIN_EPOCHS + 1)) and rows[-1]["status"] == "completed"
    config = rows[-1]["config"]
    assert {e: config[e] for e in nb201.EDGES} == cell and (config["dataset"], config["channels"]) == ("digits", 8)
    assert rows[-1]["params"] == best["params"] == searched  # exactly the searched path
    digits = signal_data("digits")
    net = build_subnet(cell, digits.in_channels, digits.num_classes, channels=8)
    net.load_state_dict(retrained.load_state()["model"])
    _, accuracy = measure(net, digits.x_valid, digits.y_valid)
    assert accuracy == pytest.approx(rows[-1]["valid_acc"], abs=1e-6) and accuracy > 0.5  # trained on digits

    page = render_report(home / "search")  # each stage's report links the others
    assert "href='../supernet/report.html'" in page and "href='../retrain/report.html'" in page

    assert not list(home.rglob("*.pkl")) and all((home / s / "experiment.json").exists()
                                                 for s in ("supernet", "search", "retrain"))
    states = list(home.rglob("state.pt"))
    assert {p.relative_to(home).parts[0] for p in states} == {"supernet", "retrain"}
    for state in states:
        torch.load(state, weights_only=True)  # no pickled object in any checkpoint


def test_a_malformed_pipeline_is_refused_in_one_line_before_anything_runs(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    stages = PIPELINE.replace("held:Supernet", "trainers.supernet:NB201SupernetTrainer")
    cases = [(stages.replace("  retrain: {trainer", "  again: {trainer"),
              "`pipeline` must be a mapping of the stages ['supernet', 'search', 'retrain'], got ['supernet', "
              "'search', 'again']"),
             (stages.replace("budget: {max_trials: 1,", "budget: {max_trial: 1,"),
              "pipeline stage 'supernet': budget: unknown key(s) ['max_trial']"),
             (stages.replace("epochs: 3}}", "epochs: 30}}").replace("epochs: 3,", "epochs: 30,"),
              "NB201SupernetTrainer: epochs=30 but max_steps=3"),
             (stages.replace("retrain: {", "retrain: {epoch: 2, "),
              "pipeline stage 'retrain' must be a mapping of ['trainer', 'trial', 'epochs', 'max_steps', 'config', "
              "'seed', 'executor']")]
    for text, message in cases:
        (tmp_path / "bad.yaml").write_text(text)
        assert main(["run", str(tmp_path / "bad.yaml"), "--storage", str(tmp_path / "results"), "--quiet"]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err, err
        assert not (tmp_path / "results" / "digits-oneshot" / "supernet").exists()
    (tmp_path / "results" / "digits-oneshot" / "supernet").mkdir()  # a stage started: the file may not change now
    (tmp_path / "bad.yaml").write_text(stages)  # the epochs=30 file was recorded; this one differs
    assert main(["run", str(tmp_path / "bad.yaml"), "--storage", str(tmp_path / "results"), "--quiet"]) == 2
    assert capsys.readouterr().err.strip().endswith("the pipeline differs from the one "
                                                    f"{tmp_path / 'results' / 'digits-oneshot'} was run with "
                                                    f"({tmp_path / 'results' / 'digits-oneshot' / 'pipeline.json'}); "
                                                    "give another `name`, or the file as it was")
