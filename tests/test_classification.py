"""Real training with `trainers.classification` and the CNN spaces of `search_spaces.cnn` (CPU, < 60 s)."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import nasplat
from nasplat.trainer import WorkerContext, resolve, start
from search_spaces.cnn import PBT_ARCHITECTURE, build_model, pbt_space, space, space_1d
from trainers.classification import ClassificationTrainer, load_dataset

ROOT = Path(__file__).resolve().parents[1]

METRICS = ("train_loss", "valid_loss", "valid_acc", "test_loss", "test_acc", "epoch")
GOOD = {"depth": copy.deepcopy(PBT_ARCHITECTURE), "head": 64, "lr": 0.05, "momentum": 0.9, "batch_size": 32,
        "weight_decay": 1e-4}


def make(config: dict, seed: int = 0) -> ClassificationTrainer:
    return start(ClassificationTrainer(), config, WorkerContext(seed=seed))


def weights(trainer: ClassificationTrainer) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in trainer.net.state_dict().items()}


def test_good_config_reaches_95_percent_through_nasplat_run() -> None:
    result = nasplat.run(trainer=ClassificationTrainer, space=GOOD, controller="random", metric="valid_acc",
                         max_trials=1, max_steps=3, executor="local", seed=0)
    assert result.counts() == {"completed": 1}
    assert result.best["valid_acc"] >= 0.95 and result.best["test_acc"] >= 0.95
    rows = result.dataframe()
    assert list(rows["epoch"]) == [1.0, 2.0, 3.0]
    assert all(isinstance(rows[k].iloc[-1], float) for k in METRICS)


@pytest.mark.parametrize("name", ["digits", "mnist1d"])
def test_validation_is_a_stratified_share_of_the_training_set_disjoint_from_both_others(name: str) -> None:
    data = load_dataset(name)
    n_before = len(data.y_train) + len(data.y_valid)  # the original training set: 1,437 digits, 4,000 signals
    assert n_before == {"digits": 1437, "mnist1d": 4000}[name] and len(data.y_valid) == int(np.ceil(0.2 * n_before))
    training = {tuple(x.tolist()) for x in data.x_train.flatten(1)}
    for held_out in (data.x_valid, data.x_test):
        assert not any(tuple(x.tolist()) in training for x in held_out.flatten(1))
    train_share = np.bincount(data.y_train.numpy(), minlength=10) / len(data.y_train)
    valid_share = np.bincount(data.y_valid.numpy(), minlength=10) / len(data.y_valid)
    assert np.abs(train_share - valid_share).max() < 0.01  # stratified: the same class shares


def test_state_dict_round_trip_gives_identical_evaluation_and_next_step() -> None:
    donor = make(GOOD, seed=1)
    donor.step()
    receiver = make(GOOD, seed=1)  # same seed: the same data order in the next epoch
    assert receiver.evaluate() != donor.evaluate()
    receiver.load_state_dict(copy.deepcopy(donor.state_dict()))
    assert receiver.epoch == donor.epoch == 1
    assert receiver.evaluate() == donor.evaluate()
    mine, theirs = receiver.step(), donor.step()
    assert mine.pop("latency_ms") > 0 and theirs.pop("latency_ms") > 0  # wall time: measured, not reproducible
    assert mine == theirs

    other_seed = make({**GOOD, "lr": 0.01}, seed=7)  # PBT: another member, another seed and config
    other_seed.load_state_dict(copy.deepcopy(donor.state_dict()))
    assert other_seed.evaluate() == donor.evaluate()


def test_update_config_sets_optimizer_in_place_without_rebuilding() -> None:
    trainer = make(GOOD)
    trainer.step()
    model, optimizer, before = trainer.model, trainer.optimizer, weights(trainer)
    new = {**GOOD, "lr": 0.01, "momentum": 0.6, "weight_decay": 1e-5, "batch_size": 128}
    trainer.config = new  # what the local executor does before calling update_config
    trainer.update_config(new)
    assert trainer.model is model and trainer.optimizer is optimizer
    assert all(g["lr"] == 0.01 and g["momentum"] == 0.6 and g["weight_decay"] == 1e-5
               for g in optimizer.param_groups)
    assert trainer.batch_size == 128
    assert all(torch.equal(before[k], v) for k, v in trainer.net.state_dict().items())
    assert trainer.step()["epoch"] == 2.0


def test_update_config_with_a_new_architecture_rebuilds_and_keeps_the_weights() -> None:
    trainer = make(GOOD)
    trainer.step()
    model, before = trainer.model, weights(trainer)
    new = copy.deepcopy(GOOD)
    new["depth"]["layer0"]["activation"] = "gelu"  # no parameters change shape: the state still fits
    trainer.update_config(new)
    assert trainer.model is not model
    assert isinstance(trainer.net.blocks[0].act, torch.nn.GELU)
    assert all(torch.equal(before[k], v) for k, v in trainer.net.state_dict().items())
    assert trainer.epoch == 1


def test_a_mutated_child_inherits_the_parents_tensors_that_fit() -> None:
    parent = make(GOOD)
    parent.step()
    child_config = copy.deepcopy(GOOD)
    child_config["depth"]["layer1"]["kernel"] = 5  # layer 1's convolution changes shape; nothing else does
    child = make(child_config, seed=9)
    fresh = weights(child)
    child.inherit_state(copy.deepcopy(parent.state_dict()))
    inherited, theirs = weights(child), weights(parent)
    changed = {k for k in inherited if inherited[k].shape != theirs[k].shape}
    assert changed and all(k.startswith("blocks.1.conv") for k in changed)
    for key, value in inherited.items():
        assert torch.equal(value, fresh[key] if key in changed else theirs[key]), key
    assert 0 < child.inherited < 1 and child.epoch == 0
    assert child.step()["valid_acc"] > 0.5  # and it trains on from there


class PlainSGD(nasplat.Trainer):
    """A trainer that keeps the default `update_config` (rebuild through `setup`, reload the state)."""

    def setup(self, config: dict, ctx: WorkerContext) -> None:
        torch.manual_seed(ctx.seed)
        self.model = torch.nn.Linear(3, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=config["lr"], momentum=0.9)

    def step(self) -> dict:
        self.optimizer.zero_grad()
        self.model(torch.ones(4, 3)).pow(2).mean().backward()
        self.optimizer.step()
        return {"w": self.model.weight.detach().sum().item()}

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])


def test_default_update_config_keeps_the_weights_and_applies_the_new_learning_rate() -> None:
    trainer = start(PlainSGD(), {"lr": 0.1}, WorkerContext(seed=3))
    trainer.step()
    before = copy.deepcopy(trainer.state_dict())
    trainer.update_config({"lr": 0.001})
    assert [g["lr"] for g in trainer.optimizer.param_groups] == [0.001]
    assert torch.equal(trainer.model.weight, before["model"]["weight"])
    momentum = trainer.optimizer.state_dict()["state"][0]["momentum_buffer"]
    assert torch.equal(momentum, before["optimizer"]["state"][0]["momentum_buffer"])  # the state itself is kept


@pytest.mark.parametrize("seed", range(10))
def test_every_sampled_config_is_valid_builds_and_trains(seed: int) -> None:
    config = space.sample(np.random.default_rng(seed))
    space.validate(config)
    assert space.decode(space.encode(config))["depth"]["n"] == config["depth"]["n"]
    metrics = make(config, seed=seed).step()
    assert set(metrics) == set(METRICS) | {"params", "latency_ms"}
    assert np.isfinite(metrics["train_loss"]) and 0.0 <= metrics["valid_acc"] <= 1.0
    assert metrics["params"] == sum(p.numel() for p in build_model(config, 1, 10, (8, 8)).parameters())


def test_mutated_configs_build_for_images_and_sequences() -> None:
    rng = np.random.default_rng(0)
    config = space.sample(rng)
    for _ in range(30):
        config = space.mutate(config, rng)
        space.validate(config)
        for shape in [(8, 8), (40,)]:
            model = build_model(config, in_channels=1, num_classes=10, input_shape=shape)
            assert model(torch.zeros(2, 1, *shape)).shape == (2, 10)


def test_mnist1d_trains_with_1d_convolutions() -> None:
    config = {**space_1d.sample(np.random.default_rng(3)), "depth": copy.deepcopy(PBT_ARCHITECTURE), "lr": 0.05}
    trainer = make(config)
    assert trainer.data.x_train.shape[1:] == (1, 40) and len(trainer.data.y_test) == 1000
    assert any(isinstance(m, torch.nn.Conv1d) for m in trainer.net.modules())
    assert not any(isinstance(m, torch.nn.Conv2d) for m in trainer.net.modules())
    metrics = trainer.step()
    assert np.isfinite(metrics["train_loss"]) and metrics["valid_acc"] > 0.2  # chance is 0.1


def test_mnist1d_signals_are_kept_in_the_cache_and_rebuilt_when_it_is_damaged(tmp_path, monkeypatch) -> None:
    from importlib.metadata import version

    from trainers.classification import _mnist1d_arrays

    monkeypatch.setenv("NASPLAT_CACHE", str(tmp_path))
    cache = tmp_path / f"mnist1d-{version('mnist1d')}.npz"
    built = _mnist1d_arrays()
    assert built["x"].shape == (4000, 40) and built["x_test"].shape == (1000, 40)
    with np.load(cache) as saved:
        assert all(np.array_equal(saved[key], value) for key, value in built.items())
    np.savez(cache, **{**built, "x": 2 * built["x"]})  # a later process reads the cache, and does not build again
    assert np.array_equal(_mnist1d_arrays()["x"], 2 * built["x"])
    cache.write_bytes(cache.read_bytes()[:1000])  # a damaged (cut) cache is built again, and replaced
    again = _mnist1d_arrays()
    assert all(np.array_equal(again[key], value) for key, value in built.items())
    with np.load(cache) as saved:
        assert np.array_equal(saved["y"], built["y"])


def test_unknown_dataset_names_the_value_and_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown dataset 'cifar10'; allowed: \['digits', 'mnist1d'\]"):
        make({**GOOD, "dataset": "cifar10"})


def test_bad_batch_size_is_named() -> None:
    with pytest.raises(ValueError, match=r"config\['batch_size'\] must be an integer >= 1, got 0"):
        make({**GOOD, "batch_size": 0})


def test_train_size_trains_on_a_prefix_of_the_training_share_and_is_checked() -> None:
    whole, cut = make(GOOD), make({**GOOD, "train_size": 300})
    assert len(cut.y_train) == 300 and torch.equal(cut.x_train, whole.x_train[:300])
    assert len(cut.data.y_valid) == len(whole.data.y_valid)  # the validation set does not change
    with pytest.raises(ValueError, match=r"config\['train_size'\] must be <= 1149 \(the training share of digits\), "
                                         r"got 5000"):
        make({**GOOD, "train_size": 5000})


def test_pbt_exploits_between_trainers() -> None:
    result = nasplat.run(trainer=ClassificationTrainer, space=pbt_space, controller="pbt", metric="valid_acc",
                         controller_options={"population_size": 4, "perturbation_interval": 2},
                         concurrency=4, max_trials=4, max_steps=4, executor="local", seed=0)
    rows = result.dataframe()
    assert result.counts() == {"completed": 4}
    assert rows["donor_id"].notna().any()
    assert result.best["valid_acc"] >= 0.95


@pytest.mark.parametrize("name", ["quickstart.yaml", "pbt.yaml"])
def test_example_yaml_names_importable_objects(name: str) -> None:
    spec = yaml.safe_load((ROOT / "examples" / name).read_text())
    assert set(spec) == {"name", "trainer", "space", "metric", "mode", "controller", "budget", "resources", "executor",
                         "storage", "seed", "max_failures"}
    assert resolve(spec["trainer"], what="trainer") is ClassificationTrainer
    searched = resolve(spec["space"], what="space")
    searched.validate(searched.sample(np.random.default_rng(0)))


def test_custom_space_example_runs() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "custom_space.py")], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    match = re.search(r"best valid_acc=([0-9.]+), its test_acc=([0-9.]+)", done.stdout)
    assert match is not None, done.stdout
    assert float(match.group(1)) >= 0.95 and float(match.group(2)) >= 0.9


def test_ranks_train_on_disjoint_shards_of_equal_length() -> None:
    shards = [start(ClassificationTrainer(), GOOD, WorkerContext(rank=r, world_size=2, seed=0)) for r in range(2)]
    assert len(shards[0].y_train) == len(shards[1].y_train) == 1149 // 2
    assert not torch.equal(shards[0].x_train[:5], shards[1].x_train[:5])
