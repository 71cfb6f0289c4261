"""Several objectives end to end: controllers, constraints, results, YAML, `nasplat status`, report, cost metrics."""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import optuna
import pandas as pd
import pytest
import torch
from helpers import COST, FACTORIES, METRIC, MIXED, MO, Driver

import nasplat
from nasplat.cli import main as cli
from nasplat.controllers import (
    MultiObjectiveEvolution,
    OptunaSampler,
    PopulationBasedTraining,
    RandomSearch,
    RegularizedEvolution,
    Reinforce,
    Result,
)
from nasplat.core import pareto
from nasplat.experiment.file import experiment_kwargs
from nasplat.report.sections import build_report, hypervolume_progress

NB201_METRICS, NB201_MODES = ["valid_acc", "params_mb"], ["max", "min"]


# -- controllers ----------------------------------------------------------------------------------
@pytest.mark.parametrize("controller", [RegularizedEvolution, PopulationBasedTraining, Reinforce])
def test_single_objective_controllers_refuse_several_objectives(controller: type) -> None:
    with pytest.raises(ValueError, match=r"one metric.*\['score', 'cost'\].*mo_evolution"):
        controller(MIXED, metric=[METRIC, COST], mode=["max", "min"])
    with pytest.raises(ValueError, match=r"constraints=\['cost <= 1'\]"):
        controller(MIXED, metric=METRIC, constraints="cost <= 1")


def test_objectives_are_maximised_vectors_and_bad_objectives_are_named() -> None:
    controller = RandomSearch(MIXED, **MO)
    assert controller.metrics == (METRIC, COST) and controller.modes == ("max", "min")
    assert (controller.metric, controller.mode) == (METRIC, "max")
    vector, violation = controller.objectives(Result({METRIC: 2.0, COST: 50.0}))
    assert vector.tolist() == [2.0, -50.0] and violation == 10.0
    assert controller.objectives(Result({METRIC: 2.0})) is None  # a missing objective is a failure
    with pytest.raises(ValueError, match=r"one per metric.*mode=\['max'\]"):
        RandomSearch(MIXED, metric=[METRIC, COST], mode=["max"])
    with pytest.raises(ValueError, match="constraint must read.*'cost < 3'"):
        RandomSearch(MIXED, metric=METRIC, constraints=["cost < 3"])


def _population(members: list[tuple[float, float]], **kwargs: object) -> MultiObjectiveEvolution:
    """An MO evolution controller whose population holds one member per (score, cost), oldest first."""
    controller = MultiObjectiveEvolution(MIXED, population_size=len(members), sample_size=len(members),
                                         metric=[METRIC, COST], mode=["max", "min"], **kwargs)
    specs = [controller.ask() for _ in members]
    for spec, (score, cost) in zip(specs, members):
        controller.tell(spec.trial_id, Result({METRIC: score, COST: cost}))
    return controller


def test_mo_evolution_tournament_ranks_fronts_crowding_and_constraints() -> None:
    """0 is dominated by 1; 1, 2, 3 form the front; 2 and 3 are its extremes (infinite crowding, 2 older)."""
    members = [(1.0, 5.0), (2.0, 4.0), (3.0, 10.0), (0.0, 1.0)]
    assert {_population(members).ask().parent_id for _ in range(10)} == {2}
    # 2 breaks `cost <= 8`: the feasible front is 1 and 3, both extremes, 1 older; 2 now ranks last.
    bounded = _population(members, constraints=["cost <= 8"])
    assert {bounded.ask().parent_id for _ in range(10)} == {1}
    assert bounded.member_ranks() == [-2.0, -0.0, -3.0, -1.0]


def test_mo_evolution_removes_the_oldest_member_not_the_worst() -> None:
    controller = _population([(3.0, 1.0), (0.0, 9.0), (1.0, 5.0)])
    child = controller.ask()
    controller.tell(child.trial_id, Result({METRIC: -1.0, COST: 99.0}))  # dominated by everyone
    assert [m[0] for m in controller.population] == [1, 2, child.trial_id]
    assert controller.population[-1][2].tolist() == [-1.0, -99.0]


def test_optuna_gets_one_direction_per_objective_and_the_constraints() -> None:
    driver = Driver(FACTORIES["mo_optuna_nsga2"](seed=0))
    driver.rounds(40)
    study = driver.controller.study
    assert study.directions == [optuna.study.StudyDirection.MAXIMIZE] * 2
    completed = study.get_trials(states=[optuna.trial.TrialState.COMPLETE])
    over = [t for t in completed if -t.values[1] > 40]
    assert over, "this seeded search proposes configs that break `cost <= 40`"
    assert {t.system_attrs["constraints:cost <= 40"] > 0 for t in completed} == {True, False}
    assert study.best_trials and all(-t.values[1] <= 40 for t in study.best_trials)  # Optuna's feasible front
    assert OptunaSampler(MIXED, sampler="nsga2", **MO).study.sampler.__class__ is optuna.samplers.NSGAIISampler
    with pytest.raises(ValueError, match="unknown Optuna sampler 'cmaes'"):
        OptunaSampler(MIXED, sampler="cmaes", metric=METRIC)


# -- NAS-Bench-201 end to end ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def nb201_experiment(tmp_path_factory: pytest.TempPathFactory, shared_data: Path) -> Path:
    """MO evolution under `params_mb <= 0.5` on the simulated executor, from an experiment mapping (as YAML)."""
    storage = tmp_path_factory.mktemp("mo")
    kwargs = experiment_kwargs({
        "name": "mo", "trainer": "trainers.nb201_table:NB201Table", "space": "search_spaces.nb201:space",
        "metric": NB201_METRICS, "mode": NB201_MODES, "constraints": ["params_mb <= 0.5"],
        "controller": {"name": "mo_evolution", "population_size": 10, "sample_size": 5},
        "budget": {"time_budget_s": 8000}, "executor": "simulated", "storage": str(storage), "seed": 3})
    result = nasplat.run(**kwargs)
    assert [str(c) for c in result.constraints] == ["params_mb <= 0.5"] and result.metrics == tuple(NB201_METRICS)
    return storage / "mo"


def test_front_is_feasible_non_dominated_and_survives_loading(nb201_experiment: Path) -> None:
    meta = json.loads((nb201_experiment / "meta.json").read_text())
    assert (meta["metric"], meta["mode"], meta["constraints"]) == (NB201_METRICS, NB201_MODES, ["params_mb <= 0.5"])
    result = nasplat.ExperimentResult.load(nb201_experiment)
    front = result.pareto_front()
    trials = pareto.trial_rows(result.rows, NB201_METRICS)
    feasible = [r for r in trials if r["params_mb"] <= 0.5]
    assert len(trials) > 50 and front and len(feasible) < len(trials)
    assert all(r["params_mb"] <= 0.5 for r in front)
    unconstrained = pareto.front_rows(result.rows, NB201_METRICS, NB201_MODES)
    assert any(r["params_mb"] > 0.5 for r in unconstrained), "the bound must cut the unconstrained front"
    points = np.array([[r["valid_acc"], -r["params_mb"]] for r in feasible])
    expected = {feasible[i]["trial_id"] for i in np.flatnonzero(pareto.non_dominated_mask(points))}
    assert {r["trial_id"] for r in front} == expected
    assert [r["valid_acc"] for r in front] == sorted((r["valid_acc"] for r in front), reverse=True)
    # The hypervolume from (valid_acc 50, params_mb 0.5): the staircase of the front, summed by hand.
    steps = sorted((r["valid_acc"] - 50.0, 0.5 - r["params_mb"]) for r in front)[::-1]
    by_hand = sum(x * (y - below) for (x, y), below in zip(steps, [0.0] + [y for _, y in steps[:-1]]))
    assert result.hypervolume([50.0, 0.5]) == pytest.approx(by_hand)
    with pytest.raises(ValueError, match="one value per metric"):
        result.hypervolume([50.0])
    ranked = [r["params_mb"] <= 0.5 for r in result.ranked()]  # by valid_acc, constraint breakers last
    assert ranked == sorted(ranked, reverse=True) and result.best["params_mb"] <= 0.5
    assert max(r["valid_acc"] for r in trials) > result.best["valid_acc"]


def test_yaml_objectives_and_constraints_are_checked_by_name() -> None:
    spec = {"trainer": "trainers.nb201_table:NB201Table", "space": "search_spaces.nb201:space",
            "metric": NB201_METRICS, "mode": NB201_MODES, "controller": "mo_evolution", "budget": {"max_trials": 2}}
    assert experiment_kwargs({**spec, "constraints": ["params_mb <= 1"]})["constraints"] == ["params_mb <= 1"]
    with pytest.raises(ValueError, match=r"^exp\.yaml: a constraint must read .*got 'params_mb < 1'"):
        experiment_kwargs({**spec, "constraints": ["params_mb < 1"]}, source="exp.yaml")
    with pytest.raises(ValueError, match=r"^exp\.yaml: `mode` must be .*one per metric; got mode=\['max'\]"):
        experiment_kwargs({**spec, "mode": ["max"]}, source="exp.yaml")


def test_yaml_file_through_nasplat_run(tmp_path: Path, shared_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "mo.yaml"
    path.write_text(f"""
name: mo
trainer: trainers.nb201_table:NB201Table
space: search_spaces.nb201:space
metric: [valid_acc, train_s_per_epoch]
mode: [max, min]
constraints: ["params_mb <= 0.4"]
controller: {{name: optuna, sampler: nsga2}}
budget: {{max_trials: 30}}
executor: simulated
storage: {tmp_path}
""")
    assert cli(["run", str(path), "--quiet"]) == 0
    out = capsys.readouterr().out
    result = nasplat.ExperimentResult.load(tmp_path / "mo")
    assert result.metrics == ("valid_acc", "train_s_per_epoch") and result.counts() == {"completed": 30}
    front = result.pareto_front()
    assert f"Pareto front under params_mb <= 0.4: {len(front)} trials" in out
    assert front and all(r["params_mb"] <= 0.4 for r in front)


def test_status_shows_the_front(nb201_experiment: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["status", str(nb201_experiment)]) == 0
    out = capsys.readouterr().out
    front = nasplat.ExperimentResult.load(nb201_experiment).pareto_front()
    assert "metric valid_acc (max), params_mb (min)" in out
    assert f"Pareto front under params_mb <= 0.5: {len(front)} trials" in out
    listed = [int(line.split()[0]) for line in out.splitlines()[4:]]
    assert listed == [r["trial_id"] for r in front]


def test_report_draws_the_front_and_the_hypervolume(nb201_experiment: Path) -> None:
    page = build_report(nb201_experiment).read_text()
    part = page.split("<section id='pareto'>", 1)[1].split("</section>", 1)[0]
    front = nasplat.ExperimentResult.load(nb201_experiment).pareto_front()
    assert 'aria-label="pareto-front"' in part and 'aria-label="hypervolume"' in part
    assert f"red: the {len(front)} trials of the Pareto front" in part and "params_mb &lt;= 0.5" in part
    result = nasplat.ExperimentResult.load(nb201_experiment)
    rows = sorted(pareto.trial_rows(result.rows, NB201_METRICS), key=lambda r: (r["end"], r["trial_id"]))
    trials = pd.DataFrame([{**{m: r[m] for m in NB201_METRICS}, "end": r["end"], "feasible": r["params_mb"] <= 0.5}
                           for r in rows])
    curve = hypervolume_progress(trials, NB201_METRICS, NB201_MODES, [60.0, 0.5], curve_points=15)
    assert len(curve) == 15 and curve["n_trials"].iloc[-1] == len(rows) and curve["end"].is_monotonic_increasing
    assert curve["hypervolume"].is_monotonic_increasing and curve["hypervolume"].iloc[0] < curve["hypervolume"].iloc[-1]
    assert curve["hypervolume"].iloc[-1] == pytest.approx(result.hypervolume([60.0, 0.5]))
    middle = int(curve["n_trials"].iloc[7])
    assert curve["hypervolume"].iloc[7] == pytest.approx(
        pareto.rows_hypervolume(rows[:middle], NB201_METRICS, NB201_MODES, [60.0, 0.5], result.constraints))


def test_mo_evolution_beats_random_search_on_nb201_front_hypervolume(shared_data: Path) -> None:
    """Ten seeded searches each (a small version of benchmarks/nb201_mo.py, scored on validation accuracy)."""
    def volume(controller: str, seed: int, options: dict[str, int]) -> float:
        result = nasplat.run(trainer="trainers.nb201_table:NB201Table", space="search_spaces.nb201:space",
                             controller=controller, controller_options=options, metric=NB201_METRICS,
                             mode=NB201_MODES, executor="simulated", time_budget_s=12_000, seed=seed)
        return result.hypervolume([70.0, 1.6])

    evolution = [volume("mo_evolution", s, {"population_size": 20, "sample_size": 10}) for s in range(10)]
    random = [volume("random", s, {}) for s in range(10)]
    assert np.mean(evolution) > np.mean(random) + 2 * np.std(random, ddof=1) / np.sqrt(10), (evolution, random)


# -- cost metrics ------------------------------------------------------------------------------------------
def test_nb201_table_reports_parameters_and_epoch_time(shared_data: Path) -> None:
    from search_spaces.nb201 import from_arch_str
    from trainers.nb201_table import NB201Table

    frame = pd.read_csv(shared_data / "nb201.csv")
    row = frame.iloc[1]
    trainer = NB201Table()
    trainer.setup(from_arch_str(row["arch"]), nasplat.WorkerContext())
    metrics = trainer.step()
    assert metrics["params_mb"] == pytest.approx(row["params_mb"])
    assert metrics["train_s_per_epoch"] == pytest.approx(row["cifar10_train_s_per_epoch"])


def test_cnn_inference_cost_counts_parameters_and_times_a_forward_pass() -> None:
    from trainers.classification import inference_cost

    net = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU(), torch.nn.Linear(2, 1))  # 8 + 3 parameters
    net.train()
    cost = inference_cost(net, torch.zeros(1, 3))
    assert cost["params"] == 11.0 and 0.0 < cost["latency_ms"] < 1000.0
    assert net.training, "the network goes back to training mode"


def test_pareto_example_prints_and_draws_a_feasible_front(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, str(root / "examples" / "pareto.py"), "--storage", str(tmp_path),
                           "--trials", "8"], capture_output=True, text=True, timeout=300, cwd=root)
    assert done.returncode == 0, done.stderr[-3000:]
    folder = tmp_path / "pareto-local-0"
    result = nasplat.ExperimentResult.load(folder)
    printed = [int(m) for m in re.findall(r"^  trial\s+(\d+):", done.stdout, flags=re.MULTILINE)]
    feasible = [r for r in pareto.trial_rows(result.rows, ["valid_acc", "latency_ms"]) if r["params"] <= 50_000]
    points = np.array([[r["valid_acc"], -r["latency_ms"]] for r in feasible])
    assert sorted(printed) == sorted(feasible[i]["trial_id"] for i in np.flatnonzero(pareto.non_dominated_mask(points)))
    assert max(r["valid_acc"] for r in result.pareto_front()) >= 0.9
    png = (folder / "pareto.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", png[16:24]) == (720, 480)
