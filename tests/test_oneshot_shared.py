"""Searches over one trained supernet whose weights are shared, not copied per trial (< 60 s)."""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
import pytest

import nasplat
import nasplat.oneshot.reference as by_reference
import nasplat.oneshot.shared as shared
import nasplat.storage.checkpoints as checkpoints
from nasplat.controllers import CONTROLLERS
from nasplat.oneshot import PROXIES, ProxyFeatures, SharedWeights, evaluate_path, search_trainer
from nasplat.trainer import WorkerContext, start
from search_spaces import nb201
from trainers.supernet import NB201PathTrainer, NB201ProxyTrainer, NB201SupernetTrainer

SUPERNET = {"channels": 4, "train_size": 640, "epochs": 2, "eval_paths": 1}


@pytest.fixture(scope="module")
def supernet() -> NB201SupernetTrainer:
    trainer = start(NB201SupernetTrainer(), SUPERNET, WorkerContext(seed=0))
    for _ in range(2):
        trainer.step()
    return trainer


@pytest.fixture(scope="module")
def weights(supernet: NB201SupernetTrainer) -> SharedWeights:
    return SharedWeights(supernet.state_dict())


def tensor_key(weights: SharedWeights) -> str:
    return max(weights.arrays, key=lambda k: weights.arrays[k].size)  # the largest tensor: a convolution's


class Probe(NB201PathTrainer):
    """Reports where its supernet's tensors live: the address of one, and the shared handle's object id."""

    def step(self) -> dict[str, Any]:
        key = tensor_key(self.weights)
        tensor = self.net.state_dict()[key]
        return {**super().step(), "ptr": float(tensor.data_ptr()),
                "writable": float(self.weights.arrays[key].flags.writeable),
                "shares": float(tensor.data_ptr() == self.weights.arrays[key].ctypes.data),
                "ref": self.weights.ref.hex() if self.weights.ref is not None else ""}


def reference(supernet: NB201SupernetTrainer, config: dict[str, Any]) -> float:
    return evaluate_path(supernet.net, config, supernet.data, splits=supernet.splits)["valid_acc"]


def single_objective(name: str, options: dict[str, Any]) -> bool:
    try:
        CONTROLLERS.lookup(name)(nb201.space, metric="valid_acc", mode="max", **options)
    except ValueError:
        return False
    return True


OPTIONS: dict[str, dict[str, Any]] = {"pbt": {"population_size": 2}, "evolution": {"population_size": 3,
                                                                                   "sample_size": 2}}


@pytest.mark.parametrize("name", list(CONTROLLERS))
def test_every_single_objective_controller_searches_the_shared_supernet(
        name: str, supernet: NB201SupernetTrainer, weights: SharedWeights) -> None:
    options = OPTIONS.get(name, {})
    if not single_objective(name, options):
        pytest.skip(f"{name} needs several objectives")
    trainer = search_trainer(NB201PathTrainer, weights, SUPERNET)
    result = nasplat.run(trainer=trainer, space=nb201.space, metric="valid_acc", mode="max", controller=name,
                         controller_options=options, max_trials=5, max_steps=1, seed=1,
                         concurrency=2 if name == "pbt" else 1)
    rows = [r for r in result.rows if "valid_acc" in r]
    assert len({r["trial_id"] for r in rows}) >= 2, result.rows
    for row in rows:
        path = {k: row["config"][k] for k in nb201.EDGES}
        assert row["valid_acc"] == reference(supernet, path), (name, path)
        assert row["status"] == "completed" and row["params"] > 0 and row["eval_ms"] > 0 and "test_acc" in row


def test_a_constrained_space_never_evaluates_a_forbidden_path(weights: SharedWeights) -> None:
    trainer = search_trainer(NB201PathTrainer, weights, {**SUPERNET, "connected": True})  # its paths: connected
    result = nasplat.run(trainer=trainer, space=nb201.connected_space, metric="valid_acc", controller="evolution",
                         controller_options={"population_size": 4, "sample_size": 2}, max_trials=16, seed=3)
    rows = [r for r in result.rows if "valid_acc" in r]
    assert len(rows) == 16
    for row in rows:
        nb201.connected_space.validate(row["config"])
        assert not nb201.cut_off(row["config"])
    with pytest.raises(ValueError, match="no path from input"):  # and a trial handed one refuses it
        start(trainer(), {e: "none" for e in nb201.EDGES}, WorkerContext())


def test_report_test_false_judges_the_same_path_without_its_test_split(
        supernet: NB201SupernetTrainer, weights: SharedWeights) -> None:
    path = nb201.space.sample(np.random.default_rng(5))
    full = start(search_trainer(NB201PathTrainer, weights, SUPERNET)(), path, WorkerContext()).step()
    lean = start(search_trainer(NB201PathTrainer, weights, {**SUPERNET, "report_test": False})(), path,
                 WorkerContext()).step()
    assert "test_acc" in full and "test_acc" not in lean and "test_loss" not in lean
    assert lean["valid_acc"] == full["valid_acc"] == reference(supernet, path)
    with pytest.raises(ValueError, match=r"`report_test` must be true or false, got report_test='no'"):
        start(search_trainer(NB201PathTrainer, weights, {**SUPERNET, "report_test": "no"})(), path, WorkerContext())


def test_trials_of_one_search_class_reuse_its_loaded_supernet_in_a_process(
        supernet: NB201SupernetTrainer, weights: SharedWeights) -> None:
    trainer = search_trainer(NB201PathTrainer, weights, SUPERNET)
    first, second = (nb201.space.sample(np.random.default_rng(seed)) for seed in (6, 7))
    a, b = start(trainer(), first, WorkerContext()), start(trainer(), second, WorkerContext())
    assert a.net is b.net  # built and loaded once
    assert b.step()["valid_acc"] == reference(supernet, second) and a.step()["valid_acc"] == reference(supernet, first)
    other = start(trainer(), {**first, "bn_batches": 2}, WorkerContext())  # other settings: a supernet of its own
    assert other.net is not a.net
    assert start(search_trainer(NB201PathTrainer, weights, SUPERNET)(), first, WorkerContext()).net is not a.net


def test_forked_workers_read_the_drivers_tensors_and_nothing_from_disk(
        supernet: NB201SupernetTrainer, weights: SharedWeights, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_disk(uri: str) -> Any:
        raise AssertionError(f"a trial loaded {uri}")

    for module in (checkpoints, shared, by_reference):  # inherited by the forked workers
        monkeypatch.setattr(module, "load_checkpoint", no_disk)
    trainer = search_trainer(Probe, weights, SUPERNET)
    result = nasplat.run(trainer=trainer, space=nb201.space, metric="valid_acc", executor="processes",
                         concurrency=2, max_trials=4, seed=2)
    rows = [r for r in result.rows if "valid_acc" in r]
    assert len(rows) == 4 and {r["status"] for r in rows} == {"completed"}
    assert len({r["pid"] for r in rows} - {os.getpid()}) >= 1  # run in other processes
    address = float(weights.arrays[tensor_key(weights)].ctypes.data)
    assert {r["ptr"] for r in rows} == {address}  # the driver's pages, inherited by fork: no copy per trial
    assert all(r["writable"] == 0.0 and r["shares"] == 1.0 for r in rows)
    for row in rows:
        assert row["valid_acc"] == reference(supernet, {k: row["config"][k] for k in nb201.EDGES})


def test_on_ray_the_weights_are_put_in_the_object_store_once(
        ray_session: str, supernet: NB201SupernetTrainer) -> None:
    weights = SharedWeights(supernet.state_dict())  # a fresh one: its puts are this test's
    trainer = search_trainer(Probe, weights, SUPERNET)
    result = nasplat.run(trainer=trainer, space=nb201.space, metric="valid_acc", executor="ray", concurrency=2,
                         max_trials=4, seed=4)
    rows = [r for r in result.rows if "valid_acc" in r]
    assert len(rows) == 4 and {r["status"] for r in rows} == {"completed"}, [r.get("error") for r in result.rows]
    assert weights.puts == 1 and {r["ref"] for r in rows} == {weights.ref.hex()}
    assert all(r["writable"] == 0.0 and r["shares"] == 1.0 for r in rows)  # views of the store's memory
    assert len({r["pid"] for r in rows} - {os.getpid()}) >= 1
    for row in rows:
        assert row["valid_acc"] == reference(supernet, {k: row["config"][k] for k in nb201.EDGES})


def test_weights_load_in_one_call_from_a_checkpoint_or_a_result(tmp_path: Any) -> None:
    result = nasplat.run(trainer=NB201SupernetTrainer, space={"channels": 4, "train_size": 320, "epochs": 1},
                         metric="valid_acc", max_trials=1, max_steps=1, storage=str(tmp_path), name="sup",
                         checkpoint=True)
    state = result.load_state()
    for loaded in (SharedWeights.load(result), SharedWeights.load(result.find_checkpoint().uri)):
        assert set(loaded.arrays) == set(state["model"])
        assert all((loaded.arrays[k] == state["model"][k].numpy()).all() for k in loaded.arrays)
        assert not any(a.flags.writeable for a in loaded.arrays.values())


def test_proxy_trials_report_finite_scores_and_a_search_on_naswot_runs() -> None:
    result = nasplat.run(trainer=NB201ProxyTrainer, space={**nb201.space.domains, "channels": 4},
                         metric="naswot", mode="max", controller="evolution",
                         controller_options={"population_size": 3, "sample_size": 2}, max_trials=6, seed=5)
    rows = [r for r in result.rows if "naswot" in r]
    assert len(rows) == 6 and {r["status"] for r in rows} == {"completed"}
    for row in rows:
        assert all(math.isfinite(row[name]) for name in PROXIES), row
    assert len({r["naswot"] for r in rows}) > 1
    again = start(NB201ProxyTrainer(), rows[0]["config"], WorkerContext(seed=99)).step()  # not the trial's seed
    assert again["naswot"] == rows[0]["naswot"]  # the init is fixed: the score is the path's
    cut = start(NB201ProxyTrainer(), {**dict.fromkeys(nb201.EDGES, "none"), "channels": 4}, WorkerContext()).step()
    assert cut["naswot"] == -1e300 and math.isfinite(cut["synflow"])  # a singular kernel: the worst, still a row


def test_proxies_are_inputs_the_predictor_learns_from() -> None:
    from nasplat.controllers import Predictor
    from nasplat.controllers.surrogate.encoding import Encoder

    features = ProxyFeatures(NB201ProxyTrainer, {"channels": 4}, proxies=["naswot", "synflow"])
    predictor = Predictor(nb201.space, metric="valid_acc", features=features, initial_samples=3, pool_size=20,
                          mutations=4, seed=1)
    plain = Encoder(nb201.space)
    assert predictor.encoder.size == plain.size + 2
    path = nb201.space.sample(np.random.default_rng(3))
    row = predictor.encoder.encode(path)
    scores = start(NB201ProxyTrainer(), {**path, "channels": 4, "proxies": ["naswot", "synflow"]},
                   WorkerContext(seed=7)).step()
    assert row[:plain.size].tolist() == plain.encode(path).tolist()
    assert row[plain.size:] == pytest.approx([math.copysign(math.log1p(abs(scores[n])), scores[n]) / 10
                                              for n in ("naswot", "synflow")], rel=1e-5)
    for _ in range(5):  # past the random start: candidates are scored with the proxies among their inputs
        spec = predictor.ask()
        predictor.tell(spec.trial_id, nasplat.controllers.Result({"valid_acc": features(spec.config)[0]}, 1))
    assert predictor.features.shape == (5, plain.size + 2) and len(features.cache) >= 5
    with pytest.raises(ValueError, match=r"`features` must be a function of a config to numbers \(or None\), got 3"):
        Predictor(nb201.space, metric="valid_acc", features=3)
