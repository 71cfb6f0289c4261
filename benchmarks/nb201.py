"""Reproduce Table 5 of NAS-Bench-201 (Dong & Yang, ICLR 2020) through nasplat's `simulated` executor.

Protocol (../shared/data/README.md): 12,000 simulated seconds per search, one worker; each evaluation
costs 12 training epochs plus a validation pass and returns the 12-epoch validation accuracy; the search
returns the cell with the best validation accuracy and is scored by its 200-epoch test accuracy.

    python benchmarks/nb201.py --runs 500
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import nasplat
from search_spaces.nb201 import space_for
from trainers.nb201_table import NB201Table, best_possible

PUBLISHED = {"cifar10": {"rea": (93.92, 0.30), "reinforce": (93.85, 0.37), "random": (93.70, 0.36)}}
CONTROLLERS = {
    "rea": ("evolution", {"population_size": 10, "sample_size": 3}),
    "reinforce": ("reinforce", {"learning_rate": 0.05, "baseline_decay": 0.9}),
    "random": ("random", {}),
}


def search(dataset: str, algorithm: str, seed: int, budget_s: float) -> float:
    """One seeded search; the 200-epoch test accuracy of the cell with the best validation accuracy."""
    name, options = CONTROLLERS[algorithm]
    result = nasplat.run(trainer=NB201Table, space=space_for(dataset), controller=name, controller_options=options,
                         metric="valid_acc", executor="simulated", time_budget_s=budget_s, seed=seed)
    return float(result.best["test_acc"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--budget", type=float, default=12_000.0, help="simulated seconds per search")
    parser.add_argument("--datasets", nargs="+", default=["cifar10", "cifar100"])
    args = parser.parse_args()
    started = time.perf_counter()
    summary: dict[str, dict[str, dict[str, float]]] = {}
    for dataset in args.datasets:
        print(f"\n{dataset}: {args.runs} runs, {args.budget:.0f} s budget (optimal cell: {best_possible(dataset):.2f})")
        print(f"{'algorithm':<10} {'nasplat':>16} {'published':>16} {'diff':>7}")
        summary[dataset] = {}
        for algorithm in CONTROLLERS:
            accs = np.array([search(dataset, algorithm, seed, args.budget) for seed in range(args.runs)])
            mean, std = float(accs.mean()), float(accs.std())
            summary[dataset][algorithm] = {"mean": round(mean, 3), "std": round(std, 3)}
            pub = PUBLISHED.get(dataset, {}).get(algorithm)
            pub_text = f"{pub[0]:.2f} ± {pub[1]:.2f}" if pub else "-"
            diff = f"{mean - pub[0]:+.2f}" if pub else ""
            print(f"{algorithm:<10} {mean:>8.2f} ± {std:.2f} {pub_text:>16} {diff:>7}", flush=True)
    head = args.datasets[0]
    print(json.dumps({"dataset": head, "runs": args.runs, **summary[head],
                      "seconds": round(time.perf_counter() - started, 1)}))


if __name__ == "__main__":
    main()
