"""Regularized evolution on NAS-Bench-201 with 1 to 1,000 virtual workers, through nasplat's `simulated` executor.

Every run gets the same simulated wall-clock budget: 12,000 s, the benchmark's own protocol for one worker
(../shared/data/README.md; Dong & Yang 2020, Table 5). One evaluation (12 epochs + validation) costs ~130 s,
so one worker makes ~90 evaluations: 10 random cells, then ~80 mutations, enough for evolution to beat
random search (published REA: 93.92 ± 0.30). N workers make ~90·N evaluations in the same wall time; at
1,000 workers that is ~90,000, six times the 15,625 cells: the question is what parallelism buys under a
fixed deadline, and where it stops paying. The controller is fixed (population 10, tournament 3) so that
only the number of workers changes. Reported per worker count: the 200-epoch test accuracy of the cell
with the best validation accuracy (mean over seeds), the simulated time at which that cell was first
evaluated (what more workers buy once the accuracy saturates), and the real time per 10,000 evaluations.

    python benchmarks/scale.py                      # 1, 10, 100, 1000 workers x 5 seeds, ~1 minute
    python benchmarks/scale.py --profile 1000       # plus a cProfile of one 1,000-worker search
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time

import numpy as np

import nasplat
from search_spaces.nb201 import space_for
from trainers.nb201_table import NB201Protocol, best_possible, load_table

EVOLUTION = {"population_size": 10, "sample_size": 3}


def search(workers: int, seed: int, budget_s: float, dataset: str) -> tuple[float, int, float, float]:
    """One seeded search: (test accuracy of the best-validation cell, evaluations, wall seconds, simulated
    seconds until that cell's validation accuracy was first reported)."""
    started = time.perf_counter()
    result = nasplat.run(trainer=NB201Protocol, space=space_for(dataset), controller="evolution",
                         controller_options=EVOLUTION, metric="valid_acc", executor="simulated",
                         concurrency=workers, time_budget_s=budget_s, seed=seed)
    wall = time.perf_counter() - started
    best = result.best  # a property that ranks every row: read it once
    evaluations = sum(1 for row in result.rows if row["status"] == "completed")
    found = min(row["end"] for row in result.rows if row.get("valid_acc") == best["valid_acc"])
    return float(best["test_acc"]), evaluations, wall, found


def profile(workers: int, budget_s: float, dataset: str, top: int = 15) -> str:
    """cProfile of one search: the functions with the most own time, and the engine's wall time."""
    profiler = cProfile.Profile()
    profiler.enable()
    _, evaluations, wall, _ = search(workers, 0, budget_s, dataset)
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    return f"{workers} workers, {evaluations} evaluations, {wall:.2f} s under the profiler\n{out.getvalue()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 10, 100, 1000])
    parser.add_argument("--seeds", type=int, default=5, help="seeded searches per worker count")
    parser.add_argument("--budget", type=float, default=12_000.0, help="simulated seconds per search")
    parser.add_argument("--dataset", default="cifar10", choices=["cifar10", "cifar100"])
    parser.add_argument("--profile", type=int, metavar="WORKERS", help="also cProfile one search at this size")
    args = parser.parse_args()
    if any(n < 1 for n in args.workers) or args.seeds < 1 or not args.budget > 0:
        parser.error(f"workers must be >= 1, seeds >= 1 and budget > 0; got {args.workers}, {args.seeds}, "
                     f"{args.budget}")
    load_table(args.dataset)  # read the table once, outside the timings
    print(f"regularized evolution {EVOLUTION} on NAS-Bench-201 {args.dataset}, {args.budget:,.0f} simulated s, "
          f"{args.seeds} seeds (best cell in the table: {best_possible(args.dataset):.2f})")
    print(f"{'workers':>8} {'test acc':>15} {'evaluations':>12} {'sim s to best':>14} {'wall s':>8} "
          f"{'wall s / 10k evals':>19}")
    summary: dict[str, list[float]] = {"workers": [], "test_acc": [], "wall_s_per_10k_evals": []}
    for workers in args.workers:
        runs = [search(workers, seed, args.budget, args.dataset) for seed in range(args.seeds)]
        accs = np.array([r[0] for r in runs])
        evaluations, wall = sum(r[1] for r in runs), sum(r[2] for r in runs)
        per_10k = wall / evaluations * 10_000
        found = np.mean([r[3] for r in runs])
        print(f"{workers:>8} {accs.mean():>8.2f} ± {accs.std():.2f} {evaluations / args.seeds:>12,.0f} "
              f"{found:>14,.0f} {wall / args.seeds:>8.2f} {per_10k:>19.2f}", flush=True)
        summary["workers"].append(workers)
        summary["test_acc"].append(round(float(accs.mean()), 3))
        summary["wall_s_per_10k_evals"].append(round(per_10k, 3))
    if args.profile:
        print(profile(args.profile, args.budget, args.dataset))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
