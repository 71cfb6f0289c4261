"""Accuracy against inference latency: multi-objective evolution over the CNN space on digits, its front drawn.

    python examples/pareto.py                          # local executor, about a minute on two cores
    python examples/pareto.py --executor ray --storage results

Prints the Pareto front (trials no other trial beats on both accuracy and latency, among those under the
parameter bound) and draws every trial with the front in red into `pareto.png` in the experiment folder.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from matplotlib.figure import Figure

import nasplat
from search_spaces.cnn import space
from trainers.classification import ClassificationTrainer

METRICS, MODES = ["valid_acc", "latency_ms"], ["max", "min"]  # selected on validation; test only reported
CONSTRAINTS = ["params <= 50000"]


def draw(result: nasplat.ExperimentResult, path: Path) -> Path:
    """Every trial's latest result by latency and accuracy; the front in red."""
    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.subplots()
    latest = {row["trial_id"]: row for row in result.rows if row["status"] != "failed"}
    ax.scatter([r["latency_ms"] for r in latest.values()], [r["valid_acc"] for r in latest.values()], s=14,
               color="#b8bec6", label="trial")
    front = sorted(result.pareto_front(), key=lambda r: r["latency_ms"])
    ax.step([r["latency_ms"] for r in front], [r["valid_acc"] for r in front], where="post", color="#d62728")
    ax.scatter([r["latency_ms"] for r in front], [r["valid_acc"] for r in front], s=26, color="#d62728",
               label=f"Pareto front ({len(front)})")
    ax.set_xlabel("inference latency, one digit [ms] (min)")
    ax.set_ylabel("validation accuracy (max)")
    ax.legend()
    fig.savefig(path, dpi=120)
    return path


def main(argv: list[str] | None = None) -> nasplat.ExperimentResult:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--executor", choices=["local", "ray"], default="local")
    parser.add_argument("--storage", default="results")
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    result = nasplat.run(trainer=ClassificationTrainer, space=space, controller="mo_evolution",
                         controller_options={"population_size": 6, "sample_size": 3}, metric=METRICS, mode=MODES,
                         constraints=CONSTRAINTS, executor=args.executor,
                         concurrency=2 if args.executor == "ray" else 1,
                         max_trials=args.trials, max_steps=2, seed=args.seed, storage=args.storage,
                         name=f"pareto-{args.executor}-{args.seed}")
    print(f"Pareto front of {METRICS} {MODES} under {CONSTRAINTS}:")
    for row in result.pareto_front():
        print(f"  trial {row['trial_id']:>3}: valid_acc {row['valid_acc']:.4f} (test_acc {row['test_acc']:.4f})  "
              f"latency {row['latency_ms']:.3f} ms  "
              f"params {row['params']:.0f}")
    print(f"figure: {draw(result, result.path / 'pareto.png')}")
    return result


if __name__ == "__main__":
    main()
