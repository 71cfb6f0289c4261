"""Experiments submitted as Ray jobs to a real head with its dashboard: a whole run; a stop, then `nasplat resume`."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from processes import kill_session
from ray.job_submission import JobStatus, JobSubmissionClient
from servers import free_port

import nasplat
from nasplat.engine.result import ExperimentResult
from nasplat.experiment.file import load_experiment
from nasplat.storage import read_rows

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
TERMINAL = {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}

SLOW_TRAINER = """
import time
from nasplat import Float, Trainer

space = {"x": Float(0.0, 1.0)}

class Slow(Trainer):
    def setup(self, config, ctx):
        self.x, self.t = config["x"], 0

    def step(self):
        time.sleep(0.25)
        self.t += 1
        return {"score": -(self.x - 0.5) ** 2 + 0.01 * self.t}
"""


@dataclass
class Head:
    """A running head: its GCS address, a job client, and the environment a driver needs to attach to it."""

    address: str
    client: JobSubmissionClient
    env: dict[str, str]


@pytest.fixture(scope="module")
def head() -> Iterator[Head]:
    """`ray start --head --block` with the dashboard, its own temp dir, ports and auth token; torn down by
    terminating that process (it kills its node's processes) and then any of its descendants still alive."""
    temp = tempfile.mkdtemp(prefix="nsj-", dir="/tmp")  # short: unix socket paths live under it
    token = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token, RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0")
    dashboard = free_port()
    ports = {"port": free_port(), "dashboard-port": dashboard, "ray-client-server-port": free_port(),
             "dashboard-agent-listen-port": free_port(), "dashboard-agent-grpc-port": free_port(),
             "metrics-export-port": free_port(), "runtime-env-agent-port": free_port()}
    args = [str(BIN / "ray"), "start", "--head", "--block", "--num-cpus=2", f"--temp-dir={temp}",
            "--include-dashboard=true", "--dashboard-host=127.0.0.1", "--disable-usage-stats",
            *(f"--{k}={v}" for k, v in ports.items())]
    log = open(Path(temp) / "head.log", "w")
    proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        address_file = Path(temp) / "ray_current_cluster"
        client, deadline = None, time.monotonic() + 90
        while client is None:
            assert proc.poll() is None, f"ray start exited with {proc.returncode}: {_tail(Path(temp) / 'head.log')}"
            assert time.monotonic() < deadline, f"the head did not come up in 90 s: {_tail(Path(temp) / 'head.log')}"
            try:
                if address_file.exists():
                    client = JobSubmissionClient(f"http://127.0.0.1:{dashboard}",
                                                 headers={"Authorization": f"Bearer {token}"})
                    client.list_jobs()
            except Exception:
                client = None
                time.sleep(0.5)
        yield Head(address_file.read_text().strip(), client, env)
    finally:
        proc.terminate()  # `ray start --block` kills its node's processes on SIGTERM
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        kill_session(proc.pid)
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


def _tail(path: Path, n: int = 3000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else ""


def _wait_for(client: JobSubmissionClient, job: str, wanted: JobStatus, timeout: float) -> None:
    """Poll the job's status until it is `wanted`; fail with the job's log if it ends otherwise or takes too long."""
    deadline = time.monotonic() + timeout
    while (status := client.get_job_status(job)) != wanted:
        logs = f"job {job} is {status}, waiting for {wanted}; its log:\n{client.get_job_logs(job)[-3000:]}"
        assert status not in TERMINAL and time.monotonic() < deadline, logs
        time.sleep(0.2)


def _write_yaml(path: Path, spec: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(spec))
    return path


def test_a_job_runs_an_experiment_file_and_its_results_match_a_local_run(head, tmp_path):
    spec = {"name": "toy", "trainer": "trainers.pbt_toy:PBTToy", "space": "trainers.pbt_toy:space", "metric": "Q",
            "controller": {"name": "random"}, "budget": {"max_trials": 6, "max_steps": 3},
            "resources": {"concurrency": 2, "cpus_per_trial": 1}, "executor": "ray", "seed": 7}
    path = _write_yaml(tmp_path / "toy.yaml", spec)
    storage = tmp_path / "out"
    entry = f"{BIN / 'nasplat'} run {shlex.quote(str(path))} --storage {shlex.quote(str(storage))} --quiet"
    job = head.client.submit_job(entrypoint=entry)
    _wait_for(head.client, job, JobStatus.SUCCEEDED, timeout=120)
    assert f"results: {storage / 'toy'}" in head.client.get_job_logs(job)

    result = ExperimentResult.load(storage / "toy")
    assert result.metric == "Q" and result.counts() == {"completed": 6}, result.counts()
    got = {(r["trial_id"], r["step"]): r for r in result.rows}
    assert sorted(got) == [(t, s) for t in range(6) for s in range(1, 4)], f"rows: {sorted(got)}"
    assert len({r["pid"] for r in result.rows}) == 2, "two gangs on the head, each reused by the next trial"
    for (trial, step), row in got.items():  # Q is the true objective at the reported θ; ascent never lowers it
        assert row["Q"] == pytest.approx(1.2 - row["theta0"] ** 2 - row["theta1"] ** 2), row
        assert -0.42 - 1e-9 <= row["Q"] <= 1.2 and (step == 1 or row["Q"] >= got[(trial, step - 1)]["Q"]), row

    local = load_experiment(path)
    local.update(executor="local", concurrency=1)
    del local["executor_options"]
    expected = {(r["trial_id"], r["step"]): (r["config"], r["Q"]) for r in nasplat.run(**local).rows}
    assert {k: (r["config"], pytest.approx(r["Q"])) for k, r in got.items()} == expected, "seeded: same as in process"

    status = subprocess.run([str(BIN / "nasplat"), "status", str(storage / "toy")], capture_output=True, text=True,
                            timeout=120)
    assert status.returncode == 0 and "trials: 6 (6 completed)" in status.stdout, status.stdout + status.stderr


def test_a_stopped_job_is_finished_by_nasplat_resume_without_loss_or_duplicates(head, tmp_path):
    (tmp_path / "nsj_slow.py").write_text(SLOW_TRAINER)
    spec = {"name": "slow", "trainer": "nsj_slow:Slow", "space": "nsj_slow:space", "metric": "score",
            "controller": {"name": "evolution", "population_size": 4, "sample_size": 2},
            "budget": {"max_trials": 12, "max_steps": 4}, "resources": {"concurrency": 2, "cpus_per_trial": 1},
            "executor": "ray", "seed": 3, "max_failures": 1}
    path = _write_yaml(tmp_path / "slow.yaml", spec)
    folder = tmp_path / "out" / "slow"
    entry = f"{BIN / 'nasplat'} run {shlex.quote(str(path))} --storage {shlex.quote(str(folder.parent))} --quiet"
    job = head.client.submit_job(entrypoint=entry, runtime_env={"env_vars": {"PYTHONPATH": str(tmp_path)}})
    rows_file, deadline = folder / "results.jsonl", time.monotonic() + 120
    while not rows_file.exists() or len(read_rows(rows_file)) < 10:
        status = head.client.get_job_status(job)
        assert status not in TERMINAL, f"job ended {status} early:\n{head.client.get_job_logs(job)[-3000:]}"
        assert time.monotonic() < deadline, f"fewer than 10 rows after 120 s:\n{head.client.get_job_logs(job)[-3000:]}"
        time.sleep(0.05)
    assert head.client.stop_job(job)
    _wait_for(head.client, job, JobStatus.STOPPED, timeout=60)
    before = read_rows(rows_file)
    assert 10 <= len(before) < 48, f"{len(before)} rows at the stop"

    env = {**head.env, "RAY_ADDRESS": head.address, "PYTHONPATH": str(tmp_path)}
    resume = subprocess.run([str(BIN / "nasplat"), "resume", str(folder), "--quiet"], env=env, capture_output=True,
                            text=True, timeout=180)
    assert resume.returncode == 0, resume.stderr[-3000:]

    after = ExperimentResult.load(folder)
    assert after.counts() == {"completed": 12}, after.counts()
    keys = [(r["trial_id"], r["step"], r["attempt"]) for r in after.rows]
    assert len(keys) == len(set(keys)), "a (trial, step, attempt) row was written twice"
    assert sorted(keys) == [(t, s, 0) for t in range(12) for s in range(1, 5)], f"rows: {sorted(keys)}"
    ended = {r["trial_id"] for r in before if r["status"] != "running"}
    kept = [r for r in before if r["trial_id"] in ended]
    assert kept and [r for r in after.rows if r["trial_id"] in ended] == kept, \
        "rows of trials ended before the stop are kept verbatim"
    redone = {(r["trial_id"], r["step"], r["attempt"]): r for r in after.rows}
    for row in before:  # a trial cut off by the stop ran again from its start: same config, same scores
        again = redone[(row["trial_id"], row["step"], row["attempt"])]
        assert (again["config"], again["score"]) == (row["config"], row["score"]), (row, again)
