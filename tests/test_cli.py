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

import nasplat
from nasplat.cli import main
from nasplat.experiment import experiment_kwargs, load_experiment
from nasplat.results import ExperimentResult

from browser import CHROMIUM, screenshot

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
