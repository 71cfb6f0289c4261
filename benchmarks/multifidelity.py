"""Multi-fidelity search: nasplat's ASHA and Hyperband against full-fidelity random search and Ray Tune's ASHA.

The CNN space (`search_spaces.cnn`) on MNIST-1D, one epoch per step, up to `--max-steps` (27) epochs, trained on
`--train-size` (1,000) signals of the training share by `trainers.classification:ClassificationTrainer`; the
metric is its validation accuracy (its stratified 20% of MNIST-1D's training set); test accuracy is only reported.
Per seed, in one run, every method keeps `--concurrency` trials going: nasplat's in its own process (the `local`
executor: one core, trials interleaved step by step, no start-up, deterministic) or, with `--executor processes`,
in as many forked workers (one thread each: the same cores as Tune), Tune's on a local Ray of `--cpus` (2) CPUs, one
actor a trial:

  full             random search, every trial to max_steps (`--full-trials` trials)
  asha-*           nasplat ASHA (grace period 1, reduction factor 3: rungs at 1, 3 and 9 epochs) around random
                   search or evolution, type stop or promote (`--trials` new trials each)
  hyperband        nasplat asynchronous Hyperband around random search, type promote
  asha-mobster-*   nasplat ASHA around its model-based multi-fidelity controller (`mobster`: a Gaussian process over
                   config x epochs learned from every rung, expected improvement at the highest epoch observed
                   3 times), stop or promote
  asha-*-curve     ASHA `promote` ranking paused trials by their predicted final score (`rank_by: curve`) around
                   random search or `mobster`; asha-mobster-curve is the model-based method the goal is about
  asha-*-delayed   the same with `delayed` (after Hyper-Tune's delayed ASHA): a rung promotes at most a third of
                   its results at any time, so 40 trials train successive halving's 108 epochs
  asha-mobster-target  asha-mobster-delayed with the model fitted at its target epoch and above only (`fit_on:
                   target`, as BOHB fits its model at one budget)
  tune-asha        Ray Tune's ASHAScheduler, same rule parameters, same configs as asha-random-*, same trainer
                   and trial seeds
  tune-bohb        Ray Tune's BOHB (`TuneBOHB` + `HyperBandForBOHB`, reduction factor 3, max_t max_steps), the same
                   space as a ConfigSpace, the same trainer (trial seeds from the config), `--trials` trials
                   (`benchmarks/multifidelity_bohb.py`)

Both sides keep their results on disk (nasplat its experiment folder, Tune its own) in one temporary folder, and
both clocks stop when the search call (`nasplat.run`, `Tuner.fit`) returns. `--methods` runs a subset.

Each method's trace is its best validation accuracy so far after each epoch, epochs counted in the order steps
finished. The table gives, per method (mean over seeds), the epochs used, the best validation accuracy and that
row's test accuracy, wall seconds. Then: the best each multi-fidelity method had after a third of full random
search's epochs, against full random search's final best (goal: within 0.3 points, mean over seeds), the fewest
epochs after which its mean trace came that close, the comparison with Tune at an equal epoch budget, and the
model-based method against every other method at an equal epoch budget (goal: >= each; wall <= 1/2 of Tune
BOHB's). Last line: JSON.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from multifidelity_bohb import run_tune_bohb, tune_rows

import nasplat
from nasplat.controllers import RandomSearch
from nasplat.space import Space
from nasplat.trainer import WorkerContext, start
from search_spaces.cnn import space_1d
from trainers.classification import ClassificationTrainer, load_dataset


def search_space(args: argparse.Namespace) -> Space:
    return Space({**space_1d.domains, "train_size": args.train_size})


def methods(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """nasplat.run keyword arguments of each nasplat method."""
    asha = {"name": "asha", "grace_period": args.grace_period, "reduction_factor": 3}
    promote = {**asha, "type": "promote"}
    curve = {**promote, "rank_by": "curve"}
    delayed = {**curve, "delayed": True}
    evolution = {"controller": "evolution", "controller_options": {"population_size": args.population,
                                                                   "sample_size": 3}}
    mobster = {"controller": "mobster",
               "controller_options": {"max_steps": args.max_steps, **json.loads(args.mobster_options)}}
    return {
        "full": {"max_trials": args.full_trials},
        "asha-random-stop": {"scheduler": {**asha, "type": "stop"}},
        "asha-random-promote": {"scheduler": promote},
        "asha-evolution-stop": {"scheduler": {**asha, "type": "stop"}, **evolution},
        "asha-evolution-promote": {"scheduler": promote, **evolution},
        "hyperband": {"scheduler": {"name": "hyperband", "grace_period": args.grace_period, "reduction_factor": 3,
                                    "type": "promote"}},
        "asha-mobster-stop": {"scheduler": {**asha, "type": "stop"}, **mobster},
        "asha-mobster-promote": {"scheduler": promote, **mobster},
        "asha-random-curve": {"scheduler": curve},
        "asha-mobster-curve": {"scheduler": curve, **mobster},
        "asha-random-delayed": {"scheduler": delayed},
        "asha-mobster-delayed": {"scheduler": delayed, **mobster},
        "asha-mobster-target": {"scheduler": delayed, "controller": "mobster", "controller_options": {
            **mobster["controller_options"], "fit_on": "target"}},
    }


def curve(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Epochs used, the best-so-far validation accuracy after each epoch (rows in order of finishing), and the best
    row's validation and test accuracy."""
    best, trace = None, []
    for row in rows:
        if best is None or row["valid_acc"] > best["valid_acc"]:
            best = row
        trace.append(best["valid_acc"])
    return {"epochs": len(rows), "trace": trace, "best_valid": best["valid_acc"], "best_test": best["test_acc"]}


def run_nasplat(name: str, options: dict[str, Any], seed: int, args: argparse.Namespace,
                storage: str) -> dict[str, Any]:
    kwargs = {"max_trials": args.trials, **options}
    began = time.perf_counter()
    executor_options = {"processes": args.concurrency, "threads": 1} if args.executor == "processes" else None
    result = nasplat.run(trainer=ClassificationTrainer, space=search_space(args), metric="valid_acc",
                         executor=args.executor, executor_options=executor_options, concurrency=args.concurrency,
                         max_steps=args.max_steps, seed=seed, storage=storage, name=f"{name}-{seed}", **kwargs)
    wall = time.perf_counter() - began
    rows = [r for r in result.rows if r["status"] not in ("failed", "retried")]  # in the order they finished
    out = {**curve(rows), "wall": wall, "trials": len({r["trial_id"] for r in rows})}
    if name.startswith("asha-evolution"):  # epochs of the parents tournaments chose against all trials'
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
        trainer = start(ClassificationTrainer(), item["config"], WorkerContext(seed=item["trial_seed"]))
        for _ in range(args.max_steps):
            tune.report({**trainer.step(), "wall": time.time()})

    scheduler = ASHAScheduler(max_t=args.max_steps, grace_period=args.grace_period, reduction_factor=3)
    began = time.perf_counter()
    tuner = tune.Tuner(tune.with_resources(trainable, {"cpu": 1}), param_space={"item": tune.grid_search(items)},
                       tune_config=tune.TuneConfig(metric="valid_acc", mode="max", scheduler=scheduler,
                                                   max_concurrent_trials=args.concurrency, reuse_actors=True),
                       run_config=tune.RunConfig(name=f"tune-asha-{seed}", storage_path=storage, verbose=0))
    grid = tuner.fit()
    wall = time.perf_counter() - began
    return {**curve(tune_rows(grid)), "wall": wall, "trials": len(grid)}


ALL_METHODS = ["full", "asha-random-stop", "asha-random-promote", "asha-evolution-stop", "asha-evolution-promote",
               "hyperband", "asha-mobster-stop", "asha-mobster-promote", "asha-random-curve", "asha-mobster-curve",
               "asha-random-delayed", "asha-mobster-delayed", "asha-mobster-target", "tune-asha", "tune-bohb"]
MODEL_BASED = "asha-mobster-curve"


def at_epochs(trace: list[float], epochs: int) -> float:
    """The best validation accuracy after `epochs` epochs (the last value if it used fewer)."""
    return trace[min(epochs, len(trace)) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--first-seed", type=int, default=0, help="the seeds are first-seed, first-seed + 1, ...")
    parser.add_argument("--max-steps", type=int, default=27, help="epochs of a full-fidelity trial")
    parser.add_argument("--full-trials", type=int, default=12, help="trials of full-fidelity random search")
    parser.add_argument("--trials", type=int, default=40, help="new trials of each multi-fidelity method")
    parser.add_argument("--population", type=int, default=4, help="evolution's population")
    parser.add_argument("--train-size", type=int, default=1000, help="training signals (of 3,200)")
    parser.add_argument("--grace-period", type=int, default=1, help="epochs before the first rung")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--executor", choices=("local", "processes"), default="local",
                        help="nasplat's executor: local (one core, deterministic) or processes (one forked worker "
                             "per concurrent trial, one thread each, as Tune's actors)")
    parser.add_argument("--methods", default=None,
                        help="comma-separated subset of: " + ", ".join(ALL_METHODS) + " (full and tune-asha always)")
    parser.add_argument("--mobster-options", default="{}", help="JSON of more options of the mobster controller")
    parser.add_argument("--model-based", default=MODEL_BASED, choices=[m for m in ALL_METHODS if "mobster" in m],
                        help="the method compared with every other at an equal epoch budget")
    parser.add_argument("--save", default=None, help="a JSON file to write every run's figures to, traces included")
    args = parser.parse_args()
    chosen = ALL_METHODS if args.methods is None else ["full", "tune-asha", *args.methods.split(",")]
    unknown = sorted(set(chosen) - set(ALL_METHODS))
    if unknown:
        parser.error(f"--methods: unknown {', '.join(unknown)}; allowed: {', '.join(ALL_METHODS)}")
    not_installed = missing_bohb_packages() if "tune-bohb" in chosen else []
    import ray

    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    load_dataset("mnist1d")
    storage = tempfile.mkdtemp(prefix="nasplat-multifidelity-")
    results: dict[str, list[dict[str, Any]]] = {}
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        for name, options in methods(args).items():
            if name not in chosen:
                continue
            results.setdefault(name, []).append(run_nasplat(name, options, seed, args, storage))
            shown = {k: round(v, 4) for k, v in results[name][-1].items() if k != "trace"}
            print(f"seed {seed} {name}: {json.dumps(shown)}", file=sys.stderr, flush=True)
        results.setdefault("tune-asha", []).append(run_tune(seed, args, storage))
        print(f"seed {seed} tune-asha: {results['tune-asha'][-1]['best_valid']:.4f} "
              f"{results['tune-asha'][-1]['wall']:.1f} s", file=sys.stderr, flush=True)
        if "tune-bohb" in chosen and not not_installed:
            bohb = run_tune_bohb(seed, args, storage)
            results.setdefault("tune-bohb", []).append({**curve(bohb["rows"]), "wall": bohb["wall"],
                                                        "trials": bohb["trials"]})
            print(f"seed {seed} tune-bohb: {results['tune-bohb'][-1]['best_valid']:.4f} {bohb['wall']:.1f} s",
                  file=sys.stderr, flush=True)
    ray.shutdown()
    if args.save:
        Path(args.save).write_text(json.dumps({"args": vars(args), "results": results}))
    report(results, args, not_installed)


def missing_bohb_packages() -> list[str]:
    """'package: why' for each package Tune's BOHB needs that does not import."""
    missing = []
    for package in ("hpbandster", "ConfigSpace"):
        try:
            __import__(package)
        except ImportError as error:
            missing.append(f"{package}: {error}")
    return missing


def report(results: dict[str, list[dict[str, Any]]], args: argparse.Namespace, not_installed: list[str]) -> None:
    def mean(name: str, key: str) -> float:
        return float(np.mean([r[key] for r in results[name]]))

    print(f"MNIST-1D CNN search, {args.seeds} seeds, up to {args.max_steps} epochs a trial, concurrency "
          f"{args.concurrency}, train {args.train_size} / valid 800 / test 1000 signals (means)")
    print(f"{'method':<24}{'trials':>7}{'epochs':>8}{'best valid':>12}{'its test':>10}{'wall s':>9}")
    for name in results:
        print(f"{name:<24}{mean(name, 'trials'):>7.1f}{mean(name, 'epochs'):>8.1f}"
              f"{100 * mean(name, 'best_valid'):>12.2f}{100 * mean(name, 'best_test'):>10.2f}"
              f"{mean(name, 'wall'):>9.1f}")
    for name in results:
        if "parent_epochs" in results[name][0]:
            print(f"{name}: the parents evolution's tournaments chose had trained {mean(name, 'parent_epochs'):.1f} "
                  f"epochs on average, all its trials {mean(name, 'trial_epochs'):.1f}")
    full_best, full_epochs = mean("full", "best_valid"), mean("full", "epochs")
    third = int(full_epochs) // 3
    multi = [n for n in results if n.startswith(("asha-", "hyperband"))]
    at_third = {n: float(np.mean([at_epochs(r["trace"], third) for r in results[n]])) for n in multi}
    # the fewest epochs e after which the method's mean (over seeds) best-so-far is within 0.3 points of full's
    reach = {n: next((e for e in range(1, int(max(r["epochs"] for r in results[n])) + 1)
                      if np.mean([at_epochs(r["trace"], e) for r in results[n]]) >= full_best - 0.003), None)
             for n in multi}
    print(f"full random search's final best: {100 * full_best:.2f} after {full_epochs:.0f} epochs; a third: {third}")
    print(f"  {'method':<24}{'best after a third':>19}{'gap':>8}   epochs to within 0.3 points (mean trace)")
    for n in multi:
        print(f"  {n:<24}{100 * at_third[n]:>19.2f}{100 * (at_third[n] - full_best):>+8.2f}   "
              f"{'never' if reach[n] is None else f'{reach[n]} ({reach[n] / full_epochs:.3f}x)'}")
    fastest = min(multi, key=lambda n: (reach[n] is None, reach[n] or 0, -at_third[n]))
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
    model_based = model_based_comparison(results, args.model_based)
    print(json.dumps({
        "epochs_ratio_vs_full": None if reach[fastest] is None else round(reach[fastest] / full_epochs, 3),
        "ratio_variant": fastest,
        "full_best_valid": round(100 * full_best, 2),
        "best_valid_after_a_third": {n: round(100 * at_third[n], 2) for n in multi},
        "best_valid": {n: round(100 * mean(n, "best_valid"), 2) for n in results},
        "best_test": {n: round(100 * mean(n, "best_test"), 2) for n in results},
        "epochs": {n: round(mean(n, "epochs"), 1) for n in results},
        "tune_asha_best_valid": round(100 * mean("tune-asha", "best_valid"), 2),
        "equal_budget": {"variant": best, "nasplat": round(100 * equal[best], 2),
                         "tune": round(100 * tune_equal[best], 2)},
        "wall_ratio_vs_tune": round(mean(best, "wall") / mean("tune-asha", "wall"), 3),
        "wall": {n: round(mean(n, "wall"), 1) for n in results},
        "seeds": args.seeds,
        **model_based,
        "not_installed": not_installed,
    }))


def model_based_comparison(results: dict[str, list[dict[str, Any]]], model_based: str) -> dict[str, Any]:
    """The method `model_based` against every other method at an equal epoch budget (per seed, both methods' best
    after the fewer epochs of the two; means over seeds, the paired difference's standard error in points),
    printed, and its wall against Tune BOHB's."""
    if model_based not in results:
        return {}
    equal, sem = {}, {}
    print(f"{model_based} at an equal epoch budget with each method (best valid after min(epochs of both), per seed;"
          " the paired difference's standard error; seeds above / level / below):")
    for other, runs in results.items():
        if other == model_based:
            continue
        pairs = list(zip(results[model_based], runs))
        ours = np.array([at_epochs(m["trace"], min(m["epochs"], o["epochs"])) for m, o in pairs])
        theirs = np.array([at_epochs(o["trace"], min(m["epochs"], o["epochs"])) for m, o in pairs])
        gaps = 100 * (ours - theirs)
        error = float(np.std(gaps, ddof=1) / np.sqrt(len(gaps))) if len(gaps) > 1 else float("nan")
        equal[other] = [round(100 * float(ours.mean()), 2), round(100 * float(theirs.mean()), 2)]
        sem[other] = round(error, 2)
        print(f"  vs {other:<24} {100 * ours.mean():.2f} vs {100 * theirs.mean():.2f} ({gaps.mean():+.2f} ± "
              f"{error:.2f}; {int((gaps > 0).sum())} / {int((gaps == 0).sum())} / {int((gaps < 0).sum())})")
    out: dict[str, Any] = {"model_based": model_based, "model_based_equal_budget": equal,
                           "model_based_equal_budget_sem": sem,
                           "model_based_at_least_every_other": all(a >= b for a, b in equal.values())}
    if "tune-bohb" in results:
        ratio = np.mean([r["wall"] for r in results[model_based]]) / np.mean([r["wall"] for r in results["tune-bohb"]])
        out["wall_ratio_vs_tune_bohb"] = round(float(ratio), 3)
        print(f"{model_based} wall {ratio:.3f}x Tune BOHB's")
    return out


if __name__ == "__main__":
    main()
