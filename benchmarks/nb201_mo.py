"""Accuracy against size on NAS-Bench-201 (CIFAR-10): the hypervolume of each search's Pareto front.

Protocol (../shared/data/README.md, as benchmarks/nb201.py runs it): 12,000 simulated seconds per search on one
worker; an evaluation costs `12 * train_s_per_epoch + valid_s_per_epoch` and returns the 12-epoch validation
accuracy. Two objectives: validation accuracy (max) and parameters in millions (min). Each search's final front
(non-dominated on those two, over every cell it evaluated) is then scored by the 200-epoch *test* accuracy of its
members: the hypervolume of {(test_acc, params_mb)} up to a fixed reference point. Side by side, same seeds and
the same budget: nasplat's multi-objective regularized evolution, nasplat's random search, Optuna's NSGA-II
through nasplat's `OptunaSampler`, and Syne Tune's `MultiObjectiveRegularizedEvolution` (the anchor), driven
ask/tell here against the same table on the same simulated clock, with the same population and sample sizes.

    python benchmarks/nb201_mo.py --runs 100
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import numpy as np

import nasplat
from nasplat.controllers import OptunaSampler
from nasplat.core import pareto
from search_spaces.nb201 import EDGES, OPS, space_for
from trainers.nb201_table import NB201Protocol, cell_code, load_table

METRICS, MODES = ["valid_acc", "params_mb"], ["max", "min"]
REFERENCE = (80.0, 1.6)  # (200-epoch test accuracy %, parameters in millions): worse than every front member
# Settings picked on pilot seeds 1000-1039 (reported runs use seeds 0..runs-1): the best of population/sample
# (10, 3), (10, 5), (20, 5), (20, 10), (30, 5), (50, 10) for nasplat's evolution, given to Syne Tune's alike;
# the best NSGA-II population of 10, 20, 50.
POPULATION, SAMPLE = 20, 10
NSGA2_POPULATION = 10


def score(members: list[dict[str, float]]) -> float:
    """Hypervolume of the 200-epoch test accuracy and size of a front's members."""
    points = np.array([[m["test_acc"], m["params_mb"]] for m in members]).reshape(-1, 2)
    return pareto.hypervolume(points * pareto.signs(MODES), np.array(REFERENCE) * pareto.signs(MODES))


def nasplat_front(controller: str | OptunaSampler, seed: int, budget_s: float,
                  options: dict[str, int] | None = None) -> list[dict[str, float]]:
    """One seeded nasplat search on the simulated executor; its final front's rows."""
    result = nasplat.run(trainer=NB201Protocol, space=space_for("cifar10"), controller=controller, metric=METRICS,
                         mode=MODES, controller_options=options, executor="simulated", time_budget_s=budget_s,
                         seed=seed)
    return result.pareto_front()


def nasplat_morea(seed: int, budget_s: float) -> list[dict[str, float]]:
    return nasplat_front("mo_evolution", seed, budget_s, {"population_size": POPULATION, "sample_size": SAMPLE})


def nasplat_random(seed: int, budget_s: float) -> list[dict[str, float]]:
    return nasplat_front("random", seed, budget_s)


def optuna_nsga2(seed: int, budget_s: float) -> list[dict[str, float]]:
    import optuna

    sampler = optuna.samplers.NSGAIISampler(population_size=NSGA2_POPULATION, seed=seed)
    controller = OptunaSampler(space_for("cifar10"), sampler=sampler, metric=METRICS, mode=MODES, seed=seed)
    return nasplat_front(controller, seed, budget_s)


def synetune_morea(seed: int, budget_s: float) -> list[dict[str, float]]:
    """Syne Tune's searcher, ask/tell, on the same table and clock: a cell starts while the clock is under the
    budget and its result counts when it ends (as nasplat's simulated executor does)."""
    from syne_tune.config_space import choice
    from syne_tune.optimizer.schedulers.multiobjective import MultiObjectiveRegularizedEvolution

    np.random.seed(seed)  # Syne Tune samples its random configs from NumPy's global RNG
    searcher = MultiObjectiveRegularizedEvolution({edge: choice(list(OPS)) for edge in EDGES},
                                                  population_size=POPULATION, sample_size=SAMPLE, random_seed=seed)
    table = load_table("cifar10")
    clock, rows = 0.0, []
    while clock < budget_s:
        config = searcher.suggest()
        code = cell_code(config)
        row = {"trial_id": len(rows), **{k: float(table[k][code]) for k in ("valid_acc", "test_acc", "params_mb")}}
        clock += float(table["time_cost"][code])
        searcher.on_trial_complete(len(rows), config, [-row["valid_acc"], row["params_mb"]])  # Syne Tune minimises
        rows.append(row)
    return pareto.front_rows(rows, METRICS, MODES)


ALGORITHMS: dict[str, Callable[[int, float], list[dict[str, float]]]] = {
    "nasplat_morea": nasplat_morea, "random": nasplat_random, "optuna_nsga2": optuna_nsga2,
    "synetune_morea": synetune_morea,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--budget", type=float, default=12_000.0, help="simulated seconds per search")
    parser.add_argument("--first-seed", type=int, default=0)
    args = parser.parse_args()
    table = load_table("cifar10")
    best = pareto.front_rows([{"trial_id": i, "valid_acc": a, "test_acc": a, "params_mb": p} for i, (a, p) in
                              enumerate(zip(table["test_acc"], table["params_mb"]))], ["test_acc", "params_mb"], MODES)
    print(f"NAS-Bench-201 cifar10, {args.runs} runs of {args.budget:.0f} simulated s; objectives {METRICS} {MODES}; "
          f"hypervolume of the fronts' (test_acc, params_mb) up to reference {REFERENCE}; the whole table's own "
          f"front (by test accuracy): {score(best):.3f}")
    seeds = range(args.first_seed, args.first_seed + args.runs)
    summary: dict[str, dict[str, float]] = {}
    samples: dict[str, np.ndarray] = {}
    print(f"{'algorithm':<16} {'hypervolume':>20} {'front size':>11} {'seconds':>8}")
    for name, search in ALGORITHMS.items():
        started = time.perf_counter()
        fronts = [search(seed, args.budget) for seed in seeds]
        values = np.array([score(front) for front in fronts])
        samples[name] = values
        se = float(values.std(ddof=1) / np.sqrt(len(values))) if len(values) > 1 else 0.0
        summary[name] = {"mean": round(float(values.mean()), 4), "se": round(se, 4)}
        print(f"{name:<16} {values.mean():>11.4f} ± {se:.4f} {np.mean([len(f) for f in fronts]):>11.1f} "
              f"{time.perf_counter() - started:>8.1f}", flush=True)
    ours, rand = samples["nasplat_morea"], samples["random"]
    gap_se = float(np.sqrt(ours.var(ddof=1) / len(ours) + rand.var(ddof=1) / len(rand))) if len(ours) > 1 else 0.0
    gap = float(ours.mean() - rand.mean())
    print(f"nasplat_morea - random = {gap:.4f} = {gap / gap_se if gap_se else float('nan'):.1f} standard errors; "
          f"nasplat_morea / synetune_morea = {ours.mean() / samples['synetune_morea'].mean():.4f}")
    print(json.dumps({"runs": args.runs, "reference_point": list(REFERENCE), "hypervolume": summary}))


if __name__ == "__main__":
    main()
