"""The `nasplat` command and experiment files: run, status, resume, and YAML mistakes named precisely."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml
from browser import CHROMIUM, screenshot

import nasplat
from nasplat.cli import main
from nasplat.engine.result import ExperimentResult
from nasplat.experiment.file import experiment_kwargs, load_experiment

REPO = Path(__file__).resolve().parents[1]
NB201 = {"trainer": "trainers.nb201_table:NB201Table", "space": "search_spaces.nb201:space", "metric": "valid_acc",
         "controller": {"name": "evolution", "population_size": 10, "sample_size": 3},
         "budget": {"time_budget_s": 6000}, "executor": "simulated", "resources": {"concurrency": 4}}


def write(tmp_path: Path, spec: dict) -> Path:
    path = tmp_path / "experiment.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_run_then_status_through_the_command_line(tmp_path, capsys, shared_data):
    path = write(tmp_path, {**NB201, "name": "nb", "storage": str(tmp_path / "out")})
    assert main(["run", str(path), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert f"results: {tmp_path / 'out' / 'nb'}" in out
    result = ExperimentResult.load(tmp_path / "out" / "nb")
    assert result.metric == "valid_acc" and len(result.rows) > 50
    assert main(["status", str(tmp_path / "out" / "nb"), "--top", "3"]) == 0
    table = capsys.readouterr().out
    assert f"{result.best['valid_acc']:.3f}"[:5] in table and "completed" in table
    assert main(["run", str(path), "--quiet"]) == 2  # the folder exists: resume it instead
    assert "nasplat resume" in capsys.readouterr().err


@pytest.mark.parametrize("change, message", [
    ({"budget": {"max_trial": 3}}, r"budget: unknown key\(s\) \['max_trial'\]; allowed: \['max_trials'"),
    ({"controler": "random"}, r"unknown key\(s\) \['controler'\]; allowed: \['name', 'trainer'"),
    ({"mode": "maximum"}, r"`mode` must be one of \['max', 'min'\], got mode='maximum'"),
    ({"resources": {"workers": 2}}, r"resources \['workers'\] need executor 'ray', got executor='simulated'"),
    ({"controller": {"population_size": 3}}, r"'controller' must be a name or a mapping with 'name'"),
    ({"resources": {"gpus": 1}}, r"resources: unknown key\(s\) \['gpus'\]"),
])
def test_yaml_mistakes_name_the_key_and_what_is_allowed(tmp_path, change, message):
    with pytest.raises(ValueError, match=message):
        load_experiment(write(tmp_path, {**NB201, **change}))


def test_missing_keys_and_bad_dotted_paths(tmp_path, capsys):
    spec = {k: v for k, v in NB201.items() if k != "metric"}
    with pytest.raises(ValueError, match=r"missing required keys \['metric'\]"):
        experiment_kwargs(spec)
    path = write(tmp_path, {**NB201, "space": "search_spaces.nb201:spaces", "storage": str(tmp_path)})
    assert main(["run", str(path), "--quiet"]) == 2
    assert "module 'search_spaces.nb201' has no attribute 'spaces'" in capsys.readouterr().err
    assert main(["status", str(tmp_path / "nowhere")]) == 2
    assert "not an experiment folder" in capsys.readouterr().err


@pytest.mark.slow
def test_quickstart_on_an_embedded_local_ray_reaches_95_percent(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    run = subprocess.run([sys.executable, "-m", "nasplat.cli", "run", str(REPO / "examples" / "quickstart.yaml"),
                          "--storage", str(tmp_path), "--quiet"], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    result = ExperimentResult.load(tmp_path / "quickstart")
    assert result.metric == "valid_acc" and result.best["valid_acc"] >= 0.95 and result.best["test_acc"] >= 0.9
    assert result.counts() == {"completed": 24}
    status = subprocess.run([sys.executable, "-m", "nasplat.cli", "status", str(tmp_path / "quickstart")],
                            cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert "valid_acc" in status and f"{result.best['valid_acc']:.6f}".rstrip("0") in status
    report = subprocess.run([sys.executable, "-m", "nasplat.cli", "report", str(tmp_path / "quickstart")],
                            cwd=REPO, capture_output=True, text=True)
    assert report.returncode == 0 and (tmp_path / "quickstart" / "report.html").is_file(), report.stderr
    if CHROMIUM.exists():  # the README's picture: NASPLAT_SCREENSHOT=docs/report.png pytest ... keeps it
        shot = screenshot(tmp_path / "quickstart" / "report.html", tmp_path)
        if os.environ.get("NASPLAT_SCREENSHOT"):
            shutil.copy(shot, REPO / os.environ["NASPLAT_SCREENSHOT"])


class Flat(nasplat.Trainer):
    def setup(self, config, ctx):
        self.x = config["x"]

    def step(self):
        return {"score": self.x}


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_serve_prints_the_address_it_listens_on_and_warns_when_others_can_reach_it(tmp_path, host):
    nasplat.run(trainer=Flat, space={"x": nasplat.Float(0.0, 1.0)}, metric="score", max_trials=3, storage=tmp_path,
                name="flat")
    # a job started in the background (`cmd &`) inherits an ignored SIGINT; give the server Ctrl-C back
    server = subprocess.Popen([sys.executable, "-m", "nasplat.cli", "serve", str(tmp_path / "flat"), "--host", host,
                               "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        first = server.stdout.readline()
        match = re.search(r"listening on ([0-9.]+):(\d+); open http://127\.0\.0\.1:(\d+)/", first)
        assert match is not None, first + server.stderr.read() if server.poll() is not None else first
        assert match.group(1) == host and match.group(2) == match.group(3)
        with urllib.request.urlopen(f"http://127.0.0.1:{match.group(2)}/", timeout=30) as page:
            assert page.status == 200 and "flat" in page.read().decode()
    finally:
        server.send_signal(signal.SIGINT)
        _, err = server.communicate(timeout=30)
    assert server.returncode == 0, err
    warnings = [line for line in err.splitlines() if "warning" in line]
    if host == "0.0.0.0":
        assert warnings == [f"nasplat: warning: listening on 0.0.0.0:{match.group(2)}, not on loopback: anyone who "
                            "can reach this machine on that port can read the report; use --host 127.0.0.1 and an "
                            "SSH tunnel to keep it private"]
    else:
        assert warnings == []


# -- where `nasplat run` keeps results, and `nasplat export`'s formats ------------------------------------------
FLAT_SPACE = {"x": nasplat.Float(0.0, 1.0)}


class Kept(nasplat.Trainer):
    """Flat, with a state to checkpoint (for `nasplat export ... -o model.pt`)."""

    def setup(self, config, ctx):
        self.x, self.t = config["x"], 0

    def step(self):
        self.t += 1
        return {"score": self.x + 0.01 * self.t}

    def state_dict(self):
        return {"t": self.t, "x": self.x}

    def load_state_dict(self, state):
        self.t, self.x = state["t"], state["x"]


TINY = {"name": "tiny", "trainer": "test_cli:Kept", "space": "test_cli:FLAT_SPACE", "metric": "score",
        "controller": "random", "budget": {"max_trials": 3, "max_steps": 2}, "executor": "local"}


@pytest.fixture
def here(tmp_path, monkeypatch):
    """A fresh current folder without $NASPLAT_RESULTS; the import path and $PYTHONPATH (which `main` extends with
    the current folder) restored afterwards."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NASPLAT_RESULTS", raising=False)
    monkeypatch.setenv("NASPLAT_TENSORBOARD", "0")
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    return tmp_path


def test_a_file_without_storage_runs_into_the_default_folder_printed_at_the_start(here, capsys, monkeypatch):
    path = write(here, TINY)
    assert main(["run", str(path), "--quiet"]) == 0
    out = capsys.readouterr().out
    folder = here / "nasplat_results" / "tiny"
    assert out.splitlines()[0] == (f"experiment folder: {folder} (the default storage: --storage DIR for another, "
                                   "--no-storage for none)")
    assert f"results: {folder}" in out and ExperimentResult.load(folder).counts() == {"completed": 3}
    monkeypatch.setenv("NASPLAT_RESULTS", str(here / "elsewhere"))  # the documented override of the default
    assert main(["run", str(path), "--quiet", "--name", "again"]) == 0
    assert capsys.readouterr().out.startswith(f"experiment folder: {here / 'elsewhere' / 'again'} (the default")
    assert ExperimentResult.load(here / "elsewhere" / "again").counts() == {"completed": 3}
    assert main(["run", str(write(here, {**TINY, "storage": "mine"})), "--quiet"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"experiment folder: {here / 'mine' / 'tiny'}"  # as asked


def test_no_storage_keeps_nothing_on_disk_and_excludes_storage(here, capsys):
    path = write(here, {**TINY, "storage": "out"})
    assert main(["run", str(path), "--quiet", "--no-storage"]) == 0
    out = capsys.readouterr().out
    assert "trials: 3 (3 completed)" in out and "experiment folder" not in out and "results:" not in out
    assert sorted(p.name for p in here.iterdir()) == ["experiment.yaml"]
    with pytest.raises(SystemExit) as usage:
        main(["run", str(path), "--no-storage", "--storage", "x"])
    assert usage.value.code == 2 and "--storage: not allowed with argument --no-storage" in capsys.readouterr().err
    assert main(["run", str(write(here, {**TINY, "checkpoint": {"at_end": True}})), "--no-storage"]) == 2
    assert "`checkpoint` needs `storage`" in capsys.readouterr().err and not (here / "nasplat_results").exists()


def test_export_takes_the_format_from_the_output_extension_and_refuses_a_contradiction(here, capsys):
    import pandas as pd
    import torch

    assert main(["run", str(write(here, {**TINY, "storage": "out", "checkpoint": {"at_end": True}})), "--quiet"]) == 0
    folder = str(here / "out" / "tiny")
    capsys.readouterr()
    assert main(["export", folder, "-o", "model.pt"]) == 0  # the trained state, not a table
    exported = torch.load(here / "model.pt", weights_only=False)
    assert set(exported) == {"config", "state_dict", "trial_id", "step", "metrics"} and exported["state_dict"]["t"] == 2
    assert main(["export", folder, "-o", "rows.csv"]) == 0
    rows = pd.read_csv(here / "rows.csv")  # text, one column per decision
    assert len(rows) == 6 and {"trial_id", "config.x", "score"} <= set(rows.columns)
    assert main(["export", folder, "-o", "rows.PARQUET"]) == 0
    assert len(pd.read_parquet(here / "rows.PARQUET")) == 6
    assert main(["export", folder, "-o", "rows.txt", "--format", "csv"]) == 0  # an unknown extension: as asked
    assert len(pd.read_csv(here / "rows.txt")) == 6
    capsys.readouterr()
    assert main(["export", folder, "-o", "wrong.pt", "--format", "csv"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "nasplat export: error: --format csv does not match the output wrong.pt (a .pt file holds pt): drop "
        "--format, or name the output *.csv"]
    assert main(["export", folder, "-o", "rows.csv", "--trial", "0"]) == 2
    assert "they need --format pt, got -o rows.csv (csv)" in capsys.readouterr().err
    assert not (here / "wrong.pt").exists()


def test_a_run_where_every_trial_fails_exits_1_naming_the_first_errors(here, capsys):
    spec = {**TINY, "storage": "out", "constraints": ["params <= 1.0"]}  # a metric no trial reports
    assert main(["run", str(write(here, spec)), "--quiet"]) == 1
    captured = capsys.readouterr()
    assert "trials: 3 (3 failed)" in captured.out
    assert captured.err.splitlines() == [
        "nasplat run: error: no trial succeeded (3 failed); first errors: "
        + "; ".join(f"trial {t}: metric 'params' is missing from the report (reported: ['score'])" for t in range(3))]
    assert main(["resume", str(here / "out" / "tiny"), "--quiet"]) == 1  # nothing left to run: still a failure
    assert "nasplat resume: error: no trial succeeded (3 failed)" in capsys.readouterr().err
