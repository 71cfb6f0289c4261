"""A folder from elsewhere is data: a crafted `experiment.pkl` and a crafted checkpoint pickle, each of which
would create a marker file when unpickled, go through every command that reads a folder. None of them may create
the marker: each works from the folder's JSON, or refuses in one line that says how to allow it."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import torch

import nasplat
from nasplat.oneshot import SharedWeights
from nasplat.storage import PickleRefused
from nasplat.storage.checkpoints import MANIFEST_FILE, STATE_FILE
from nasplat.storage.states import load_state_bytes
from servers import free_port, server

ROOT = Path(__file__).resolve().parents[1]


class Marker:
    """Unpickling this creates the file `path` (with `open`, so nothing but the unpickling itself runs it)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> tuple[Path, Path]:
    """A real experiment's folder whose spec is replaced by a crafted `experiment.pkl` and each of whose checkpoints
    holds a crafted pickle (with a manifest that matches it, so it counts as complete); and the marker's path."""
    base = tmp_path_factory.mktemp("hostile")
    nasplat.run(trainer="trainers.pbt_toy:PBTToy", space="trainers.pbt_toy:space", metric="Q", max_trials=3,
                max_steps=2, storage=str(base), name="victim", checkpoint={"every": 1})
    folder, marker = base / "victim", base / "MARKER"
    assert (folder / "space.json").exists() and (folder / "experiment.json").exists()
    (folder / "experiment.json").unlink()
    (folder / "experiment.pkl").write_bytes(_pickled({"trainer": Marker(marker)}))
    checkpoints = sorted(folder.glob("checkpoints/trial-*/step-*"))
    assert checkpoints, "the experiment wrote no checkpoint"
    for checkpoint in checkpoints:
        buffer = io.BytesIO()
        torch.save({"theta": Marker(marker)}, buffer)
        (checkpoint / STATE_FILE).write_bytes(buffer.getvalue())
        manifest = json.loads((checkpoint / MANIFEST_FILE).read_text())
        manifest["files"] = {STATE_FILE: len(buffer.getvalue())}
        (checkpoint / MANIFEST_FILE).write_text(json.dumps(manifest))
    return folder, marker


def _pickled(obj: object) -> bytes:
    import pickle

    return pickle.dumps(obj)


def nasplat_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nasplat.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_the_crafted_pickles_would_run_if_loaded(hostile, tmp_path):
    """The test's own premise: plain unpickling of either file creates the marker."""
    import pickle

    folder, _ = hostile
    probe = tmp_path / "probe"
    pickle.loads(_pickled(Marker(probe)))
    assert probe.exists()
    state = next(folder.glob("checkpoints/trial-*/step-*")) / STATE_FILE
    assert b"builtins" in state.read_bytes() or b"open" in state.read_bytes()


def test_report_status_and_serve_work_from_data(hostile):
    folder, marker = hostile
    report = nasplat_cli("report", str(folder))
    assert report.returncode == 0, report.stderr
    page = (folder / "report.html").read_text()
    assert "Decision importance" in page and "No decision importance" not in page
    status = nasplat_cli("status", str(folder), "--importance")
    assert status.returncode == 0, status.stderr
    assert "importance" in status.stdout.lower() and "theta" not in status.stderr
    port = free_port()
    with server([sys.executable, "-m", "nasplat.cli", "serve", str(folder), "--port", str(port)],
                f"http://127.0.0.1:{port}/", folder.parent / "serve.log"):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=60) as answer:
            assert answer.status == 200 and b"Decision importance" in answer.read()
    assert not marker.exists()


@pytest.mark.parametrize("command", [["resume"], ["retrain"], ["export", "--format", "pt", "--trial", "0"]])
def test_commands_that_need_code_or_weights_refuse_in_one_line(hostile, command, tmp_path):
    folder, marker = hostile
    out = ["-o", str(tmp_path / "w.pt")] if command[0] == "export" else []
    done = nasplat_cli(command[0], str(folder), *command[1:], *out)
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--trust-pickle" in lines[0], done.stderr
    assert "pickle" in lines[0] and "refus" in lines[0]
    assert not marker.exists()


def test_python_api_refuses_the_same(hostile):
    folder, marker = hostile
    with pytest.raises(PickleRefused, match=r"experiment.pkl: .*allow_pickle=True"):
        nasplat.resume(folder)
    checkpoint = sorted(folder.glob("checkpoints/trial-*/step-*"))[-1]
    with pytest.raises(PickleRefused, match=r"state.pt holds Python objects .*\(it names io.open\)"):
        SharedWeights.load(checkpoint)
    result = nasplat.ExperimentResult.load(folder)
    with pytest.raises(PickleRefused):
        result.load_state(0)
    assert not marker.exists()


def test_a_plain_folder_resumes_and_its_checkpoints_load_as_data(tmp_path):
    """The same commands on an untouched folder work: the refusals above are about the crafted files only."""
    nasplat.run(trainer="trainers.pbt_toy:PBTToy", space="trainers.pbt_toy:space", metric="Q", max_trials=2,
                max_steps=2, storage=str(tmp_path), name="plain", checkpoint={"every": 1})
    folder = tmp_path / "plain"
    assert not list(folder.rglob("*.pkl"))
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    exported = nasplat_cli("export", str(copy), "--format", "pt", "-o", str(tmp_path / "best.pt"))
    assert exported.returncode == 0, exported.stderr
    weights = load_state_bytes((tmp_path / "best.pt").read_bytes(), "best.pt")  # weights_only, numpy allowed
    assert set(weights) >= {"config", "state_dict", "trial_id", "step"}
    assert weights["state_dict"]["theta"].shape == (2,)
    resumed = nasplat_cli("resume", str(copy), "--quiet")
    assert resumed.returncode == 0, resumed.stderr
