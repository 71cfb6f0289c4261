"""Reproduce Table 5 of NAS-Bench-201 (Dong & Yang, ICLR 2020) through nasplat's `simulated` executor.

Protocol (../shared/data/README.md): 12,000 simulated seconds per search, one worker; each evaluation
costs 12 training epochs plus a validation pass and returns the 12-epoch validation accuracy; the search
returns the cell with the best validation accuracy and is scored by its 200-epoch test accuracy.
Besides the published algorithms, nasplat's local search and predictor run under the same protocol;
each row prints the mean, the standard deviation, the standard error and the mean number of evaluations.
`--predictor-runs` caps the predictor's runs (it trains a small ensemble at every step: ~1 s of wall time
per search against ~10 ms for the others), and `--only` picks algorithms.

    python benchmarks/nb201.py --runs 500
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import nasplat
from search_spaces.nb201 import space_for
from trainers.nb201_table import NB201Protocol, best_possible

PUBLISHED = {"cifar10": {"rea": (93.92, 0.30), "reinforce": (93.85, 0.37), "random": (93.70, 0.36)}}
CONTROLLERS = {
    "rea": ("evolution", {"population_size": 10, "sample_size": 3}),
    # 0.045: the rate applied until REINFORCE stopped scaling it by the baseline decay (0.9 x 0.05), which
    # reproduces Table 5; the same 0.05 applied as given now makes 93.77 ± 0.60 (500 runs)
    "reinforce": ("reinforce", {"learning_rate": 0.045, "baseline_decay": 0.9}),
    "random": ("random", {}),
    "local_search": ("local_search", {"initial_samples": 10}),
    "predictor": ("predictor", {}),
}
GOAL = {"cifar10": 94.25}  # the goal for the predictor's mean test accuracy


def search(dataset: str, algorithm: str, seed: int, budget_s: float) -> tuple[float, int]:
    """One seeded search: the 200-epoch test accuracy of the cell with the best validation accuracy, and the
    number of evaluations made."""
    name, options = CONTROLLERS[algorithm]
    result = nasplat.run(trainer=NB201Protocol, space=space_for(dataset), controller=name, controller_options=options,
                         metric="valid_acc", executor="simulated", time_budget_s=budget_s, seed=seed)
    return float(result.best["test_acc"]), len(result.dataframe())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--budget", type=float, default=12_000.0, help="simulated seconds per search")
    parser.add_argument("--datasets", nargs="+", default=["cifar10", "cifar100"])
    parser.add_argument("--only", nargs="+", choices=list(CONTROLLERS), default=list(CONTROLLERS))
    parser.add_argument("--predictor-runs", type=int, default=None, help="runs of the predictor (default: --runs)")
    parser.add_argument("--progress", action="store_true", help="print every run's outcome as it ends")
    args = parser.parse_args()
    started = time.perf_counter()
    summary: dict[str, dict[str, dict[str, float]]] = {}
    for dataset in args.datasets:
        print(f"\n{dataset}: {args.runs} runs, {args.budget:.0f} s budget (optimal cell: {best_possible(dataset):.2f})")
        print(f"{'algorithm':<13} {'runs':>5} {'nasplat':>16} {'s.e.':>6} {'evals':>6} {'published':>16} {'diff':>7}")
        summary[dataset] = {}
        for algorithm in args.only:
            runs = args.predictor_runs if algorithm == "predictor" and args.predictor_runs else args.runs
            outcomes = []
            for seed in range(runs):
                outcomes.append(search(dataset, algorithm, seed, args.budget))
                if args.progress:
                    print(f"  {dataset} {algorithm} seed {seed}: test acc {outcomes[-1][0]:.2f}, "
                          f"{outcomes[-1][1]} evaluations", flush=True)
            outcomes = np.array(outcomes)
            accs, evals = outcomes[:, 0], outcomes[:, 1]
            mean, std, sem = float(accs.mean()), float(accs.std()), float(accs.std(ddof=1) / np.sqrt(runs))
            summary[dataset][algorithm] = {"mean": round(mean, 3), "std": round(std, 3), "sem": round(sem, 3),
                                           "evals": round(float(evals.mean()), 1), "runs": runs}
            pub = PUBLISHED.get(dataset, {}).get(algorithm)
            pub_text = f"{pub[0]:.2f} ± {pub[1]:.2f}" if pub else "-"
            diff = f"{mean - pub[0]:+.2f}" if pub else ""
            print(f"{algorithm:<13} {runs:>5} {mean:>8.2f} ± {std:.2f} {sem:>6.3f} {evals.mean():>6.1f} "
                  f"{pub_text:>16} {diff:>7}", flush=True)
        _compare(dataset, summary[dataset])
    head = args.datasets[0]
    print(json.dumps({"dataset": head, "runs": args.runs, **summary[head],
                      "seconds": round(time.perf_counter() - started, 1)}))


def _compare(dataset: str, rows: dict[str, dict[str, float]]) -> None:
    """The predictor against local search and REA: the gap in standard errors of the difference; the goal."""
    if "predictor" not in rows:
        return
    ours = rows["predictor"]
    for other in ("local_search", "rea"):
        if other in rows:
            gap = ours["mean"] - rows[other]["mean"]
            sem = float(np.hypot(ours["sem"], rows[other]["sem"]))
            print(f"predictor - {other}: {gap:+.3f} ({gap / sem:+.1f} standard errors of the difference)")
    if dataset in GOAL:
        print(f"goal {GOAL[dataset]:.2f}: predictor {ours['mean']:.3f} ({ours['mean'] - GOAL[dataset]:+.3f})")


if __name__ == "__main__":
    main()
