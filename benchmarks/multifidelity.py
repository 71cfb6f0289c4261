"""Multi-fidelity search: nasplat's ASHA and Hyperband against full-fidelity random search and Ray Tune's ASHA.

The CNN space (`search_spaces.cnn`) on MNIST-1D, one epoch per step, up to `--max-steps` (27) epochs, the
metric validation accuracy (a held-out part of the training set); test accuracy is only reported. Per seed, in one
run, every method keeps `--concurrency` trials going: nasplat's in its own process (the `local` executor: one
core, trials interleaved step by step, no start-up), Tune's on a local Ray of `--cpus` (2) CPUs, one actor a trial:

  full             random search, every trial to max_steps (`--full-trials` trials)
  asha-*           nasplat ASHA (grace period 3, reduction factor 3: rungs at 3 and 9 epochs) around random search or evolution, type stop or
                   promote (`--trials` new trials each)
  hyperband        nasplat asynchronous Hyperband around random search, type promote
  tune-asha        Ray Tune's ASHAScheduler, same rule parameters, same configs as asha-random-*, same trainer
                   and trial seeds

The table gives, per method (mean over seeds), the epochs used, the best validation accuracy and that trial's test
accuracy at the same row, wall seconds; then the comparison at an equal epoch budget with Tune. Last line: JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nasplat  # noqa: E402
from nasplat.controllers import RandomSearch  # noqa: E402
from nasplat.space import Config, Space  # noqa: E402
from nasplat.trainer import WorkerContext, start  # noqa: E402
from search_spaces.cnn import space_1d  # noqa: E402
from trainers.classification import ClassificationTrainer, load_dataset  # noqa: E402


class HeldOutMNIST1D(ClassificationTrainer):
    """MNIST-1D with the last `valid_size` training signals held out for validation; trains on the first
    `train_size` of the rest. Reports `valid_acc` (the search metric) besides `test_acc`, and `wall` (time.time()).
    (Written before `trainers.classification` had a validation split of its own.)"""

    def setup(self, config: Config, ctx: WorkerContext) -> None:
        super().setup(config, ctx)
        data, valid = self.data, int(config["valid_size"])
        self.x_valid, self.y_valid = data.x_train[-valid:], data.y_train[-valid:]
        self.x_train, self.y_train = data.x_train[:int(config["train_size"])], data.y_train[:int(config["train_size"])]

    def step(self) -> dict[str, Any]:
        metrics = super().step()
        self.model.eval()
        with torch.no_grad():
            metrics["valid_acc"] = (self.model(self.x_valid).argmax(1) == self.y_valid).float().mean().item()
        metrics["wall"] = time.time()
        return metrics


def search_space(args: argparse.Namespace) -> Space:
    return Space({**space_1d.domains, "train_size": args.train_size, "valid_size": args.valid_size})


def methods(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """nasplat.run keyword arguments of each nasplat method."""
    asha = {"name": "asha", "grace_period": args.grace_period, "reduction_factor": 3}
    evolution = {"controller": "evolution", "controller_options": {"population_size": args.population,
                                                                   "sample_size": 3}}
    return {
        "full": {"max_trials": args.full_trials},
        "asha-random-stop": {"scheduler": {**asha, "type": "stop"}},
        "asha-random-promote": {"scheduler": {**asha, "type": "promote"}},
        "asha-evolution-stop": {"scheduler": {**asha, "type": "stop"}, **evolution},
        "asha-evolution-promote": {"scheduler": {**asha, "type": "promote"}, **evolution},
        "hyperband": {"scheduler": {"name": "hyperband", "grace_period": args.grace_period, "reduction_factor": 3,
                                    "type": "promote"}},
    }


def curve(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Epochs used, the best-so-far validation accuracy after each epoch (in order of finishing), and the best row."""
    rows = sorted(rows, key=lambda r: r["wall"])
    best, trace = None, []
    for row in rows:
        if best is None or row["valid_acc"] > best["valid_acc"]:
            best = row
        trace.append(best["valid_acc"])
    return {"epochs": len(rows), "trace": trace, "best_valid": best["valid_acc"], "best_test": best["test_acc"]}


def run_nasplat(name: str, options: dict[str, Any], seed: int, args: argparse.Namespace) -> dict[str, Any]:
    kwargs = {"max_trials": args.trials, **options}
    began = time.perf_counter()
    result = nasplat.run(trainer=HeldOutMNIST1D, space=search_space(args), metric="valid_acc", executor="local",
                         concurrency=args.concurrency, max_steps=args.max_steps, seed=seed, **kwargs)
    wall = time.perf_counter() - began
    rows = [r for r in result.rows if r["status"] not in ("failed", "retried")]
    out = {**curve(rows), "wall": wall, "trials": len({r["trial_id"] for r in rows})}
    if name.startswith("asha-evolution"):  # the rung each parent reached against the rung of every trial: who wins tournaments
        steps = {}
        for row in rows:
            steps[row["trial_id"]] = max(steps.get(row["trial_id"], 0), row["step"])
        parents = [r["parent_id"] for r in rows if r["step"] == 1 and r["parent_id"] is not None]
        out["parent_epochs"] = float(np.mean([steps[p] for p in parents])) if parents else float("nan")
        out["trial_epochs"] = float(np.mean(list(steps.values())))
    return out


def run_tune(seed: int, args: argparse.Namespace, storage: str) -> dict[str, Any]:
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    controller = RandomSearch(search_space(args), metric="valid_acc", seed=seed)  # asha-random-*'s configs, in order
    configs = [controller.ask().config for _ in range(args.trials)]
    trial_seeds = [int(np.random.SeedSequence([seed, i, 0]).generate_state(1)[0]) for i in range(args.trials)]
    items = [{"config": c, "trial_seed": s} for c, s in zip(configs, trial_seeds)]

    def trainable(space: dict[str, Any]) -> None:
        item = space["item"]
        trainer = start(HeldOutMNIST1D(), item["config"], WorkerContext(seed=item["trial_seed"]))
        for _ in range(args.max_steps):
            tune.report(trainer.step())

    scheduler = ASHAScheduler(max_t=args.max_steps, grace_period=args.grace_period, reduction_factor=3)
    began = time.perf_counter()
    tuner = tune.Tuner(tune.with_resources(trainable, {"cpu": 1}), param_space={"item": tune.grid_search(items)},
                       tune_config=tune.TuneConfig(metric="valid_acc", mode="max", scheduler=scheduler,
                                                   max_concurrent_trials=args.concurrency, reuse_actors=True),
                       run_config=tune.RunConfig(name=f"tune-asha-{seed}", storage_path=storage, verbose=0))
    grid = tuner.fit()
    wall = time.perf_counter() - began
    rows = [row for result in grid if result.metrics_dataframe is not None
            for row in result.metrics_dataframe[["valid_acc", "test_acc", "wall"]].to_dict("records")]
    return {**curve(rows), "wall": wall, "trials": len(grid)}


def at_epochs(trace: list[float], epochs: int) -> float:
    """The best validation accuracy after `epochs` epochs (the last value if it used fewer)."""
    return trace[min(epochs, len(trace)) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--max-steps", type=int, default=27, help="epochs of a full-fidelity trial")
    parser.add_argument("--full-trials", type=int, default=8, help="trials of full-fidelity random search")
    parser.add_argument("--trials", type=int, default=9, help="new trials of each multi-fidelity method")
    parser.add_argument("--population", type=int, default=4, help="evolution's population")
    parser.add_argument("--train-size", type=int, default=1000, help="training signals (of MNIST-1D's 4,000)")
    parser.add_argument("--grace-period", type=int, default=3, help="epochs before the first rung")
    parser.add_argument("--valid-size", type=int, default=1000, help="held-out validation signals")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--cpus", type=int, default=2)
    args = parser.parse_args()
    import ray

    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    load_dataset("mnist1d")
    storage = tempfile.mkdtemp(prefix="nasplat-multifidelity-")
    results: dict[str, list[dict[str, Any]]] = {}
    for seed in range(args.seeds):
        for name, options in methods(args).items():
            results.setdefault(name, []).append(run_nasplat(name, options, seed, args))
            print(f"seed {seed} {name}: {json.dumps({k: round(v, 4) for k, v in results[name][-1].items() if k != 'trace'})}",
                  file=sys.stderr, flush=True)
        results.setdefault("tune-asha", []).append(run_tune(seed, args, storage))
        print(f"seed {seed} tune-asha: {results['tune-asha'][-1]['best_valid']:.4f}", file=sys.stderr, flush=True)
    ray.shutdown()
    report(results, args)


def report(results: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> None:
    def mean(name: str, key: str) -> float:
        return float(np.mean([r[key] for r in results[name]]))

    print(f"MNIST-1D CNN search, {args.seeds} seeds, up to {args.max_steps} epochs a trial, concurrency "
          f"{args.concurrency}, train {args.train_size} / valid {args.valid_size} / test 1000 signals (means)")
    print(f"{'method':<24}{'trials':>7}{'epochs':>8}{'best valid':>12}{'its test':>10}{'wall s':>9}")
    for name in results:
        print(f"{name:<24}{mean(name, 'trials'):>7.1f}{mean(name, 'epochs'):>8.1f}"
              f"{100 * mean(name, 'best_valid'):>12.2f}{100 * mean(name, 'best_test'):>10.2f}{mean(name, 'wall'):>9.1f}")
    for name in results:
        if "parent_epochs" in results[name][0]:
            print(f"{name}: the parents evolution's tournaments chose had trained {mean(name, 'parent_epochs'):.1f} "
                  f"epochs on average, all its trials {mean(name, 'trial_epochs'):.1f}")
    full = results["full"]
    full_epochs, third = mean("full", "epochs"), int(mean("full", "epochs")) // 3
    multi = [n for n in results if n.startswith(("asha-", "hyperband"))]
    # epochs each method needed to come within 0.3 points of full random search's final best (same seed)
    to_target = {n: [next((i + 1 for i, v in enumerate(r["trace"]) if v >= f["best_valid"] - 0.003), None)
                     for r, f in zip(results[n], full)] for n in multi}
    at_third = {n: float(np.mean([at_epochs(r["trace"], third) for r in results[n]])) for n in multi}
    print(f"within 0.3 points of full random search's best ({100 * mean('full', 'best_valid'):.2f}, "
          f"{full_epochs:.0f} epochs): epochs needed per seed (- never) | best valid after {third} epochs")
    for n in multi:
        print(f"  {n:<24}{' '.join('-' if e is None else str(e) for e in to_target[n]):<24} | "
              f"{100 * at_third[n]:.2f}")
    reaching = [n for n in multi if None not in to_target[n]]
    cheapest = min(reaching or multi, key=lambda n: (sum(e is None for e in to_target[n]),
                                                     np.mean([e or mean(n, "epochs") for e in to_target[n]])))
    needed = float(np.mean([e or r["epochs"] for e, r in zip(to_target[cheapest], results[cheapest])]))
    # at an equal epoch budget with Tune: each seed's best-so-far after min(epochs of both) epochs
    pairs = {n: list(zip(results[n], results["tune-asha"])) for n in multi}
    equal = {n: float(np.mean([at_epochs(r["trace"], min(r["epochs"], t["epochs"])) for r, t in pairs[n]]))
             for n in multi}
    tune_equal = {n: float(np.mean([at_epochs(t["trace"], min(r["epochs"], t["epochs"])) for r, t in pairs[n]]))
                  for n in multi}
    best = max(multi, key=lambda n: (equal[n] - tune_equal[n], -mean(n, "wall")))
    print("at an equal epoch budget with tune-asha (best valid after min(epochs of both) epochs, per seed):")
    for n in multi:
        print(f"  {n:<24} nasplat {100 * equal[n]:.2f} vs tune {100 * tune_equal[n]:.2f}, wall "
              f"{mean(n, 'wall') / mean('tune-asha', 'wall'):.3f}x tune's")
    print(json.dumps({
        "epochs_ratio_vs_full": round(needed / full_epochs, 3), "ratio_variant": cheapest,
        "reached_full_best_within_0.3": {n: sum(e is not None for e in to_target[n]) for n in multi},
        "best_valid_after_a_third": {n: round(100 * at_third[n], 2) for n in multi},
        "best_valid": {n: round(100 * mean(n, "best_valid"), 2) for n in results},
        "best_test": {n: round(100 * mean(n, "best_test"), 2) for n in results},
        "epochs": {n: round(mean(n, "epochs"), 1) for n in results},
        "tune_asha_best_valid": round(100 * mean("tune-asha", "best_valid"), 2),
        "equal_budget": {"variant": best, "nasplat": round(100 * equal[best], 2),
                         "tune": round(100 * tune_equal[best], 2)},
        "wall_ratio_vs_tune": round(mean(best, "wall") / mean("tune-asha", "wall"), 3),
    }))


if __name__ == "__main__":
    main()
