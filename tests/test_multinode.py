"""nasplat on a multi-node Ray cluster (`ray.cluster_utils.Cluster`, one machine): where a gang's ranks land, more
gangs than CPUs, and an experiment that loses a node halfway. The cluster and its driver run in a subprocess (a
process holds one Ray at a time, and pytest's may already hold the session's)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from processes import kill_session

from nasplat.engine.result import ExperimentResult
from nasplat.storage import ROWS_FILE, read_rows

pytestmark = pytest.mark.slow

TRIALS, STEPS = 18, 4  # the node-loss experiment: 18 trials of 4 steps on 6 CPUs

DRIVER = """
import json, os, signal, sys, threading, time
from pathlib import Path

import ray
from ray.cluster_utils import Cluster

import nasplat
from nasplat import Float, Trainer
from nasplat.executors.ray.gang import Gang
from nasplat.engine.result import read_rows

class Where(Trainer):
    \"\"\"Sleeps 0.3 s per step; reports the node and rank it ran on.\"\"\"
    def setup(self, config, ctx):
        self.x, self.t, self.rank = config["x"], 0, ctx.rank
    def step(self):
        time.sleep(0.3)
        self.t += 1
        return {"score": -(self.x - 0.5) ** 2 + 0.01 * self.t, "rank": self.rank,
                "node_id": ray.get_runtime_context().get_node_id()}

def placement(strategy):
    gang = Gang(Where, workers=2, strategy=strategy, cpus_per_worker=1, label=f"place-{strategy}")
    metrics = ray.get(gang.launch(0, {"x": 0.5}, seed=0), timeout=120)
    actors = ray.get([a.node_id.remote() for a in gang.actors])
    node = gang.node_id
    gang.kill()
    return {"ranks": [m["rank"] for m in metrics], "reported": [m["node_id"] for m in metrics], "actors": actors,
            "gang_node": node}

def lose(cluster, node):
    \"\"\"The node's machine goes away: its raylet and agents, then the worker processes the raylet started.\"\"\"
    raylet = node.all_processes["raylet"][0].process.pid
    children = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == raylet:
                children.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            pass
    cluster.remove_node(node, allow_graceful=False)
    for pid in children:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(children)

def remove_one(folder, cluster, workers, out):
    \"\"\"Once 8 rows exist, lose the node of a trial that has at least 2 steps to go.\"\"\"
    rows_file, deadline = folder / "results.jsonl", time.monotonic() + 120
    while time.monotonic() < deadline:
        rows = read_rows(rows_file) if rows_file.exists() else []
        latest = {r["trial_id"]: r for r in rows}
        at_risk = [r for r in latest.values() if r["status"] == "running" and r["step"] <= STEPS - 2]
        if len(rows) >= 8 and at_risk:
            victim = at_risk[0]["node_id"]
            out.update(removed=victim, rows_before=rows,
                       at_risk=sorted(r["trial_id"] for r in at_risk if r["node_id"] == victim))
            out["killed_workers"] = lose(cluster, next(w for w in workers if w.node_id == victim))
            return
        time.sleep(0.02)

def report(key, value):
    print(f"RESULT {key} {json.dumps(value)}", flush=True)

def run(name, **options):
    return nasplat.run(trainer=Where, space={"x": Float(0.0, 1.0)}, metric="score", executor="ray", seed=5,
                       storage=STORAGE, name=name, **options)

def within(seconds, fn):
    \"\"\"fn()'s value, or an error string if it raised or had not returned after `seconds` (it hangs).\"\"\"
    box = ["no result after %d s" % seconds]
    def target():
        try:
            box[0] = fn()
        except Exception as exc:
            box[0] = repr(exc)
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    return box[0]

STORAGE, TRIALS, STEPS = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
fast_health_checks = {"health_check_period_ms": 500, "health_check_timeout_ms": 500,
                      "health_check_failure_threshold": 3}  # a lost node is declared dead within ~2 s
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False,
                                                       "_system_config": fast_health_checks})
try:
    workers = [cluster.add_node(num_cpus=2) for _ in range(3)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    report("workers", [w.node_id for w in workers])
    report("spread", placement("SPREAD"))
    report("pack", placement("PACK"))
    over = within(60, lambda: run("oversubscribed", concurrency=7, max_trials=10, max_steps=2))
    report("oversubscribed", over if isinstance(over, str) else "finished")
    if isinstance(over, str):
        os._exit(3)  # the hung run holds this Ray; the test's fixture kills what is left of the cluster
    out = {}
    killer = threading.Thread(target=remove_one, args=(STORAGE / "lose", cluster, workers, out))
    killer.start()
    run("lose", max_trials=TRIALS, max_steps=STEPS, max_failures=3)
    killer.join()
    report("lose", out)
finally:
    ray.shutdown()
    cluster.shutdown()
"""


@dataclass
class Run:
    """What the driver reported (scenario -> its JSON value), where it stored experiments, its stderr's tail."""

    report: dict[str, Any]
    storage: Path
    stderr: str

    def __getitem__(self, scenario: str) -> Any:
        assert scenario in self.report, f"the driver reported no {scenario!r}; its stderr:\n{self.stderr}"
        return self.report[scenario]


@pytest.fixture(scope="module")
def cluster_run(tmp_path_factory) -> Run:
    """Runs DRIVER once: a head without CPUs and 3 worker nodes of 2 CPUs, under its own Ray temp dir (so no
    other Ray on this machine can find it), then kills whatever its session left behind."""
    storage = tmp_path_factory.mktemp("multinode")
    script = storage / "driver.py"
    script.write_text(DRIVER)
    temp = tempfile.mkdtemp(prefix="nsm-", dir="/tmp")  # short: unix socket paths live under it
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH"))}
    env.update(RAY_TMPDIR=temp, RAY_AUTH_MODE="disabled")
    driver = subprocess.Popen([sys.executable, str(script), str(storage), str(TRIALS), str(STEPS)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = driver.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        driver.kill()
        out, err = driver.communicate()
    finally:
        kill_session(driver.pid)
        shutil.rmtree(temp, ignore_errors=True)
    lines = [line.split(" ", 2) for line in out.splitlines() if line.startswith("RESULT ")]
    return Run({key: json.loads(value) for _, key, value in lines}, storage,
               f"(exit {driver.returncode})\n{err[-4000:]}")


def test_spread_gang_ranks_land_on_different_nodes_and_pack_on_one(cluster_run):
    workers, spread, pack = set(cluster_run["workers"]), cluster_run["spread"], cluster_run["pack"]
    for gang in (spread, pack):
        assert gang["ranks"] == [0, 1] and gang["reported"] == gang["actors"], gang
        assert set(gang["actors"]) <= workers and gang["gang_node"] == gang["actors"][0], (gang, workers)
    assert len(set(spread["actors"])) == 2, f"SPREAD put both ranks on one node: {spread}"
    assert len(set(pack["actors"])) == 1, f"PACK split a gang that fits on one node: {pack}"


def test_a_gang_waiting_for_cpus_starts_once_the_others_go_idle(cluster_run):
    """Concurrency 7 on 6 CPUs: the 7th gang waits until gangs left idle at the end of the budget are released."""
    assert cluster_run["oversubscribed"] == "finished", "the oversubscribed run hung: idle gangs kept every CPU"
    result = ExperimentResult.load(cluster_run.storage / "oversubscribed")
    assert result.counts() == {"completed": 10}, result.counts()
    assert sorted((r["trial_id"], r["step"]) for r in result.rows) == [(t, s) for t in range(10) for s in (1, 2)]
    assert len({r["pid"] for r in result.rows}) == 7, "six gangs reused, and the one that waited"


def test_losing_a_node_retries_its_trials_elsewhere_and_loses_no_row(cluster_run):
    workers, lost = cluster_run["workers"], cluster_run["lose"]
    removed, at_risk = lost["removed"], set(lost["at_risk"])
    assert removed in workers and at_risk and lost["killed_workers"] >= 2, lost
    result = ExperimentResult.load(cluster_run.storage / "lose")
    rows = result.rows
    assert result.counts() == {"completed": TRIALS}, f"every trial completes despite the lost node: {result.counts()}"
    keys = [(r["trial_id"], r["step"], r["attempt"]) for r in rows]
    assert len(keys) == len(set(keys)), "a (trial, step, attempt) row was written twice"
    on_disk = read_rows(cluster_run.storage / "lose" / ROWS_FILE)  # as written: a retry's void rows read `retried`
    missing = [r for r in lost["rows_before"] if r not in on_disk]
    assert not missing, f"rows recorded before the node was lost are gone: {missing}"

    attempts: dict[int, dict[int, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        attempts[row["trial_id"]][row["attempt"]].append(row)
    assert sorted(attempts) == list(range(TRIALS))
    retried = {t for t, by_attempt in attempts.items() if set(by_attempt) != {0}}
    assert at_risk <= retried, f"trials running on the lost node {sorted(at_risk)} were not all retried: {retried}"
    for trial, by_attempt in attempts.items():
        last = max(by_attempt)  # a retry placed before Ray knew the node was dead fails too, and is retried again
        assert [r["step"] for r in by_attempt[last]] == list(range(1, STEPS + 1)), (trial, by_attempt[last])
        assert [r["status"] for r in by_attempt[last]] == ["running"] * (STEPS - 1) + ["completed"], trial
        for attempt, steps in by_attempt.items():
            trained = [r for r in steps if r["status"] != "retried"]
            assert [r["step"] for r in trained] == list(range(1, len(trained) + 1)), (trial, attempt, steps)
            if attempt < last:  # an attempt cut short ran on the lost node; its last row keeps the error
                assert {r["node_id"] for r in trained} <= {removed}, (trial, steps)
                assert steps[-1]["status"] == "retried" and steps[-1]["error"], (trial, steps)
            if attempt > 0:  # a retry runs on a surviving node
                assert removed not in {r["node_id"] for r in trained}, (trial, attempt, steps)
