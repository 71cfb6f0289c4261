"""PBT on the PBT paper's toy problem: two members, 200 steps, exploit/explore every 10 steps.

Prints the best true objective Q reached with PBT and by each member trained alone with its fixed h.

    python benchmarks/pbt_toy.py [--executor local|ray]
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import nasplat
from trainers.pbt_toy import MEMBERS, PBTToy, space


def run_pbt(executor: str = "local", steps: int = 200, interval: int = 10, seed: int = 0,
            **options: Any) -> nasplat.ExperimentResult:
    """Two members from MEMBERS under PBT."""
    controller = nasplat.PopulationBasedTraining(space, metric="Q", population_size=2, perturbation_interval=interval,
                                                 quantile_fraction=0.5, resample_probability=0.25,
                                                 initial_configs=MEMBERS, seed=seed)
    return nasplat.run(trainer=PBTToy, controller=controller, executor=executor, concurrency=2, max_trials=2,
                       max_steps=steps, seed=seed, **options)


def run_fixed(executor: str = "local", steps: int = 200, **options: Any) -> nasplat.ExperimentResult:
    """The same two members trained alone, h fixed (no PBT)."""
    controller = nasplat.PopulationBasedTraining(space, metric="Q", population_size=2, perturbation_interval=steps + 1,
                                                 quantile_fraction=0.5, initial_configs=MEMBERS)
    return nasplat.run(trainer=PBTToy, controller=controller, executor=executor, concurrency=2, max_trials=2,
                       max_steps=steps, **options)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--executor", default="local", choices=["local", "ray"])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--interval", type=int, default=10)
    args = parser.parse_args()
    pbt = run_pbt(args.executor, args.steps, args.interval)
    fixed = run_fixed(args.executor, args.steps)
    frame = pbt.dataframe()
    exploits = int(frame["donor_id"].notna().sum())
    pbt_q, fixed_q = pbt.best["Q"], fixed.best["Q"]
    print(f"PBT best Q {pbt_q:.4f} ({exploits} exploits); members alone with fixed h: best Q {fixed_q:.4f}")
    print(json.dumps({"pbt_best_q": round(pbt_q, 4), "fixed_h_best_q": round(fixed_q, 4), "exploits": exploits}))


if __name__ == "__main__":
    main()
