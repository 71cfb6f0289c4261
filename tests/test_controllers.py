"""The controller contract, run against every controller, and each algorithm's own behaviour."""

from __future__ import annotations

import math
import pickle
from collections import Counter
from typing import Any

import numpy as np
import optuna
import pytest
from helpers import FACTORIES, METRIC, MIXED, Driver, proposed_configs

from nasplat.controllers import (
    CONTINUE,
    Continue,
    Controller,
    Exploit,
    OptunaSampler,
    PopulationBasedTraining,
    RandomSearch,
    RegularizedEvolution,
    Reinforce,
    Result,
)
from nasplat.space import Choice, Float, Int, Space

NAMES = sorted(FACTORIES)


def _tell(controller: Controller, trial_id: int, score: float) -> None:
    controller.tell(trial_id, Result({METRIC: score}, 1))


# -- the shared contract --------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_proposals_validate(name: str) -> None:
    """Every proposed config (and every exploit config) is valid in the space."""
    events = Driver(FACTORIES[name](seed=0)).rounds(30)
    configs = proposed_configs(events)
    assert len(configs) >= 30 if name != "pbt" else len(configs) >= 4
    for config in configs:
        MIXED.validate(config)


@pytest.mark.parametrize("name", NAMES)
def test_seeded(name: str) -> None:
    """The same seed gives the same proposals; another seed different ones."""
    first = Driver(FACTORIES[name](seed=3)).rounds(20)
    again = Driver(FACTORIES[name](seed=3)).rounds(20)
    other = Driver(FACTORIES[name](seed=4)).rounds(20)
    assert first == again
    assert proposed_configs(first) != proposed_configs(other)


@pytest.mark.parametrize("name", NAMES)
def test_state_dict_round_trip(name: str) -> None:
    """A fresh controller loaded with a mid-run (pickled) state_dict continues exactly as the original does."""
    a = Driver(FACTORIES[name](seed=1), fail_every=7)
    a.rounds(12)
    state = pickle.loads(pickle.dumps(a.controller.state_dict()))
    fresh = FACTORIES[name](seed=1)
    fresh.load_state_dict(state)
    b = a.fork(fresh)
    expected = a.rounds(15)
    assert b.rounds(15) == expected
    assert any(isinstance(e[1], dict) or isinstance(e[2], Exploit) for e in expected)


@pytest.mark.parametrize("name", NAMES)
def test_state_dict_is_a_snapshot(name: str) -> None:
    """A state_dict shares nothing with the controllers it was taken from or loaded into."""
    a = Driver(FACTORIES[name](seed=1))
    a.rounds(8)
    state = a.controller.state_dict()
    b, c = a.fork(FACTORIES[name](seed=1)), a.fork(FACTORIES[name](seed=1))
    expected = a.rounds(10)  # must not leak into `state`
    b.controller.load_state_dict(state)
    assert b.rounds(10) == expected  # must not leak into `state` either
    c.controller.load_state_dict(state)
    assert c.rounds(10) == expected


@pytest.mark.parametrize("name", NAMES)
def test_pickle_round_trip(name: str) -> None:
    """pickle.loads(pickle.dumps(controller)) continues exactly as the original does."""
    a = Driver(FACTORIES[name](seed=2), fail_every=5)
    a.rounds(10)
    b = a.fork(pickle.loads(pickle.dumps(a.controller)))
    expected = a.rounds(12)
    assert b.rounds(12) == expected


@pytest.mark.parametrize("name", NAMES)
def test_failures_recorded_and_search_goes_on(name: str) -> None:
    """Crashed and NaN results are recorded as failed; the controller still proposes valid configs."""
    driver = Driver(FACTORIES[name](seed=0), fail_every=3)
    events = driver.rounds(24)
    controller = driver.controller
    assert len(driver.failed_ids) >= 2 if name == "pbt" else len(driver.failed_ids) == 8
    assert set(controller.failed_trials) == driver.failed_ids
    for config in proposed_configs(events) + proposed_configs(driver.rounds(6)):
        MIXED.validate(config)
    if name != "pbt":
        assert len(proposed_configs(events)) == 24


def test_failed_trials_leave_no_trace_in_the_search() -> None:
    """Failures do not enter evolution's population, REINFORCE's baseline or Optuna's completed trials."""
    evolution = RegularizedEvolution(MIXED, population_size=3, sample_size=2, metric=METRIC, seed=0)
    specs = [evolution.ask() for _ in range(4)]
    evolution.tell(specs[0].trial_id, Result({METRIC: 1.0}))
    evolution.tell(specs[1].trial_id, Result({METRIC: float("nan")}))
    evolution.tell(specs[2].trial_id, Result({METRIC: 5.0}, failed=True, error="OOM"))
    evolution.tell(specs[3].trial_id, Result({"other": 1.0}))
    assert [m[0] for m in evolution.population] == [0]
    assert evolution.failed_trials == [1, 2, 3]

    reinforce = Reinforce({"x": Choice([0, 1, 2])}, metric=METRIC, seed=0)
    spec = reinforce.ask()
    reinforce.tell(spec.trial_id, Result({METRIC: math.inf}))
    assert reinforce.baseline is None and all(np.all(l == 0) for l in reinforce.logits)

    sampler = OptunaSampler(MIXED, sampler=optuna.samplers.RandomSampler(seed=0), metric=METRIC)
    ok, bad = sampler.ask(), sampler.ask()
    _tell(sampler, ok.trial_id, 2.0)
    sampler.tell(bad.trial_id, Result({METRIC: float("nan")}))
    states = [t.state for t in sampler.study.trials]
    assert states == [optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL]
    assert sampler.study.best_value == 2.0


def test_mode_min_flips_the_sign_once() -> None:
    controller = RandomSearch(MIXED, metric="loss", mode="min")
    assert controller.score(Result({"loss": 0.25})) == -0.25
    assert RandomSearch(MIXED, metric="loss").score(Result({"loss": 0.25})) == 0.25
    with pytest.raises(ValueError, match="'median'"):
        RandomSearch(MIXED, metric="loss", mode="median")  # type: ignore[arg-type]


# -- regularized evolution --------------------------------------------------------------------------
def _population(scores: list[float], *, sample_size: int, mode: str = "max", seed: int = 0) -> RegularizedEvolution:
    """An evolution controller whose population holds one member per score, oldest first."""
    controller = RegularizedEvolution(MIXED, population_size=len(scores), sample_size=sample_size, metric=METRIC,
                                      mode=mode, seed=seed)
    specs = [controller.ask() for _ in scores]
    for spec, score in zip(specs, scores):
        _tell(controller, spec.trial_id, score)
    assert [m[0] for m in controller.population] == list(range(len(scores)))
    return controller


def test_evolution_removes_the_oldest_not_the_worst() -> None:
    controller = _population([10.0, 1.0, 2.0, 3.0], sample_size=2)
    child = controller.ask()
    assert child.parent_id is not None
    MIXED.validate(child.config)
    _tell(controller, child.trial_id, 0.0)  # the new worst
    assert [m[0] for m in controller.population] == [1, 2, 3, child.trial_id]
    assert [m[2] for m in controller.population] == [1.0, 2.0, 3.0, 0.0]


def test_evolution_samples_randomly_until_the_population_is_full() -> None:
    controller = RegularizedEvolution(MIXED, population_size=3, sample_size=2, metric=METRIC, seed=0)
    specs = [controller.ask() for _ in range(5)]  # nothing has reported yet: all random
    assert all(s.parent_id is None for s in specs)
    for spec in specs[:2]:
        _tell(controller, spec.trial_id, 1.0)
    assert controller.ask().parent_id is None  # 2 of 3 members: still random
    _tell(controller, specs[2].trial_id, 1.0)
    assert controller.ask().parent_id in {0, 1, 2}


def test_evolution_tournament_of_the_whole_population_picks_the_best() -> None:
    scores = [3.0, 9.0, 1.0, 7.0, 5.0]
    controller = _population(scores, sample_size=len(scores))
    children = [controller.ask() for _ in range(20)]
    assert {c.parent_id for c in children} == {1}
    parent_config = controller.population[1][1]
    for child in children:
        MIXED.validate(child.config)
        assert child.config != parent_config


def test_evolution_tournament_ties_go_to_the_older_member() -> None:
    controller = _population([2.0, 2.0, 2.0], sample_size=3)
    assert {controller.ask().parent_id for _ in range(10)} == {0}


def test_evolution_tournament_distribution() -> None:
    """With scores 0..9 and samples of 3, member k wins with probability C(k, 2) / C(10, 3)."""
    controller = _population([float(k) for k in range(10)], sample_size=3, seed=5)
    n = 6000
    wins = Counter(controller.ask().parent_id for _ in range(n))
    assert wins[0] == wins[1] == 0
    for k in range(2, 10):
        expected = math.comb(k, 2) / math.comb(10, 3)
        assert abs(wins[k] / n - expected) < 0.025, (k, wins[k] / n, expected)


def test_evolution_mode_min_prefers_the_lowest_loss() -> None:
    controller = _population([0.9, 0.1, 0.5], sample_size=3, mode="min")
    assert {controller.ask().parent_id for _ in range(10)} == {1}
    maximise = _population([0.9, 0.1, 0.5], sample_size=3)
    assert {maximise.ask().parent_id for _ in range(10)} == {0}


def test_evolution_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match="sample_size=5.*population_size=4"):
        RegularizedEvolution(MIXED, population_size=4, sample_size=5, metric=METRIC)
    with pytest.raises(ValueError, match="population_size=0"):
        RegularizedEvolution(MIXED, population_size=0, sample_size=1, metric=METRIC)


# -- population based training --------------------------------------------------------------------------
def _pbt(**kwargs: Any) -> PopulationBasedTraining:
    settings = dict(population_size=4, perturbation_interval=3, quantile_fraction=0.25, metric=METRIC, seed=0)
    controller = PopulationBasedTraining(MIXED, **{**settings, **kwargs})
    specs = []
    while (spec := controller.ask()) is not None:
        specs.append(spec)
    assert [s.trial_id for s in specs] == list(range(controller.population_size))
    return controller


def test_pbt_bottom_quantile_exploits_the_top() -> None:
    controller = _pbt()
    decisions = {}
    for step in range(1, 7):
        for member in range(4):  # member 3 is the best, member 0 the worst, at every step
            decisions[step, member] = controller.on_result(member, Result({METRIC: member + 0.1 * step}, step))
    # At step 3 member 0 reports first, alone in the ranking; at step 6 the others are ranked by their step-3 scores.
    for (step, member), decision in decisions.items():
        if (step, member) == (6, 0):
            assert isinstance(decision, Exploit) and decision.donor_id == 3 and decision.donor_step == 3
            MIXED.validate(decision.config)
        else:
            assert decision == CONTINUE, (step, member, decision)
    assert controller.exploits == [(6, 0, 3)]


def test_pbt_ranks_by_perturbation_step_scores_and_copies_the_state_ranked() -> None:
    """Like Ray Tune's PBT: a member is ranked by its score at its latest perturbation step, where its snapshot is,
    and only members ranked there are in the race; the receiver goes on from the donor's step."""
    controller = _pbt(quantile_fraction=0.5, perturbation_interval=3)
    assert controller.on_result(0, Result({METRIC: 0.0}, 3)) == CONTINUE  # alone at a perturbation step: nobody to copy
    for member, score in ((1, 1.0), (2, 2.0), (3, 3.0)):
        assert controller.on_result(member, Result({METRIC: score}, 3)) == CONTINUE  # member 0 holds the bottom
    # Member 3 falls to the bottom at step 4, between perturbation steps: its rank (and state) stay those of step 3.
    assert controller.on_result(3, Result({METRIC: -9.0}, 4)) == CONTINUE
    decision = controller.on_result(0, Result({METRIC: 0.5}, 6))
    assert isinstance(decision, Exploit) and decision.donor_id in (2, 3) and decision.donor_step == 3
    # Member 0 exploited at step 6: it has no snapshot there, so while its step-6 score ranks it in the top half,
    # it is no donor until its next perturbation step.
    assert isinstance(controller.on_result(1, Result({METRIC: -1.0}, 6)), Exploit)
    decision = controller.on_result(2, Result({METRIC: -2.0}, 6))
    assert isinstance(decision, Exploit) and decision.donor_id == 3 and controller.quantiles()[1] == [3]
    assert controller.on_result(0, Result({METRIC: 100.0}, 9)) == CONTINUE and 0 in controller.quantiles()[1]


def test_pbt_exploit_config_is_the_donors_explored() -> None:
    """With resample_probability=0, explore only nudges: floats x0.8 or x1.2, each other decision a neighbour."""
    controller = _pbt(resample_probability=0.0)
    donor = controller.configs[3]
    for member in (1, 2, 3):
        controller.on_result(member, Result({METRIC: float(member)}, 3))
    decision = controller.on_result(0, Result({METRIC: -1.0}, 3))
    assert isinstance(decision, Exploit) and decision.donor_id == 3
    new = decision.config
    MIXED.validate(new)
    ratio = new["lr"] / donor["lr"]
    assert math.isclose(ratio, 0.8) or math.isclose(ratio, 1.2) or new["lr"] in (1e-4, 1e-1)
    ops = MIXED.domains["op"].options
    assert abs(ops.index(new["op"]) - ops.index(donor["op"])) == 1
    assert controller.configs[0] == new and controller.configs[3] == donor


def test_pbt_half_quantile_and_non_interval_steps() -> None:
    controller = _pbt(quantile_fraction=0.5, perturbation_interval=2)
    for step in (1, 2, 3):  # step 2: each member is ranked only among those that reported it before, as in Tune
        assert [controller.on_result(m, Result({METRIC: float(m)}, step)) for m in range(4)] == [CONTINUE] * 4
    fourth = [controller.on_result(m, Result({METRIC: float(m)}, 4)) for m in range(4)]
    assert [type(d) for d in fourth] == [Exploit, Exploit, Continue, Continue]
    assert {fourth[0].donor_id, fourth[1].donor_id} <= {2, 3}


def test_pbt_nan_member_is_exploited_and_never_a_donor() -> None:
    controller = _pbt(quantile_fraction=0.5, perturbation_interval=2)
    for m in range(4):
        controller.on_result(m, Result({METRIC: float(10 * m)}, 2))
    decision = controller.on_result(3, Result({METRIC: float("nan")}, 3))  # the best member diverges: ranked last now
    assert decision == CONTINUE and controller.quantiles() == ([3, 0], [1, 2])
    decision = controller.on_result(3, Result({METRIC: float("nan")}, 4))
    assert isinstance(decision, Exploit) and decision.donor_id in {1, 2}  # the top half of the finite ones
    assert 3 in controller.failed_trials
    later = [controller.on_result(m, Result({METRIC: float(10 * m)}, 4)) for m in range(3)]
    assert all(not isinstance(d, Exploit) or d.donor_id != 3 for d in later)


def test_pbt_step_zero_is_not_a_perturbation_step() -> None:
    controller = _pbt(perturbation_interval=2)
    for m in (1, 2, 3):
        controller.on_result(m, Result({METRIC: float(m)}, 1))
    assert controller.on_result(0, Result({METRIC: -5.0}, 0)) == CONTINUE


def test_pbt_finished_members_are_not_donors() -> None:
    controller = _pbt(perturbation_interval=1)
    for m in range(4):
        controller.on_result(m, Result({METRIC: float(m)}, 1))
    controller.tell(3, Result({METRIC: 3.0}, 1))  # the best member finishes: its state is gone
    assert controller.on_result(3, Result({METRIC: 9.0}, 2)) == CONTINUE  # a late report changes nothing
    decision = controller.on_result(0, Result({METRIC: 0.0}, 2))
    assert isinstance(decision, Exploit) and decision.donor_id == 2


def test_pbt_initial_configs_are_used_and_validated() -> None:
    start = MIXED.sample(np.random.default_rng(0))
    controller = PopulationBasedTraining(MIXED, population_size=2, initial_configs=[start], metric=METRIC)
    assert controller.ask().config == start
    with pytest.raises(ValueError, match="'layers'.*99"):
        PopulationBasedTraining(MIXED, population_size=2, initial_configs=[{**start, "layers": 99}], metric=METRIC)


# -- REINFORCE --------------------------------------------------------------------------
def test_reinforce_learns_the_best_arm_of_a_bandit() -> None:
    rewards = [0.2, 0.5, 0.1, 1.0, 0.4]
    controller = Reinforce({"arm": Choice([0, 1, 2, 3, 4])}, learning_rate=0.1, metric="reward", seed=0)
    assert np.allclose(controller.probabilities()[0], 0.2)
    for _ in range(400):
        spec = controller.ask()
        controller.tell(spec.trial_id, Result({"reward": rewards[spec.config["arm"]]}))
    p = controller.probabilities()[0]
    assert int(np.argmax(p)) == 3 and p[3] > 0.5, p
    assert math.isclose(p.sum(), 1.0)


def test_reinforce_mode_min_learns_the_lowest_loss() -> None:
    losses = [0.9, 0.1, 0.8]
    controller = Reinforce({"arm": Choice(["a", "b", "c"])}, learning_rate=0.2, metric="loss", mode="min", seed=1)
    for _ in range(300):
        spec = controller.ask()
        controller.tell(spec.trial_id, Result({"loss": losses["abc".index(spec.config["arm"])]}))
    p = controller.probabilities()[0]
    assert int(np.argmax(p)) == 1 and p[1] > 0.5, p


def test_reinforce_policy_covers_conditional_positions() -> None:
    controller = Reinforce(MIXED, metric=METRIC)
    assert [len(l) for l in controller.logits] == MIXED.cardinalities()
    spec = controller.ask()
    assert controller.pending[spec.trial_id] and len(controller.pending[spec.trial_id]) == len(controller.logits)


# -- Optuna ----------------------------------------------------------------------------------------
def test_optuna_conditional_branches_with_clashing_names() -> None:
    """Branches may reuse a key with a different domain: Optuna must see them as different parameters."""
    space = Space({"head": Choice([
        {"kind": "a", "act": Choice(["relu", "gelu"]), "width": Int(1, 4)},
        {"kind": "b", "act": Choice(["tanh", "sigmoid", "elu"]), "width": Float(0.5, 2.0)},
    ])})
    controller = OptunaSampler(space, sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=3), metric=METRIC)
    kinds = set()
    for i in range(25):
        spec = controller.ask()
        space.validate(spec.config)
        kinds.add(spec.config["head"]["kind"])
        _tell(controller, spec.trial_id, float(i % 5))
    assert kinds == {"a", "b"}


def test_optuna_tpe_finds_a_good_region() -> None:
    """TPE through nasplat beats its own random start-up trials on a smooth 1-D objective."""
    controller = OptunaSampler({"x": Float(-5.0, 5.0)}, sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=10),
                               metric="loss", mode="min")
    losses = []
    for _ in range(40):
        spec = controller.ask()
        losses.append((spec.config["x"] - 1.0) ** 2)
        controller.tell(spec.trial_id, Result({"loss": losses[-1]}))
    assert min(losses[10:]) < 0.05 and np.median(losses[30:]) < np.median(losses[:10])
    assert controller.study.best_value == -min(losses)


def test_unknown_trial_ids_are_ignored() -> None:
    for name in ("evolution", "reinforce", "optuna_random"):
        controller = FACTORIES[name](seed=0)
        _tell(controller, 12345, 1.0)
        assert controller.ask().trial_id == 0
