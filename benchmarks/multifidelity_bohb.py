"""Ray Tune's BOHB (`TuneBOHB` + `HyperBandForBOHB`) on the CNN space of `benchmarks/multifidelity.py`.

BOHB needs its space as a ConfigSpace: the nasplat space's conditional depth (a `Choice` of dicts) becomes a
categorical `depth` with each deeper block's parameters active only where the depth has that block (`InCondition`),
so that BOHB's density model sees exactly the decisions nasplat's controllers see. A BOHB config maps back to the
nasplat config `ClassificationTrainer` builds. Hyperband pauses trials at its rungs and resumes them later, so the
trainable saves the trainer's state (`state_dict`) in a Tune checkpoint at every rung step and loads it when a
paused trial goes on.
"""

from __future__ import annotations

import argparse
import json
import pickle
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from nasplat.trainer import WorkerContext, start
from search_spaces.cnn import ACTIVATIONS, CHANNELS, HEAD_WIDTHS, KERNELS, MAX_DEPTH
from trainers.classification import ClassificationTrainer

BLOCK_KEYS = ("channels", "kernel", "activation", "pool")


def config_space(seed: int) -> Any:
    """The CNN space as a ConfigSpace, block i's parameters conditional on a depth above i."""
    import ConfigSpace as CS

    space = CS.ConfigurationSpace(seed=seed)
    depth = CS.Categorical("depth", [n for n in range(1, MAX_DEPTH + 1)])
    space.add(depth)
    for i in range(MAX_DEPTH):
        block = [CS.Categorical(f"layer{i}_channels", CHANNELS), CS.Categorical(f"layer{i}_kernel", KERNELS),
                 CS.Categorical(f"layer{i}_activation", list(ACTIVATIONS)),
                 CS.Categorical(f"layer{i}_pool", [0, 1])]
        space.add(block)
        if i > 0:  # block 0 exists at every depth
            space.add([CS.InCondition(hp, depth, list(range(i + 1, MAX_DEPTH + 1))) for hp in block])
    space.add([CS.Categorical("head", HEAD_WIDTHS), CS.Float("lr", (1e-3, 3e-1), log=True),
               CS.Float("momentum", (0.5, 0.99)), CS.Categorical("batch_size", [32, 64, 128]),
               CS.Float("weight_decay", (1e-6, 1e-3), log=True)])
    return space


def to_config(flat: dict[str, Any], train_size: int) -> dict[str, Any]:
    """The nasplat config (`search_spaces.cnn.space_1d` plus `train_size`) of a BOHB config."""
    n = int(flat["depth"])
    layers = {f"layer{i}": {key: flat[f"layer{i}_{key}"] for key in BLOCK_KEYS} for i in range(n)}
    for layer in layers.values():
        layer["pool"] = bool(layer["pool"])
        layer["channels"], layer["kernel"] = int(layer["channels"]), int(layer["kernel"])
    return {"depth": {"n": n, **layers}, "head": int(flat["head"]), "lr": float(flat["lr"]),
            "momentum": float(flat["momentum"]), "batch_size": int(flat["batch_size"]),
            "weight_decay": float(flat["weight_decay"]), "dataset": "mnist1d", "train_size": train_size}


def rung_steps(max_t: int, eta: int) -> set[int]:
    """The steps at which some Hyperband bracket may pause a trial: max_t / eta**k below max_t."""
    steps, t = set(), max_t
    while t // eta >= 1:
        t //= eta
        steps.add(t)
    return steps


def run_tune_bohb(seed: int, args: argparse.Namespace, storage: str) -> dict[str, Any]:
    """One seed of Tune BOHB: `args.trials` trials, up to `args.max_steps` epochs, `args.concurrency` at a time.
    Returns its rows (validation and test accuracy, in order of their report's wall time), wall seconds and trial
    count."""
    from ray import tune
    from ray.tune.schedulers import HyperBandForBOHB
    from ray.tune.search.bohb import TuneBOHB

    pauses = rung_steps(args.max_steps, 3)
    train_size, max_steps = args.train_size, args.max_steps

    def trainable(flat: dict[str, Any]) -> None:
        # Tune's trial ids are random: the trial seed comes from the run's seed and the config, reproducibly
        key = zlib.crc32(json.dumps(flat, sort_keys=True, default=str).encode())
        trial_seed = int(np.random.SeedSequence([seed, key, 0]).generate_state(1)[0])
        trainer = start(ClassificationTrainer(), to_config(flat, train_size), WorkerContext(seed=trial_seed))
        done = 0
        checkpoint = tune.get_checkpoint()
        if checkpoint is not None:
            with checkpoint.as_directory() as folder:
                state = pickle.loads((Path(folder) / "state.pkl").read_bytes())
            trainer.load_state_dict(state["trainer"])
            done = state["done"]
        while done < max_steps:
            metrics = {**trainer.step(), "wall": time.time()}
            done += 1
            if done in pauses:  # Hyperband may pause here: keep the state to go on from
                with tempfile.TemporaryDirectory() as folder:
                    (Path(folder) / "state.pkl").write_bytes(
                        pickle.dumps({"trainer": trainer.state_dict(), "done": done}))
                    tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(folder))
            else:
                tune.report(metrics)

    searcher = TuneBOHB(space=config_space(seed), metric="valid_acc", mode="max", seed=seed,
                        max_concurrent=args.concurrency)
    scheduler = HyperBandForBOHB(time_attr="training_iteration", max_t=args.max_steps, reduction_factor=3)
    began = time.perf_counter()
    tuner = tune.Tuner(tune.with_resources(trainable, {"cpu": 1}),
                       tune_config=tune.TuneConfig(metric="valid_acc", mode="max", search_alg=searcher,
                                                   scheduler=scheduler, num_samples=args.trials,
                                                   max_concurrent_trials=args.concurrency, reuse_actors=True),
                       run_config=tune.RunConfig(name=f"tune-bohb-{seed}", storage_path=storage, verbose=0))
    grid = tuner.fit()
    wall = time.perf_counter() - began
    return {"rows": tune_rows(grid), "wall": wall, "trials": len(grid)}


def tune_rows(grid: Any) -> list[dict[str, Any]]:
    """Every report of a Tune `ResultGrid` (validation and test accuracy, the wall clock it was made at), in the
    order they were made."""
    return sorted((row for result in grid if result.metrics_dataframe is not None
                   for row in result.metrics_dataframe[["valid_acc", "test_acc", "wall"]].to_dict("records")),
                  key=lambda row: row["wall"])
