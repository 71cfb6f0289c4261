"""Durable trial state end to end: a run on a real S3-compatible server (moto's, on 127.0.0.1) whose driver is
SIGKILLed and resumed from an empty local folder; the trained best model back through `nasplat export`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import nasplat
from nasplat.cli import main as cli
from nasplat.engine.result import ExperimentResult
from nasplat.storage import ROWS_FILE, Storage, read_rows

ROOT = Path(__file__).resolve().parents[1]

COUNTER = '''
import time

import torch

from nasplat import Trainer


class Counter(Trainer):
    """A tensor decayed once per step and a step count, both in its state: a trial that restarted from scratch
    instead of its checkpoint reports t != step."""

    def setup(self, config, ctx):
        torch.manual_seed(ctx.seed)
        self.w, self.t = torch.randn(4096), 0

    def step(self):
        time.sleep(0.25)
        self.t += 1
        self.w.mul_(0.9)
        return {"score": -(self.config["x"] - 0.3) ** 2 + 0.01 * self.t, "t": self.t, "norm": float(self.w.norm())}

    def state_dict(self):
        return {"w": self.w, "t": self.t}

    def load_state_dict(self, state):
        self.w.copy_(state["w"])
        self.t = state["t"]
'''

DRIVER = '''
import sys

import nasplat
from nasplat import Float

if sys.argv[1] == "run":
    nasplat.run(trainer="durable_counter:Counter", space={"x": Float(0.0, 1.0)}, metric="score", max_trials=6,
                max_steps=5, concurrency=2, seed=5, storage=sys.argv[2], name="exp", checkpoint={"every": 1})
else:
    nasplat.resume(sys.argv[2])
'''

FIELDS = ("trial_id", "step", "attempt", "status", "config", "score", "t", "norm")


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> str:
    """A moto S3 server on 127.0.0.1 with an empty bucket; pyarrow (here and in subprocesses) reaches it through
    the AWS_* environment. Yields the bucket's URI."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    for key, value in {"AWS_ENDPOINT_URL_S3": endpoint, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(key, value)
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="nasplat-test")
    yield "s3://nasplat-test"
    server.stop()


def _uploaded_rows(uri: str, folder: Path) -> list[dict]:
    Storage(uri).download(folder)
    return read_rows(folder / ROWS_FILE)


def _key(row: dict) -> tuple:
    return tuple(json.dumps(row.get(k), sort_keys=True) for k in FIELDS)


def test_s3_run_killed_then_resumed_from_an_empty_machine_keeps_every_row_once(s3, tmp_path, monkeypatch):
    (tmp_path / "durable_counter.py").write_text(COUNTER)
    (tmp_path / "driver.py").write_text(DRIVER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    uri = f"{s3}/runs/exp"
    run = subprocess.Popen([sys.executable, str(tmp_path / "driver.py"), "run", f"{s3}/runs"],
                           env={**env, "NASPLAT_CACHE": str(tmp_path / "cache-1")}, stderr=subprocess.PIPE)
    try:
        while len(before := (_uploaded_rows(uri, tmp_path / "probe") if Storage(uri).exists(f"{ROWS_FILE}.parts")
                             else [])) < 8:
            assert run.poll() is None, run.stderr.read().decode()[-3000:]
            time.sleep(0.2)
    finally:
        run.send_signal(signal.SIGKILL)
        run.wait()
    before = _uploaded_rows(uri, tmp_path / "at-kill")  # everything the killed driver got up to the server
    assert len(before) < 30  # killed halfway
    assert not (tmp_path / "cache-2").exists()  # resumed on a machine with no local copy
    resumed = subprocess.run([sys.executable, str(tmp_path / "driver.py"), "resume", uri], capture_output=True,
                             text=True, timeout=300, env={**env, "NASPLAT_CACHE": str(tmp_path / "cache-2")})
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    monkeypatch.setenv("NASPLAT_CACHE", str(tmp_path / "cache-3"))
    rows = ExperimentResult.load(uri).rows
    pairs = [(r["trial_id"], r["step"]) for r in rows]
    assert len(pairs) == len(set(pairs)) == 30  # 6 trials x 5 steps, none twice, none lost
    assert {_key(r) for r in before} <= {_key(r) for r in rows}  # the rows recorded before the kill, unchanged
    bad = [(r["trial_id"], r["step"], r["status"], (r.get("error") or "")[-400:]) for r in rows
           if r.get("t") != r["step"]]
    assert not bad, bad  # every trial went on from its checkpoint, none from scratch
    assert all(r["checkpoint"] == f"checkpoints/trial-{r['trial_id']}/step-{r['step']}"
               for r in rows if r.get("checkpoint") or r["step"] == 5)  # relative to the folder, at every trial's end
    result = ExperimentResult.load(uri)
    state = result.load_state()
    assert state["t"] == 5 and result.checkpoint.uri.startswith(uri)


def test_export_round_trip_reproduces_the_recorded_accuracy(tmp_path, capsys):
    from search_spaces.cnn import PBT_ARCHITECTURE, build_model
    from trainers.classification import ClassificationTrainer, load_dataset

    space = {"depth": PBT_ARCHITECTURE, "head": 32, "lr": nasplat.Choice([0.002, 0.05]), "momentum": 0.9,
             "batch_size": 64, "weight_decay": 1e-4}
    result = nasplat.run(trainer=ClassificationTrainer, space=space, controller="random", metric="test_acc",
                         max_trials=3, max_steps=2, seed=1, storage=tmp_path, name="cnn",
                         checkpoint={"at_end": True, "keep_best": 2})
    best = result.ranked()[0]["trial_id"]
    assert result.checkpoint is not None and result.checkpoint.trial_id == best and result.checkpoint.step == 2
    output = tmp_path / "best.pt"
    assert cli(["export", str(tmp_path / "cnn"), "--format", "pt", "-o", str(output)]) == 0
    exported = torch.load(output)  # plain PyTorch: weights_only, no nasplat needed
    assert (exported["trial_id"], exported["step"]) == (best, 2)
    data = load_dataset("digits")
    model = build_model(exported["config"], data.in_channels, data.num_classes, data.input_shape)
    model.load_state_dict(exported["state_dict"]["model"])
    model.eval()
    with torch.no_grad():
        accuracy = (model(data.x_test).argmax(dim=1) == data.y_test).float().mean().item()
    recorded = next(r for r in result.rows if (r["trial_id"], r["step"]) == (best, 2))
    assert accuracy == exported["metrics"]["test_acc"] == recorded["test_acc"]
    assert recorded["test_acc"] > 0.5  # a trained model, not chance (10 classes)
    with pytest.raises(LookupError, match="no checkpoint at or before step 1"):
        result.load_state(best, step=1)  # only the trials' final states were checkpointed
    assert cli(["export", str(tmp_path / "cnn"), "--trial", "99"]) == 2
    assert "trial 99 has no checkpoint" in capsys.readouterr().err
