"""The predictor, local search, REINFORCE's update and the tabular example (the contract is in test_controllers)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import METRIC

from nasplat.controllers import LocalSearch, Predictor, Reinforce, Result
from nasplat.controllers.surrogate.encoding import Encoder
from nasplat.controllers.surrogate.ensemble import MLPEnsemble
from nasplat.space import Choice, Config, Float, Int, Space
from nasplat.space.domains import config_key

REPO = Path(__file__).resolve().parents[1]

# A 6-decision categorical space like NAS-Bench-201's cell, with an additive score plus one interaction.
CELL = Space({f"e{i}": Choice(["a", "b", "c", "d", "e"]) for i in range(6)})
_WEIGHTS = np.random.default_rng(7).normal(size=(6, 5))


def cell_score(config: Config) -> float:
    tokens = CELL.encode(config)
    return float(sum(_WEIGHTS[i, t] for i, t in enumerate(tokens)) + (1.5 if tokens[0] == tokens[1] else 0.0))


ALL_CELLS = [dict(zip(CELL.domains, ops)) for ops in itertools.product("abcde", repeat=6)]
BEST = max(cell_score(c) for c in ALL_CELLS)


def _run(controller, rounds: int, score=cell_score) -> list[float]:
    scores = []
    for _ in range(rounds):
        spec = controller.ask()
        scores.append(score(spec.config))
        controller.tell(spec.trial_id, Result({METRIC: scores[-1]}))
    return scores


# -- REINFORCE ------------------------------------------------------------------------------------------------
def test_reinforce_applies_the_learning_rate_exactly() -> None:
    """Hand-computed: the first reward only sets the baseline; the second moves the logits by
    lr * (reward - old baseline) * (onehot - p), and only then does the baseline take the reward in."""
    controller = Reinforce({"x": Choice([0, 1, 2])}, learning_rate=0.5, baseline_decay=0.9, metric=METRIC, seed=0)
    first = controller.ask()
    controller.tell(first.trial_id, Result({METRIC: 1.0}))
    assert controller.baseline == 1.0 and np.array_equal(controller.logits[0], np.zeros(3))
    second = controller.ask()
    token = second.config["x"]
    controller.tell(second.trial_id, Result({METRIC: 3.0}))
    expected = 0.5 * (3.0 - 1.0) * (np.eye(3)[token] - 1 / 3)  # p was uniform
    np.testing.assert_allclose(controller.logits[0], expected, rtol=0, atol=1e-12)
    assert controller.baseline == pytest.approx(0.9 * 1.0 + 0.1 * 3.0)


# -- the predictor --------------------------------------------------------------------------------------------
def test_encoder_one_hot_numbers_and_inactive_branches() -> None:
    space = Space({"op": Choice(["x", "y"]), "lr": Float(1e-4, 1e-1, log=True), "n": Int(1, 5), "fixed": 3,
                   "head": Choice([{"kind": "linear"}, {"kind": "mlp", "width": Int(1, 9)}])})
    encoder = Encoder(space)
    assert encoder.size == 2 + 1 + 1 + 2 + 1
    linear = encoder.encode({"op": "y", "lr": 1e-2, "n": 5, "fixed": 3, "head": {"kind": "linear"}})
    mlp = encoder.encode({"op": "x", "lr": 1e-4, "n": 1, "fixed": 3, "head": {"kind": "mlp", "width": 5}})
    np.testing.assert_allclose(linear, [0, 1, 2 / 3, 1, 1, 0, 0], atol=1e-6)
    np.testing.assert_allclose(mlp, [1, 0, 0, 0, 0, 1, 0.5], atol=1e-6)


def test_predictor_model_ranks_unseen_configs() -> None:
    """After 120 results the ensemble's mean ranks 500 unseen cells with Spearman correlation > 0.7."""
    controller = Predictor(CELL, initial_samples=120, metric=METRIC, seed=0)
    _run(controller, 120)
    controller._fit()
    controller.model.fit(controller.features, np.sort(controller.scores), steps=0, batch_size=1, rng=controller.rng)
    rng = np.random.default_rng(1)
    unseen = [c for c in (ALL_CELLS[i] for i in rng.permutation(len(ALL_CELLS))[:700])
              if config_key(c) not in controller.seen][:500]
    predicted = controller.model.predict(controller.encoder.encode_many(unseen)).mean(axis=0)
    truth = np.array([cell_score(c) for c in unseen])
    spearman = np.corrcoef(np.argsort(np.argsort(predicted)), np.argsort(np.argsort(truth)))[0, 1]
    assert spearman > 0.7


@pytest.mark.slow
def test_predictor_beats_random_search_at_equal_trials() -> None:
    """Best of 50 trials, over 4 seeds: the predictor finds better cells than random search (15,625 cells)."""
    from nasplat.controllers import RandomSearch

    ours = [max(_run(Predictor(CELL, metric=METRIC, seed=s), 50)) for s in range(4)]
    theirs = [max(_run(RandomSearch(CELL, metric=METRIC, seed=s), 50)) for s in range(4)]
    assert np.mean(ours) > np.mean(theirs)
    assert sum(o == BEST for o in ours) >= 2


def test_predictor_with_pending_trials_never_proposes_a_config_twice() -> None:
    """Eight workers: eight asks before any result, then one result and one ask at a time; all distinct."""
    controller = Predictor(CELL, initial_samples=4, metric=METRIC, seed=3)
    running = [controller.ask() for _ in range(8)]
    proposed = [config_key(s.config) for s in running]
    for _ in range(40):
        done = running.pop(0)
        controller.tell(done.trial_id, Result({METRIC: cell_score(done.config)}))
        running.append(controller.ask())
        proposed.append(config_key(running[-1].config))
    assert len(set(proposed)) == len(proposed) == 48
    assert set(controller.pending) == {s.trial_id for s in running}


def test_ensemble_gradients_match_finite_differences() -> None:
    """The hand-written backward pass against central differences, in float64, for every parameter tensor."""
    rng = np.random.default_rng(0)
    model = MLPEnsemble(7, members=3, hidden=5, rng=rng, learning_rate=0.01, weight_decay=0.0)
    model.params = [p.astype(np.float64) for p in model.params]
    x, y = rng.normal(size=(3, 9, 7)), rng.normal(size=(3, 9))
    _, grads = model.gradients(x, y)
    for param, grad in zip(model.params, grads):
        for flat in rng.choice(param.size, size=min(param.size, 4), replace=False):
            index = np.unravel_index(flat, param.shape)
            old = param[index]
            param[index] = old + 1e-6
            above = model.gradients(x, y)[0]
            param[index] = old - 1e-6
            below = model.gradients(x, y)[0]
            param[index] = old
            assert grad[index] == pytest.approx((above - below) / 2e-6, rel=1e-5, abs=1e-9)


def test_ensemble_fit_lowers_the_loss_and_members_disagree_off_the_data() -> None:
    rng = np.random.default_rng(1)
    features = rng.integers(0, 2, (60, 10)).astype(np.float32)
    targets = features @ rng.normal(size=10)
    model = MLPEnsemble(10, members=4, hidden=16, rng=rng, learning_rate=0.01, weight_decay=0.0)
    before = float(((model.predict(features) - targets) ** 2).mean())
    model.fit(features, targets, steps=300, batch_size=32, rng=rng)
    after = float(((model.predict(features) - targets) ** 2).mean())
    assert after < 0.1 * before
    assert model.predict(features).shape == (4, 60) and model.predict(features).std(axis=0).max() > 0


def _stuck_run(patience: int | None, rounds: int) -> tuple[Predictor, list[Config]]:
    """The first config scores 1, every later one 0: the first climb's best never improves."""
    controller = Predictor(CELL, initial_samples=4, patience=patience, pool_size=50, metric=METRIC, seed=5)
    proposed = []
    for round_ in range(rounds):
        spec = controller.ask()
        proposed.append(spec.config)
        controller.tell(spec.trial_id, Result({METRIC: 1.0 if round_ == 0 else 0.0}))
    return controller, proposed


def test_predictor_restarts_after_patience_results_without_improvement() -> None:
    """Scripted: the best comes first, then 6 results fail to beat it (patience 6): a restart. The next climb
    has no parents, so its first proposal comes from the random pool, and the old best is no parent of it."""
    controller, proposed = _stuck_run(patience=6, rounds=6)
    assert controller.climb == 0 and controller.stale == 5 and len(controller.climb_members) == 6
    spec = controller.ask()
    controller.tell(spec.trial_id, Result({METRIC: 0.0}))
    assert controller.climb == 1 and controller.climb_members == [] and controller.stale == 0
    pool_keys = set(controller.pool[0])
    candidates, rows = controller.candidates()
    assert {config_key(c) for c in candidates} == pool_keys and rows.shape == (len(pool_keys), controller.encoder.size)
    follow = controller.ask()
    assert config_key(follow.config) in pool_keys
    controller.tell(follow.trial_id, Result({METRIC: 0.0}))
    assert controller.climb_members == [len(controller.scores) - 1]  # the new climb's first member
    assert len({config_key(c) for c in proposed}) == len(proposed)


def test_predictor_without_patience_never_restarts() -> None:
    controller, _ = _stuck_run(patience=None, rounds=30)
    assert controller.climb == 0 and controller.stale == 29 and len(controller.climb_members) == 30


@pytest.mark.parametrize("option, value", [("ensemble_size", 1), ("initial_samples", 0), ("learning_rate", 0.0),
                                           ("num_parents", 2.5), ("mutations", -1), ("pool_size", -1),
                                           ("patience", 0)])
def test_predictor_rejects_bad_options(option: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"`{option}` must be"):
        Predictor(CELL, metric=METRIC, **{option: value})


# -- local search ---------------------------------------------------------------------------------------------
def test_local_search_moves_on_the_first_improvement() -> None:
    """Once a neighbour beats the centre, the next proposals are neighbours of that neighbour."""
    controller = LocalSearch(CELL, initial_samples=1, metric=METRIC, seed=0)
    start = controller.ask()
    controller.tell(start.trial_id, Result({METRIC: cell_score(start.config)}))
    while True:
        spec = controller.ask()
        assert spec.parent_id == controller.centre[0]
        centre_config = controller.centre[1]
        assert sum(spec.config[k] != centre_config[k] for k in CELL.domains) == 1
        better = cell_score(spec.config) > controller.centre[2]
        controller.tell(spec.trial_id, Result({METRIC: cell_score(spec.config)}))
        if better:
            assert controller.centre[0] == spec.trial_id and controller.moves == 1
            follow = controller.ask()
            assert follow.parent_id == spec.trial_id
            return


def test_local_search_climbs_to_a_local_optimum_then_restarts() -> None:
    """On an additive score (one optimum, no traps), a climb ends at the best cell; then a restart follows."""
    def additive(config: Config) -> float:
        return float(sum(_WEIGHTS[i, t] for i, t in enumerate(CELL.encode(config))))

    controller = LocalSearch(CELL, initial_samples=1, metric=METRIC, seed=2)
    scores = _run(controller, 150, additive)
    assert max(scores) == max(additive(c) for c in ALL_CELLS)
    assert controller.climb >= 1 and len({config_key(c) for c in controller.seen}) == 150


def test_local_search_never_repeats_in_a_tiny_space() -> None:
    controller = LocalSearch({"x": Choice([0, 1, 2]), "y": Choice(["a", "b"])}, initial_samples=2, metric=METRIC)
    values = [controller.ask() for _ in range(6)]
    assert len({config_key(s.config) for s in values}) == 6


# -- the tabular example --------------------------------------------------------------------------------------
def test_tabular_example_finds_the_best_entry_in_simulated_time() -> None:
    out = subprocess.run([sys.executable, "examples/tabular.py"], capture_output=True, text=True, check=True,
                         cwd=REPO, timeout=120).stdout
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["best_accuracy"] == summary["table_best"]
    assert summary["trials"] < 47  # fewer lookups than the table has entries
    assert summary["simulated_s"] >= 1_000.0  # the budget counted simulated seconds, not wall time
    assert summary["best_config"] == {"width": 128, "depth": 2, "op": "conv"}
