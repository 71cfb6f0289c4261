"""The `ray` executor on a real local Ray: reuse, arrival order, failures, PBT exploit, resume, Tune, metrics."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
import ray
import torch

import nasplat
from nasplat import Choice, Float, Int, Trainer
from nasplat.engine.result import ExperimentResult


class Sleepy(Trainer):
    """Sleeps `ms` per step (rows carry the worker's pid)."""

    def setup(self, config, ctx):
        self.ms, self.t = config["ms"], 0

    def step(self):
        time.sleep(self.ms / 1000)
        self.t += 1
        return {"score": float(self.ms), "t": self.t}


class LinearRegression(Trainer):
    """SGD on a fixed regression problem; reports the optimizer's learning rate. A step takes 0.2 s, so
    that PBT's two members train side by side even when one starts a second later than the other."""

    def setup(self, config, ctx):
        torch.manual_seed(ctx.seed)
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(256, 8, generator=generator)
        self.y = self.x @ torch.arange(8.0) + 0.1 * torch.randn(256, generator=generator)
        self.model = torch.nn.Linear(8, 1)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=config["lr"])

    def step(self):
        time.sleep(0.2)
        loss = torch.nn.functional.mse_loss(self.model(self.x).squeeze(1), self.y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return {"neg_loss": -loss.item(), "lr": self.opt.param_groups[0]["lr"]}

    def state_dict(self):
        return {"model": self.model.state_dict(), "opt": self.opt.state_dict()}

    def load_state_dict(self, state):
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["opt"])

    def update_config(self, config):
        for group in self.opt.param_groups:
            group["lr"] = config["lr"]


def test_results_arrive_as_they_finish_on_reused_actors(ray_session):
    # A first experiment leaves its two gangs parked, up: the second adopts both, so that how the trials are shared
    # does not hang on when each actor finished starting (seconds apart on a loaded machine).
    nasplat.run(trainer=Sleepy, space={"ms": Int(1, 2)}, metric="score", executor="ray", concurrency=2, max_trials=2)
    result = nasplat.run(trainer=Sleepy, space={"ms": Int(1, 120)}, metric="score", executor="ray", concurrency=2,
                         max_trials=12, seed=3)
    order = [r["trial_id"] for r in result.rows]
    assert sorted(order) == list(range(12))
    assert order != sorted(order)  # a short trial started later overtakes a long one
    trials_per_pid = collections.Counter(r["pid"] for r in result.rows)
    assert len(trials_per_pid) == 2 and os.getpid() not in trials_per_pid  # two actor processes, not the driver
    assert sorted(trials_per_pid.values())[0] >= 2  # each gang was reused by later trials


class KillOnFirstRow:
    """A listener that kills trial 0's actor when the first row arrives: both gangs are then mid-trial (step 1 of
    3). Its actor may have served an earlier experiment (a parked gang): it is found through the executor."""

    def __init__(self, name: str) -> None:
        self.name, self.killed_at = name, None

    def on_row(self, engine, row) -> None:
        if self.killed_at is None:
            self.killed_at = (row["trial_id"], row["step"])
            ray.kill(engine.executor.busy[0].gang.actors[0], no_restart=True)


@pytest.mark.parametrize("max_failures", [0, 1])
def test_killing_a_trial_actor_fails_or_retries_that_trial_only(ray_session, max_failures):
    name = f"kill-{max_failures}"
    killer = KillOnFirstRow(name)
    result = nasplat.run(trainer=Sleepy, space={"ms": Int(200, 300)}, metric="score", executor="ray", concurrency=2,
                         max_trials=8, max_steps=3, max_failures=max_failures, name=name, seed=0,
                         callbacks=[killer])
    assert killer.killed_at is not None and killer.killed_at[1] == 1
    counts = result.counts()
    assert counts.get("completed", 0) + counts.get("failed", 0) == 8
    if max_failures == 0:
        assert counts["failed"] == 1
        failed = [r for r in result.rows if r["status"] == "failed"]
        assert "Actor" in failed[0]["error"] or "died" in failed[0]["error"]
    else:
        assert counts["completed"] == 8
        assert max(r["attempt"] for r in result.rows) == 1


def test_pbt_exploit_keeps_the_process_and_applies_the_new_learning_rate(ray_session):
    controller = nasplat.PopulationBasedTraining({"lr": Float(1e-4, 0.05, log=True)}, metric="neg_loss",
                                                 population_size=2, perturbation_interval=3, quantile_fraction=0.5,
                                                 initial_configs=[{"lr": 1e-4}, {"lr": 0.04}], seed=0)
    result = nasplat.run(trainer=LinearRegression, controller=controller, executor="ray", concurrency=2,
                         max_trials=2, max_steps=12)
    frame = result.dataframe().sort_values(["trial_id", "step"])
    exploits = frame[frame.donor_id.notna()].sort_values("step", kind="stable")
    assert len(exploits) >= 1 and (exploits.trial_id != exploits.donor_id).all()
    assert (exploits.trial_id.iloc[0], exploits.donor_id.iloc[0]) == (0, 1)  # the lr=1e-4 member copies first
    for position, (_, row) in enumerate(exploits.iterrows()):
        after = frame[(frame.trial_id == row.trial_id) & (frame.step == row.step + 1)].iloc[0]
        assert after.pid == row.pid  # same actor process, no restart
        assert after.lr == pytest.approx(after.config["lr"])  # the new config is in effect
        if position == 0:  # lr 1e-4 has barely moved: it continues with a new lr from the donor's much better
            # weights. Later exploits compare two trained members, whose perturbed lrs may coincide, and a
            # donor's latest snapshot may be a few steps old.
            assert after.lr > 10 * row.lr and after.neg_loss > row.neg_loss
    assert frame.groupby("trial_id").pid.nunique().max() == 1


class Counter(Trainer):
    """State: a step counter. With a `gate` file, the third step waits until that file exists (60 s at most)."""

    def setup(self, config, ctx):
        self.t = 0

    def step(self):
        self.t += 1
        if self.config["gate"] and self.t == 3:
            deadline = time.monotonic() + 60
            while not os.path.exists(self.config["gate"]) and time.monotonic() < deadline:
                time.sleep(0.01)
        return {"t": self.t}

    def state_dict(self):
        return {"t": self.t}

    def load_state_dict(self, state):
        self.t = state["t"]


def test_exploit_copies_the_donors_snapshot_without_waiting_for_its_running_step(ray_session, tmp_path):
    from nasplat.executors.ray.executor import RayExecutor

    gate = tmp_path / "gate"  # the donor's third step cannot end before the test creates this file
    executor = RayExecutor(2)
    executor.open(Counter, "snapshot-exp")
    try:
        def next_metrics():
            (event,) = executor.wait()
            assert event.error is None, event.error
            return event.trial_id, event.metrics

        executor.launch(0, {"gate": str(gate)}, seed=0)
        assert next_metrics() == (0, {"t": 1})
        executor.step(0)
        assert next_metrics() == (0, {"t": 2})
        executor.step(0, snapshot=True)  # the state after step 2 is kept, then the gated step runs
        executor.launch(1, {"gate": None}, seed=1)
        assert next_metrics() == (1, {"t": 1})
        executor.exploit(1, 0, {"gate": None})
        # The exploit's step ends while the donor's step is still blocked on the gate: it did not wait for it,
        # and it continued from the donor's snapshot at t = 2, not from the running step.
        assert next_metrics() == (1, {"t": 3})
        gate.touch()
        assert next_metrics() == (0, {"t": 3})
    finally:
        executor.close()


CRASHING_DRIVER = """
import os, signal, sys, time
import nasplat
from nasplat import Float, Trainer

class Slow(Trainer):
    def setup(self, config, ctx):
        self.x, self.t = config["x"], 0
    def step(self):
        time.sleep(0.05)
        self.t += 1
        return {"score": -(self.x - 0.5) ** 2 + 0.01 * self.t}

nasplat.run(trainer=Slow, space={"x": Float(0.0, 1.0)}, metric="score", controller="evolution",
            controller_options={"population_size": 4, "sample_size": 2}, executor="ray", concurrency=2,
            max_trials=24, max_steps=4, seed=1, storage=sys.argv[1], name="exp")
"""


def test_sigkill_of_the_driver_then_resume_finishes_without_loss_or_duplicates(ray_session, tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(CRASHING_DRIVER)
    env = {**os.environ, "RAY_ADDRESS": ray_session}
    driver = subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=env, stderr=subprocess.PIPE)
    rows_file = tmp_path / "exp" / "results.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not rows_file.exists() or len(rows_file.read_text().splitlines()) < 30):
        time.sleep(0.05)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    assert driver.returncode == -signal.SIGKILL, driver.stderr.read().decode()[-3000:]
    before = ExperimentResult.load(tmp_path / "exp").rows
    assert 30 <= len(before) < 96
    resumed = nasplat.resume(tmp_path / "exp", allow_pickle=True)  # its trainer lives in the driver script
    keys = [(r["trial_id"], r["step"]) for r in ExperimentResult.load(tmp_path / "exp").rows]
    assert len(keys) == len(set(keys)) == 96
    assert sorted(keys) == sorted((t, s) for t in range(24) for s in range(1, 5))
    completed = {r["trial_id"] for r in before if r["status"] == "completed"}
    assert completed and all(r in resumed.rows for r in before if r["trial_id"] in completed)


def test_tune_adapter_runs_regularized_evolution_inside_a_tuner(ray_session, tmp_path):
    from ray import tune

    from nasplat.integrations.tune import TuneSearch

    def trainable(config):
        tune.report({"score": -(config["x"] - 0.3) ** 2 - 0.01 * config["k"]})

    controller = nasplat.RegularizedEvolution({"x": Float(0.0, 1.0), "k": Int(0, 9)}, metric="score",
                                              population_size=4, sample_size=2, seed=0)
    tuner = tune.Tuner(trainable, tune_config=tune.TuneConfig(search_alg=TuneSearch(controller), num_samples=16,
                                                              max_concurrent_trials=2),
                       run_config=tune.RunConfig(storage_path=str(tmp_path), name="tune", verbose=0))
    results = tuner.fit()
    assert len(results) == 16 and all(r.error is None for r in results)
    assert len(controller.population) == 4  # every result was told; the oldest aged out
    assert controller.next_trial_id == 16
    reported = sorted(r.metrics["score"] for r in results)
    for member in controller.population:  # the controller scored each config as the trainable did
        config, score = member[1], member[2]
        assert score == pytest.approx(-(config["x"] - 0.3) ** 2 - 0.01 * config["k"])
        assert any(score == pytest.approx(value) for value in reported)
    best = results.get_best_result(metric="score", mode="max")
    assert best.metrics["score"] == reported[-1] > reported[0]


def test_experiment_metrics_reach_the_prometheus_endpoint(ray_session):
    nasplat.run(trainer=Sleepy, space={"ms": Int(1, 5)}, metric="score", executor="ray", concurrency=2,
                max_trials=6, name="metrics-exp")
    node = next(n for n in ray.nodes() if n["Alive"])
    url = f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"
    deadline, lines, completed = time.monotonic() + 30, [], []
    while time.monotonic() < deadline and [float(line.split()[-1]) for line in completed] != [6.0]:
        time.sleep(0.5)  # the final values reach the endpoint at Ray's next metrics report
        text = urllib.request.urlopen(url, timeout=5).read().decode()
        lines = [line for line in text.splitlines() if 'experiment="metrics-exp"' in line]
        completed = [line for line in lines if line.startswith("ray_nasplat_trials") and 'state="completed"' in line]
    assert [float(line.split()[-1]) for line in completed] == [6.0], completed
    best = [line for line in lines if line.startswith("ray_nasplat_best_metric")]
    assert best and float(best[0].split()[-1]) >= 1.0, best


def test_evolution_children_inherit_their_parents_state_on_ray(ray_session):
    from test_engine import Lineage, check_inheritance

    result = nasplat.run(trainer=Lineage, space={"x": Float(0.0, 1.0), "w": Choice([1, 2])}, metric="score",
                         controller="evolution", executor="ray", concurrency=2, max_trials=24, max_steps=2, seed=3,
                         controller_options={"population_size": 4, "sample_size": 2, "inherit_weights": True})
    check_inheritance(result.dataframe(), inherit=True)
    assert result.dataframe().pid.nunique() == 2  # the states travelled between the two reused actors


class Pid(Trainer):
    """Reports its actor's pid and the trainer class's name."""

    def setup(self, config, ctx):
        pass

    def step(self):
        return {"score": 1.0, "actor_pid": os.getpid(), "named": type(self).__name__ == "Pid"}


class OtherPid(Pid):
    pass


def test_a_second_experiment_adopts_the_first_ones_parked_actors(ray_session):
    from nasplat.executors.ray import park
    from nasplat.executors.ray.executor import RayExecutor

    def pids(trainer, executor, name):
        result = nasplat.run(trainer=trainer, space={"x": Float(0.0, 1.0)}, metric="score", executor=executor,
                             max_trials=6, name=name)
        assert result.counts() == {"completed": 6}
        return {r["actor_pid"] for r in result.rows}, {r["named"] for r in result.rows}

    park.release_parked()  # gangs an earlier test parked
    first = RayExecutor(2)
    first_pids, _ = pids(Pid, first, "park-1")
    assert len(first_pids) == 2 and park.parked_count() == 2 and first.gangs_started == 2
    # the same resources, another trainer class: the parked actors serve it, none is started
    second = RayExecutor(2)
    second_pids, named = pids(OtherPid, second, "park-2")
    assert second_pids == first_pids and named == {False} and second.gangs_started == 0
    # other resources: the parked ones are killed (they hold CPUs), fresh ones start; park_s=0 parks none
    third = RayExecutor(2, cpus_per_trial=0.5, park_s=0)
    third_pids, _ = pids(Pid, third, "park-3")
    assert not third_pids & first_pids and third.gangs_started == 2 and park.parked_count() == 0
    assert every_cpu_freed()  # every actor is gone


def every_cpu_freed(within_s: float = 30) -> bool:
    """Whether every CPU of the cluster is free again within `within_s` (a kill reaches Ray's view shortly after)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and ray.available_resources().get("CPU") != ray.cluster_resources()["CPU"]:
        time.sleep(0.05)
    return ray.available_resources().get("CPU") == ray.cluster_resources()["CPU"]


def test_parked_actors_are_released_after_park_s(ray_session):
    from nasplat.executors.ray import park
    from nasplat.executors.ray.executor import RayExecutor

    nasplat.run(trainer=Pid, space={"x": Float(0.0, 1.0)}, metric="score", executor=RayExecutor(2, park_s=3),
                max_trials=2, name="park-timer")
    assert park.parked_count() == 2  # for 3 s from the run's end
    assert park.wait_for_release(timeout=60)  # the release timer ran
    assert park.parked_count() == 0 and every_cpu_freed()


def test_a_rank_whose_trials_never_save_never_imports_torch(tmp_path):
    code = ("import sys\nfrom nasplat.executors.ray.rank import RankActor\nfrom nasplat import Trainer\n"
            "class T(Trainer):\n    def setup(self, config, ctx): self.t = 0\n"
            "    def step(self): self.t += 1; return {'t': self.t}\n    def state_dict(self): return {'t': self.t}\n"
            f"rank = RankActor(T, 0, 1, 'x', checkpoints={str(tmp_path)!r})\n"
            "rank.launch(0, {}, 0)\nrank.step()\nassert 'torch' not in sys.modules\n"
            "rank.step(save=2)\nassert 'torch' in sys.modules\nprint(rank.finish())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "step=2" in done.stdout and (tmp_path / "trial-0" / "step-2").is_dir()
