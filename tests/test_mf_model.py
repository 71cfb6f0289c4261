"""Issue 31: every rung a trial reaches reaches the wrapped controller (`Searcher.on_rung`), and the model-based
multi-fidelity controller (`mobster`) that learns from them, on every executor, resumed exactly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from processes import DIE_AFTER_ROWS
import yaml

import nasplat
from nasplat.controllers import ModelBasedMultiFidelity, RandomSearch, Result
from nasplat.schedulers import ASHA, Hyperband
from nasplat.storage import read_rows

BIN = Path(sys.executable).parent

# A multi-fidelity objective: the value at step t approaches the final value, more slowly for larger x, so the first
# steps rank configs imperfectly; each step costs one simulated second.
TOY = """
import math
from nasplat import Choice, Float, Trainer

SPACE = {"x": Float(0.0, 1.0), "y": Float(1e-3, 1.0, log=True), "k": Choice(["a", "b", "c"])}

def final(c):
    return -(c["x"] - 0.7) ** 2 - 0.3 * (math.log10(c["y"]) + 1.5) ** 2 + {"a": 0.0, "b": 0.2, "c": -0.1}[c["k"]]

class Curve(Trainer):
    def setup(self, config, ctx):
        self.c, self.t = config, 0
    def step(self):
        self.t += 1
        return {"score": final(self.c) - (0.2 + 0.8 * self.c["x"]) / (1 + self.t), "t": self.t, "time_cost": 1.0}
    def state_dict(self):
        return {"t": self.t}
    def load_state_dict(self, state):
        self.t = state["t"]
"""


@pytest.fixture
def toy(tmp_path, monkeypatch):
    (tmp_path / "toy_mf.py").write_text(TOY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    import importlib

    return importlib.import_module("toy_mf")


class Recording(RandomSearch):
    """Random search that records every rung it is handed and every tell."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.rungs: list[tuple[int, int]] = []
        self.tells: list[tuple[int, int]] = []

    def on_rung(self, trial_id, result):
        self.rungs.append((trial_id, result.step))

    def tell(self, trial_id, result):
        self.tells.append((trial_id, result.step))
        super().tell(trial_id, result)


def _expected_rungs(rows, milestones, max_steps):
    """(trial, step) of each rung each trial reached, and of its last report."""
    last = {}
    for row in rows:
        last[row["trial_id"]] = row["step"]
    return sorted({(t, s) for t, end in last.items() for s in [*milestones, end] if s <= end and s <= max_steps})


@pytest.mark.parametrize("kind", ["promote", "stop"])
def test_every_rung_of_every_trial_reaches_the_wrapped_controller(toy, kind):
    controller = Recording(toy.SPACE, metric="score", seed=0)
    scheduler = ASHA(controller, max_steps=9, grace_period=1, reduction_factor=3, type=kind)
    result = nasplat.run(trainer=toy.Curve, space=toy.SPACE, metric="score", controller=controller,
                         scheduler=scheduler, executor="simulated", concurrency=3, max_trials=30, max_steps=9, seed=0)
    expected = _expected_rungs(result.rows, [1, 3], 9)
    assert sorted(controller.rungs) == expected  # each rung once, promoted trials' higher rungs included
    assert len(controller.rungs) == len(set(controller.rungs))
    assert {t for t, s in controller.rungs if s == 9} == {r["trial_id"] for r in result.rows if r["step"] == 9} != set()
    assert len({t for t, _ in controller.tells}) == len(controller.tells) == 30  # still one tell per trial
    if kind == "promote":  # told at the first rung it paused at, yet handed the higher ones
        assert any(s < 9 for t, s in controller.tells if (t, 9) in controller.rungs)


def test_the_model_sees_every_rung_with_its_fidelity(toy):
    controller = ModelBasedMultiFidelity(toy.SPACE, metric="score", seed=1, initial_samples=5, pool_size=100)
    result = nasplat.run(trainer=toy.Curve, space=toy.SPACE, metric="score", controller=controller,
                         scheduler=Hyperband(controller, max_steps=9, type="promote"), executor="simulated",
                         concurrency=4, max_trials=40, max_steps=9, seed=1)
    rows = {(r["trial_id"], r["step"]): r["score"] for r in result.rows}
    rungs = [(0, [1, 3]), (1, [3]), (2, [])]  # Hyperband's brackets' rungs below max_steps=9
    last = {t: s for (t, s) in rows}
    expected = {(t, s) for t, end in last.items() for s in [*rungs[controller_bracket(result, t)][1], end] if s <= end}
    assert set(controller.observed) == expected
    assert all(controller.observed[key] == pytest.approx(rows[key]) for key in expected)
    assert max(s for _, s in controller.observed) == 9 and min(s for _, s in controller.observed) == 1


def controller_bracket(result, trial_id):
    """The bracket of a trial from the first rung recorded in its rows (0: it reached step 1's rung, ...)."""
    first = min((r["step"] for r in result.rows if r["trial_id"] == trial_id and r.get("rung") is not None),
                default=9)
    return {1: 0, 3: 1}.get(first, 2)


def test_the_model_proposes_better_configs_than_random_search_at_the_same_budget(toy):
    """Same driver, 60 trials each through ASHA's rungs by hand: the model's last 20 proposals score higher at
    the full fidelity than random search's, on each of three seeds."""
    for seed in range(3):
        means = []
        for controller in (ModelBasedMultiFidelity(toy.SPACE, metric="score", seed=seed, initial_samples=8,
                                                   pool_size=200),
                           RandomSearch(toy.SPACE, metric="score", seed=seed)):
            finals = []
            for _ in range(60):
                spec = controller.ask()
                finals.append(toy.final(spec.config))
                for step in (1, 3, 9):
                    value = toy.final(spec.config) - (0.2 + 0.8 * spec.config["x"]) / (1 + step)
                    controller.on_rung(spec.trial_id, Result({"score": value}, step))
                    if step == 3 and value < -0.3:
                        break
                controller.tell(spec.trial_id, Result({"score": value}, step))
            means.append(np.mean(finals[-20:]))
        assert means[0] > means[1] + 0.1, (seed, means)


def _proposal_after(fit_on: str, first_step: list[float]) -> dict:
    """The first model proposal of a controller told 12 random trials' first steps (`first_step`) and steps 3 and 9
    of every third (20 observations: its `initial_samples`)."""
    controller = ModelBasedMultiFidelity({"x": nasplat.Float(0.0, 1.0), "y": nasplat.Float(0.0, 1.0)},
                                         metric="score", seed=3, initial_samples=20, pool_size=200, fit_on=fit_on)
    for index, value in enumerate(first_step):
        spec = controller.ask()
        final = -(spec.config["x"] - 0.7) ** 2 - (spec.config["y"] - 0.2) ** 2
        controller.on_rung(spec.trial_id, Result({"score": value}, 1))
        for step in (3, 9) if index % 3 == 0 else ():
            controller.on_rung(spec.trial_id, Result({"score": final - 0.1 / step}, step))
        controller.tell(spec.trial_id, Result({"score": value}, 1))
    return controller.ask().config


def test_fit_on_target_ignores_the_rungs_below_the_target():
    """Fitted at its target fidelity (9, reached by 4 of 12 trials), the model proposes the same config whatever
    the first step said; fitted to every fidelity, the first step moves its proposal."""
    rng = np.random.default_rng(0)
    first, second = rng.random(12).tolist(), rng.random(12).tolist()
    assert _proposal_after("target", first) == _proposal_after("target", second)
    assert _proposal_after("all", first) != _proposal_after("all", second)


def test_fit_on_target_trains_on_the_target_fidelity_and_above():
    controller = ModelBasedMultiFidelity({"x": nasplat.Float(0.0, 1.0)}, metric="score", seed=0, fit_on="target",
                                         min_at_target=2)
    trials = [controller.ask().trial_id for _ in range(5)]
    for trial_id, steps in zip(trials, [(1,), (1,), (1, 3), (1, 3, 9), (1, 3)]):
        for step in steps:
            controller.on_rung(trial_id, Result({"score": 0.1 * step + 0.01 * trial_id}, step))
    assert controller.target() == 3  # observed twice or more: steps 1 and 3
    inputs, scores, trained = controller.training_set()
    assert sorted(np.exp(inputs[:, -1]).round().astype(int).tolist()) == [3, 3, 3, 9]
    assert trained == [trials[2], trials[3], trials[4]]
    assert sorted(scores.round(2).tolist()) == [0.32, 0.33, 0.34, 0.93]
    controller.fit_on = "all"
    assert len(controller.training_set()[1]) == 9


def test_bad_options_are_one_line():
    with pytest.raises(ValueError, match=r"`fit_on` must be one of \['all', 'target'\], got fit_on='last'"):
        ModelBasedMultiFidelity({"x": nasplat.Float(0, 1)}, metric="s", fit_on="last")
    with pytest.raises(ValueError, match="max_points") as info:
        ModelBasedMultiFidelity({"x": nasplat.Float(0, 1)}, metric="s", max_points=1)
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="random_fraction"):
        ModelBasedMultiFidelity({"x": nasplat.Float(0, 1)}, metric="s", random_fraction=1.5)
    with pytest.raises(ValueError, match="min_distance"):
        ModelBasedMultiFidelity({"x": nasplat.Float(0, 1)}, metric="s", min_distance=-0.1)


def test_model_proposals_keep_min_distance_from_every_earlier_proposal(toy):
    """Through ASHA's rungs by hand, 40 trials: every proposal of the model (after the 6 random ones) lies further
    than `min_distance` from each config proposed before it, in the encoding; with `min_distance=0` the model
    proposes near copies of its incumbent on this toy (its best region is small)."""
    nearest = {}
    for min_distance in (0.08, 0.0):
        controller = ModelBasedMultiFidelity(toy.SPACE, metric="score", seed=2, initial_samples=6, pool_size=100,
                                             min_distance=min_distance)
        distances = []
        for _ in range(40):
            spec = controller.ask()
            encoded = controller.encoder.encode(spec.config).astype(float)
            earlier = [e for t, e in controller.encodings.items() if t != spec.trial_id]
            if spec.trial_id >= 6:
                distances.append(min(float(np.linalg.norm(encoded - e)) for e in earlier))
            for step in (1, 3, 9):
                value = toy.final(spec.config) - (0.2 + 0.8 * spec.config["x"]) / (1 + step)
                controller.on_rung(spec.trial_id, Result({"score": value}, step=step))
            controller.tell(spec.trial_id, Result({"score": value}, step=9))
        nearest[min_distance] = min(distances)
    assert nearest[0.08] > 0.08
    assert nearest[0.0] < 0.08, nearest


def test_in_a_finite_space_every_config_comes_once_then_the_best_predicted_is_trained_to_the_end():
    """A 12-config space through rungs 1 and 3 by hand, only the configs with b="x" trained on to step 3: the 12
    first proposals are the 12 configs (a small space's random pool repeats configs; none is proposed twice).
    Then each ask revisits, `train_to_end`, a config no trial took to step 3, once each, first one with the a
    that is best at step 3 (and worst at step 1); a revisited config still running is not proposed again."""
    space = {"a": nasplat.Choice([0, 1, 2, 3]), "b": nasplat.Choice(["x", "y", "z"])}

    def value(config, step):
        return config["a"] * (-0.1 if step == 1 else 1.0) + {"x": 0.0, "y": 0.5, "z": 0.2}[config["b"]]

    controller = ModelBasedMultiFidelity(space, metric="score", seed=0, initial_samples=4, pool_size=50)
    first = []
    for _ in range(12):
        spec = controller.ask()
        assert not spec.train_to_end
        first.append((spec.config["a"], spec.config["b"]))
        steps = (1, 3) if spec.config["b"] == "x" else (1,)
        for step in steps:
            controller.on_rung(spec.trial_id, Result({"score": value(spec.config, step)}, step))
        controller.tell(spec.trial_id, Result({"score": value(spec.config, steps[-1])}, steps[-1]))
    assert sorted(first) == sorted((a, b) for a in range(4) for b in "xyz")
    revisits = [controller.ask() for _ in range(9)]  # none told: each stays running
    assert all(spec.train_to_end for spec in revisits[:8])
    again = [(spec.config["a"], spec.config["b"]) for spec in revisits[:8]]
    assert sorted(again) == sorted((a, b) for a in range(4) for b in "yz")  # every config behind, once
    assert again[0][0] == 3, again
    assert not revisits[8].train_to_end  # none left behind: a random config


# -- every executor, the YAML and Python forms ----------------------------------------------------------------
def _check_run(result, trials):
    steps = {}
    for row in result.rows:
        steps[row["trial_id"]] = row["step"]
    assert len(steps) == trials
    assert all(row["t"] == row["step"] for row in result.rows)  # promoted trials went on from their state
    assert max(steps.values()) == 9 and min(steps.values()) == 1  # stopped early and trained to the end
    configs = {tuple(sorted(r["config"].items())) for r in result.rows}
    assert len(configs) == trials  # no config proposed twice


@pytest.mark.parametrize("executor", ["local", "processes", "simulated"])
def test_mobster_runs_on_each_executor(toy, executor):
    result = nasplat.run(trainer="toy_mf:Curve", space="toy_mf:SPACE", metric="score", controller="mobster",
                         controller_options={"initial_samples": 4, "pool_size": 50}, executor=executor,
                         concurrency=2, max_trials=14, max_steps=9, seed=3,
                         scheduler={"name": "asha", "type": "promote"})
    _check_run(result, 14)


def test_mobster_runs_on_the_ray_executor(toy, ray_session):
    result = nasplat.run(trainer=toy.Curve, space=toy.SPACE, metric="score", controller="mobster",
                         controller_options={"initial_samples": 4, "pool_size": 50}, executor="ray",
                         concurrency=2, max_trials=10, max_steps=9, seed=3, scheduler={"name": "asha", "type": "stop"})
    _check_run(result, 10)


def test_mobster_from_yaml(toy, tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump({
        "name": "mf", "trainer": "toy_mf:Curve", "space": "toy_mf:SPACE", "metric": "score",
        "controller": {"name": "mobster", "initial_samples": 4, "pool_size": 50}, "executor": "simulated",
        "budget": {"max_trials": 12, "max_steps": 9}, "resources": {"concurrency": 3},
        "scheduler": {"name": "hyperband", "type": "promote"}, "seed": 2}))
    done = subprocess.run([sys.executable, "-m", "nasplat.cli", "run", str(path), "--storage", str(tmp_path),
                           "--quiet"], capture_output=True, text=True, timeout=300, env=os.environ)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = read_rows(tmp_path / "mf" / "results.jsonl")
    assert len({r["trial_id"] for r in rows}) == 12 and max(r["step"] for r in rows) == 9


def test_the_multifidelity_example_finds_the_tables_best_config(tmp_path):
    """examples/multifidelity.yaml (mobster into ASHA ranking by the predicted final score, on the table, 100 full
    trainings' worth of simulated time on 4 workers) reaches the table's best validation accuracy, which 1 of its
    192 configurations has: each config is proposed once, then configs the rungs stopped early are trained again to
    the end, each once."""
    from trainers.lc_table import load_curves

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-m", "nasplat.cli", "run", str(root / "examples" / "multifidelity.yaml"),
                           "--storage", str(tmp_path), "--quiet"], check=False, cwd=root, capture_output=True,
                          text=True, timeout=300, env=os.environ)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = read_rows(tmp_path / "multifidelity" / "results.jsonl")
    assert max(r["valid_acc"] for r in rows) == pytest.approx(float(load_curves().curves["valid_acc"].max()))
    configs = {r["trial_id"]: tuple(sorted(r["config"].items())) for r in rows}
    assert len(set(configs[t] for t in range(192))) == 192  # every config once first
    furthest = {t: max(r["step"] for r in rows if r["trial_id"] == t) for t in configs}
    revisits = [t for t in configs if t >= 192]  # then configs again, trained to the end unjudged
    assert revisits and len({configs[t] for t in revisits}) == len(revisits)
    assert all(furthest[t] == 27 for t in revisits if t < max(configs) - 4)  # but those the budget cut short


# -- resumed exactly ------------------------------------------------------------------------------------------
DRIVER = DIE_AFTER_ROWS + """
import json
nasplat.run(**json.loads(sys.argv[3]), storage=sys.argv[1], name=sys.argv[2], checkpoint=True)
"""
MOBSTER = {"controller": "mobster", "controller_options": {"initial_samples": 5, "pool_size": 60, "refit_every": 4},
           "seed": 4}
TOY_RUN = {**MOBSTER, "trainer": "toy_mf:Curve", "space": "toy_mf:SPACE", "metric": "score", "max_trials": 24,
           "max_steps": 9, "scheduler": {"name": "asha", "type": "promote"}}
# the learning-curve table, whose curves cross: ranked by their predicted final score, ASHA promotes other trials
# than by their value at the rung from the 31st row on (checked when this test was written)
TABLE_RUN = {**MOBSTER, "trainer": "trainers.lc_table:LCTable", "space": "search_spaces.lc_table:space",
             "metric": "valid_acc", "max_trials": 40, "max_steps": 27,
             "scheduler": {"name": "asha", "type": "promote", "rank_by": "curve"}}
# with `delayed`, ASHA holds back promotions that the run above makes from the 24th row on (checked likewise)
TABLE_DELAYED_RUN = {**TABLE_RUN, "scheduler": {**TABLE_RUN["scheduler"], "delayed": True}}
# and with the model fitted at its target fidelity only (`fit_on: target`)
TABLE_TARGET_RUN = {**TABLE_DELAYED_RUN, "controller_options": {**MOBSTER["controller_options"], "fit_on": "target"}}


def _drive(tmp_path: Path, name: str, kill_after: int, run: dict) -> subprocess.CompletedProcess:
    env = {**os.environ, "KILL_AFTER": str(kill_after)}
    return subprocess.run([sys.executable, "-c", DRIVER, str(tmp_path), name, json.dumps(run)], env=env,
                          capture_output=True, text=True, timeout=300)


def _decisions(folder: Path, metric: str) -> list[tuple]:
    return [(r["trial_id"], r["step"], r["status"], round(r[metric], 12), tuple(sorted(r["config"].items())))
            for r in read_rows(folder / "results.jsonl")]


@pytest.mark.slow
@pytest.mark.parametrize("executor, concurrency, run, kill_after", [
    ("local", 1, TOY_RUN, 30), ("simulated", 3, TOY_RUN, 30), ("simulated", 1, TABLE_RUN, 45),
    ("simulated", 1, TABLE_DELAYED_RUN, 45), ("simulated", 1, TABLE_TARGET_RUN, 45)],
    ids=["local-toy", "simulated-toy", "simulated-table-curve", "simulated-table-delayed", "simulated-table-target"])
def test_a_killed_model_based_search_resumes_to_the_same_decisions(toy, tmp_path, executor, concurrency, run,
                                                                   kill_after):
    """Replay rebuilds the model's decisions: every recorded decision is taken again, and every trial keeps the
    config it was proposed with. On one worker the resumed run is the uninterrupted one, row for row; on several
    the trials running at the kill go on from their checkpoints in another order than they would have (for every
    controller), so the later proposals may differ and only the replay is compared. The kill comes past the
    random start (the model has proposed trials and ASHA paused some); on the table, past promotions that the
    curve model decided (`rank_by: curve`, whose model replay rebuilds as well), and past promotions that
    `delayed` held back."""
    run = {**run, "executor": executor, "concurrency": concurrency}
    whole = _drive(tmp_path, "whole", 0, run)
    assert whole.returncode == 0, whole.stderr[-2000:]
    expected = _decisions(tmp_path / "whole", run["metric"])
    killed = _drive(tmp_path, "killed", kill_after, run)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    before = _decisions(tmp_path / "killed", run["metric"])
    assert before == expected[:kill_after]  # the same run up to the kill
    resumed = subprocess.run([str(BIN / "nasplat"), "resume", str(tmp_path / "killed"), "--quiet"], env=os.environ,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "differ" not in resumed.stderr + resumed.stdout  # the replayed model took every recorded decision
    after = _decisions(tmp_path / "killed", run["metric"])
    configs: dict[int, set] = {}
    for row in after:
        configs.setdefault(row[0], set()).add(row[4])
    assert all(len(c) == 1 for c in configs.values()) and len(configs) == run["max_trials"]  # each kept its proposal
    assert len({r[0] for r in after[kill_after:] if r[1] == 1}) >= 5  # the resumed model proposed new trials
    if concurrency == 1:
        assert after == expected  # the same proposals (configs), promotions and decisions, row for row


# -- curve-aware promotion ------------------------------------------------------------------------------------
def _report(scheduler, trial_id, step, score):
    return scheduler.on_result(trial_id, Result({"score": score}, step))


def test_curve_ranking_promotes_by_the_predicted_final_score_not_the_value_at_the_rung():
    """A trial whose score climbs fast ends highest though it is lower at the rung: once four trials of the rung
    have reached the end, `rank_by="curve"` promotes the steep newcomer that `rank_by="value"` passes over."""
    promoted = {}
    for rank_by in ("value", "curve"):
        scheduler = ASHA(RandomSearch({"x": nasplat.Float(0, 1)}, metric="score", seed=0), max_steps=4,
                         grace_period=2, reduction_factor=2, type="promote", rank_by=rank_by)
        # (score at step 2, at step 1); the final score is 0.2 * (score at 2) + 3 * (its change over step 2)
        history = {0: (0.90, 0.80), 1: (0.85, 0.80), 2: (0.80, 0.60), 3: (0.75, 0.75),
                   4: (0.10, 0.10), 5: (0.10, 0.10), 6: (0.10, 0.10), 7: (0.10, 0.10)}
        for trial_id, (at_2, at_1) in history.items():
            scheduler.ask()
            assert _report(scheduler, trial_id, 1, at_1) == nasplat.controllers.CONTINUE
            assert _report(scheduler, trial_id, 2, at_2) == nasplat.controllers.PAUSE
        finished = []
        while (trial_id := scheduler.promote()) is not None:  # the top half by value: too few curves yet
            at_2, at_1 = history[trial_id]
            _report(scheduler, trial_id, 3, at_2)
            _report(scheduler, trial_id, 4, 0.2 * at_2 + 3 * (at_2 - at_1))
            finished.append(trial_id)
        assert finished == [0, 1, 2, 3]
        for trial_id, (at_2, at_1) in {8: (0.65, 0.64), 9: (0.45, 0.30)}.items():  # 8 higher, 9 steeper
            scheduler.ask()
            _report(scheduler, trial_id, 1, at_1)
            _report(scheduler, trial_id, 2, at_2)
        promoted[rank_by] = scheduler.promote()
    assert promoted == {"value": 8, "curve": 9}


def test_curve_ranking_is_refused_where_it_cannot_rank():
    with pytest.raises(ValueError, match="rank_by='curve'.*type='promote'") as info:
        ASHA(RandomSearch({"x": nasplat.Float(0, 1)}, metric="score"), max_steps=9, type="stop", rank_by="curve")
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="rank_by"):
        ASHA(RandomSearch({"x": nasplat.Float(0, 1)}, metric="score"), max_steps=9, rank_by="curves")


def test_curve_ranking_runs_under_hyperband(toy):
    result = nasplat.run(trainer=toy.Curve, space=toy.SPACE, metric="score", executor="simulated", concurrency=3,
                         max_trials=40, max_steps=9, seed=0,
                         scheduler={"name": "hyperband", "type": "promote", "rank_by": "curve"})
    assert max(r["step"] for r in result.rows) == 9 and len({r["trial_id"] for r in result.rows}) == 40


def test_initial_configs_come_first_and_a_bad_one_is_one_line():
    space = {"x": nasplat.Float(0.0, 1.0), "k": nasplat.Choice(["a", "b"])}
    first = [{"x": 0.25, "k": "b"}, {"x": 0.75, "k": "a"}]
    controller = ModelBasedMultiFidelity(space, metric="s", seed=0, initial_configs=first)
    assert [controller.ask().config for _ in range(3)][:2] == first
    with pytest.raises(ValueError, match="x") as info:
        ModelBasedMultiFidelity(space, metric="s", initial_configs=[{"x": 2.0, "k": "a"}])
    assert "\n" not in str(info.value)


# -- warm start -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("scheduler", [None, {"name": "asha", "type": "promote"}])
def test_a_search_warm_started_from_an_earlier_folder_reaches_its_best_in_a_quarter_of_the_trials(tmp_path,
                                                                                               scheduler):
    """On the learning-curve table, trials trained to the end or through ASHA's `promote` rungs: a first search of
    40 trials; a second of 40, warm-started from its folder (its rows feed the model, its incumbents are proposed
    again first and, under a scheduler, trained to the end), reaches the first's best validation accuracy within
    its first 10 trials."""
    from search_spaces.lc_table import space
    from trainers.lc_table import LCTable

    common = dict(trainer=LCTable, space=space, metric="valid_acc", executor="simulated", concurrency=4,
                  max_steps=27, max_trials=40, storage=tmp_path, scheduler=scheduler)
    first = nasplat.run(**common, controller="random", seed=0, name="first")
    best = max(r["valid_acc"] for r in first.rows)
    second = nasplat.run(**common, controller="mobster", seed=1, name="second", warm_start=str(tmp_path / "first"))
    reached = [r["trial_id"] for r in second.rows if r["valid_acc"] >= best]
    assert reached and min(reached) < 10, reached[:3]
    cold = nasplat.run(**common, controller="mobster", seed=1, name="cold")
    assert [r["config"] for r in cold.rows[:1]] != [r["config"] for r in second.rows[:1]]  # the warm start decided
    if scheduler is not None:  # the re-proposed incumbents trained to the end; other trials paused at rungs
        steps: dict[int, int] = {}
        for row in second.rows:
            steps[row["trial_id"]] = max(steps.get(row["trial_id"], 0), row["step"])
        assert [steps[t] for t in range(3)] == [27, 27, 27]
        assert sum(s == 1 for s in steps.values()) > 20


def test_a_trial_proposed_train_to_end_passes_every_rung_and_still_reaches_on_rung(toy):
    """ASHA (`promote`, rungs 1 and 3 below 9) and the median rule never stop or pause a `train_to_end` trial; its
    rungs reach the wrapped controller once each, and no rung records it."""
    from nasplat.controllers import TrialSpec
    from nasplat.schedulers import MedianStopping

    class FirstToEnd(Recording):
        def ask(self):
            spec = super().ask()
            return TrialSpec(spec.trial_id, spec.config, train_to_end=spec.trial_id == 0)

    for make in (lambda c: ASHA(c, max_steps=9, type="promote"), lambda c: MedianStopping(c, min_samples=1)):
        controller = FirstToEnd(toy.SPACE, metric="score", seed=0)
        scheduler = make(controller)
        result = nasplat.run(trainer=toy.Curve, space=toy.SPACE, metric="score", controller=controller,
                             scheduler=scheduler, executor="simulated", concurrency=1, max_trials=12, max_steps=9,
                             seed=0)
        first = [r for r in result.rows if r["trial_id"] == 0]
        assert [r["step"] for r in first] == list(range(1, 10)) and first[-1]["status"] == "completed"
        assert scheduler.unjudged == {0}
        if isinstance(scheduler, ASHA):
            assert [s for t, s in controller.rungs if t == 0] == [1, 3, 9]
            assert all(0 not in rung for rung in scheduler.recorded[0])
            assert any(r["status"] == "paused" for r in result.rows)  # the others were judged


def test_warm_start_from_yaml_and_a_bad_folder_is_one_line(tmp_path, toy):
    from nasplat.experiment.file import read_experiment

    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump({"trainer": "toy_mf:Curve", "space": "toy_mf:SPACE", "metric": "score",
                                    "controller": "mobster", "budget": {"max_trials": 3}, "executor": "simulated",
                                    "warm_start": str(tmp_path / "nowhere")}))
    with pytest.raises(ValueError, match="warm_start") as info:
        read_experiment(path).check()
    assert "\n" not in str(info.value) and "nowhere" in str(info.value)
