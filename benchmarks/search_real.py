"""Predictor vs regularized evolution vs local search on real training: the CNN space on MNIST-1D.

Every controller gets the same number of trials per seed; each trial trains a `search_spaces.cnn` config
for `--epochs` epochs on `--train-size` signals with `trainers.classification:ClassificationTrainer` in this
process. Searches select on validation accuracy (the trainer's stratified 20% of MNIST-1D's training set); the
test accuracy of the chosen config is only reported. Small-budget settings for all three (not tuned on this
task): evolution with population 5 and tournaments of 2, local search from the best of 3 random configs, the
predictor with 5 random configs before its model takes over.

    python benchmarks/search_real.py [--seeds 5] [--trials 40] [--epochs 2] [--train-size 1000]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np

import nasplat
from search_spaces.cnn import space_1d
from trainers.classification import ClassificationTrainer

CONTROLLERS: dict[str, tuple[str, dict[str, Any]]] = {
    "predictor": ("predictor", {"initial_samples": 5}),
    "evolution": ("evolution", {"population_size": 5, "sample_size": 2}),
    "local_search": ("local_search", {"initial_samples": 3}),
}


def search(algorithm: str, seed: int, args: argparse.Namespace) -> tuple[float, float]:
    """(best validation accuracy, the test accuracy of that trial) of one seeded search."""
    name, options = CONTROLLERS[algorithm]
    space = nasplat.Space({**space_1d.domains, "epochs_per_step": args.epochs, "train_size": args.train_size})
    result = nasplat.run(trainer=ClassificationTrainer, space=space,
                         controller=name, controller_options=options, metric="valid_acc", executor="local",
                         max_trials=args.trials, max_steps=1, seed=seed)
    return float(result.best["valid_acc"]), float(result.best["test_acc"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--train-size", type=int, default=1000, help="training signals (of the 3,200 left)")
    args = parser.parse_args()
    summary: dict[str, dict[str, float]] = {}
    print(f"MNIST-1D, CNN space: {args.seeds} seeds x {args.trials} trials x {args.epochs} epochs on "
          f"{args.train_size} signals per controller")
    print(f"{'controller':<13} {'valid acc':>16} {'test acc (info)':>16} {'seconds':>8}")
    for algorithm in CONTROLLERS:
        started = time.perf_counter()
        outcomes = np.array([search(algorithm, seed, args) for seed in range(args.seeds)])
        seconds = time.perf_counter() - started
        valid, test = outcomes[:, 0], outcomes[:, 1]
        summary[algorithm] = {"valid_mean": round(float(valid.mean()), 4), "valid_std": round(float(valid.std()), 4),
                              "test_mean": round(float(test.mean()), 4), "seconds": round(seconds, 1)}
        print(f"{algorithm:<13} {valid.mean():>8.4f} ± {valid.std():.4f} {test.mean():>16.4f} {seconds:>8.0f}",
              flush=True)
    ours = summary["predictor"]["valid_mean"]
    print(json.dumps({"seeds": args.seeds, "trials": args.trials, "epochs": args.epochs,
                      "train_size": args.train_size, **summary,
                      "predictor_minus_evolution": round(ours - summary["evolution"]["valid_mean"], 4),
                      "predictor_minus_local_search": round(ours - summary["local_search"]["valid_mean"], 4)}))


if __name__ == "__main__":
    main()
