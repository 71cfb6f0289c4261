"""Durable trial state on a multi-node Ray cluster (`ray.cluster_utils.Cluster`, one machine): a trial whose node is
lost goes on from its checkpoint on another node, and an exploit whose donor object died with its node loads the
donor's durable checkpoint. The cluster and its driver run in a subprocess (see test_multinode.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict

import pytest
from processes import kill_session
from test_multinode import DRIVER as PLACEMENT_DRIVER

from nasplat.engine.result import ExperimentResult

pytestmark = pytest.mark.slow

TRIALS, STEPS = 6, 6

# the helpers `lose` and `report` of test_multinode's driver, then this file's scenarios
HELPERS = PLACEMENT_DRIVER[:PLACEMENT_DRIVER.index("STORAGE, TRIALS, STEPS =")]

DRIVER = HELPERS + """
import torch

from nasplat.executors.ray.executor import RayExecutor
from nasplat.storage import Storage

class Counted(Trainer):
    \"\"\"0.3 s per step; a 4 MB tensor (a state lives in a node's object store) and the step count in its state.\"\"\"
    def setup(self, config, ctx):
        self.w, self.t = torch.zeros(1_000_000), 0
    def step(self):
        time.sleep(0.3)
        self.t += 1
        return {"score": -(self.config["x"] - 0.5) ** 2 + 0.01 * self.t, "t": self.t,
                "node_id": ray.get_runtime_context().get_node_id()}
    def state_dict(self):
        return {"w": self.w, "t": self.t}
    def load_state_dict(self, state):
        self.w.copy_(state["w"])
        self.t = state["t"]

def lose_a_running_trial(folder, cluster, workers, out):
    \"\"\"Once 6 rows exist, lose the node of a trial that is past step 2 and has 2 steps to go.\"\"\"
    rows_file, deadline = folder / "results.jsonl", time.monotonic() + 180
    while time.monotonic() < deadline:
        rows = read_rows(rows_file) if rows_file.exists() else []
        latest = {r["trial_id"]: r for r in rows}
        at_risk = [r for r in latest.values() if r["status"] == "running" and 2 <= r["step"] <= STEPS - 2]
        if len(rows) >= 6 and at_risk:
            victim = at_risk[0]["node_id"]
            out.update(removed=victim, at_risk=sorted(r["trial_id"] for r in at_risk if r["node_id"] == victim))
            out["killed_workers"] = lose(cluster, next(w for w in workers if w.node_id == victim))
            return
        time.sleep(0.02)

def lost_donor(cluster, workers):
    \"\"\"Trial 1 (donor) snapshots after step 2, checkpoints after step 3; its node dies; trial 0 exploits it.\"\"\"
    executor = RayExecutor(concurrency=2, cpus_per_trial=2)
    executor.open(Counted, "donor", Storage(STORAGE / "donor-checkpoints"))
    executor.launch(0, {"x": 0.1}, seed=0)
    executor.launch(1, {"x": 0.5}, seed=1)
    events, taken = [], set()
    def next_step(trial_id):
        \"\"\"The trial's next step event not yet taken: from those seen, else by waiting.\"\"\"
        while True:
            for index, event in enumerate(events):
                if index not in taken and event.trial_id == trial_id and (event.metrics or event.error):
                    assert event.error is None, event.error
                    taken.add(index)
                    return event.metrics
            events.extend(executor.wait())
    receiver = next_step(0)
    next_step(1)
    executor.step(1)
    next_step(1)
    executor.step(1, snapshot=True)  # the state after step 2, held in the donor node's object store
    donor = next_step(1)
    executor.step(1, save=3)  # the state after step 3, written to storage
    next_step(1)
    while not [c for e in events for c in e.saved]:  # a write is reported with a later call of its trial
        executor.step(1)
        next_step(1)
    [fallback] = [c for e in events for c in e.saved]
    snapshot = executor.busy[1].snapshot
    lose(cluster, next(w for w in workers if w.node_id == donor["node_id"]))
    executor.exploit(0, 1, {"x": 0.5}, fallback=fallback)
    after = next_step(0)
    try:
        ray.get(snapshot, timeout=30)
        lost = "not lost"
    except Exception as exc:
        lost = type(exc).__name__
    return {"receiver_node": receiver["node_id"], "donor_node": donor["node_id"], "fallback_step": fallback.step,
            "after": after, "snapshot": lost}

STORAGE = Path(sys.argv[1])
STEPS = int(sys.argv[3])
fast_health_checks = {"health_check_period_ms": 500, "health_check_timeout_ms": 500,
                      "health_check_failure_threshold": 3}
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False,
                                                       "_system_config": fast_health_checks})
try:
    workers = [cluster.add_node(num_cpus=2) for _ in range(3)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    report("workers", [w.node_id for w in workers])
    out = {}
    killer = threading.Thread(target=lose_a_running_trial, args=(STORAGE / "lose", cluster, workers, out))
    killer.start()
    nasplat.run(trainer=Counted, space={"x": Float(0.0, 1.0)}, metric="score", executor="ray", seed=5,
                storage=STORAGE, name="lose", max_trials=int(sys.argv[2]), max_steps=STEPS, max_failures=3,
                checkpoint={"every": 1})
    killer.join()
    report("lose", out)
    cluster.add_node(num_cpus=2)  # back to three worker nodes
    cluster.wait_for_nodes()
    alive = [w for w in cluster.worker_nodes if w.node_id != out["removed"]]
    report("donor", lost_donor(cluster, alive))
finally:
    ray.shutdown()
    cluster.shutdown()
"""


@pytest.fixture(scope="module")
def cluster_run(tmp_path_factory) -> tuple[dict, str]:
    storage = tmp_path_factory.mktemp("multinode-durable")
    script = storage / "driver.py"
    script.write_text(DRIVER)
    temp = tempfile.mkdtemp(prefix="nsd-", dir="/tmp")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH"))}
    env.update(RAY_TMPDIR=temp, RAY_AUTH_MODE="disabled")
    driver = subprocess.Popen([sys.executable, str(script), str(storage), str(TRIALS), str(STEPS)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = driver.communicate(timeout=420)
    except subprocess.TimeoutExpired:
        driver.kill()
        out, err = driver.communicate()
    finally:
        kill_session(driver.pid)
        shutil.rmtree(temp, ignore_errors=True)
    lines = [line.split(" ", 2) for line in out.splitlines() if line.startswith("RESULT ")]
    return {key: json.loads(value) for _, key, value in lines}, storage, f"(exit {driver.returncode})\n{err[-4000:]}"


def test_a_trial_on_a_lost_node_goes_on_from_its_checkpoint_elsewhere(cluster_run):
    report, storage, stderr = cluster_run
    assert "lose" in report, stderr
    removed, at_risk = report["lose"]["removed"], set(report["lose"]["at_risk"])
    assert at_risk, report["lose"]
    result = ExperimentResult.load(storage / "lose")
    assert result.counts() == {"completed": TRIALS}, result.counts()
    attempts = defaultdict(lambda: defaultdict(list))
    for row in result.rows:
        attempts[row["trial_id"]][row["attempt"]].append(row)
    for trial in at_risk:
        first = [r for r in attempts[trial][0] if r["status"] != "retried"]
        last = attempts[trial][max(attempts[trial])]
        assert {r["node_id"] for r in first} == {removed} and len(first) >= 2, first
        assert removed not in {r["node_id"] for r in last}  # the retry ran on another node
        resumed_at = min(r["step"] for r in last)
        assert resumed_at > 1 and resumed_at <= first[-1]["step"] + 1  # from a checkpoint, not from scratch
        assert [r["step"] for r in last] == list(range(resumed_at, STEPS + 1))
    for trial, by_attempt in attempts.items():  # the trainer's own count matches the step: no state lost or replayed
        assert all(r["t"] == r["step"] for rows in by_attempt.values() for r in rows if r["status"] != "retried")


def test_an_exploit_whose_donor_object_is_lost_loads_the_donors_checkpoint(cluster_run):
    report, _, stderr = cluster_run
    assert "donor" in report, stderr
    donor = report["donor"]
    assert donor["receiver_node"] != donor["donor_node"]
    assert donor["snapshot"] != "not lost"  # the in-memory snapshot (after step 2) died with its node
    assert donor["fallback_step"] == 3
    assert donor["after"]["t"] == 4  # the checkpoint after step 3, stepped once (the snapshot would give 3)
