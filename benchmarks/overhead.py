"""Per-trial overhead: 200 one-step no-op trials through nasplat's Ray executor and through Ray Tune.

Each runs on its own fresh embedded Ray (`ray.init(num_cpus=2)`, shut down afterwards), random search over one
float. Tune is measured as in ../shared/anchors/bench_tune_overhead.py (function trainable, one report,
`reuse_actors=True`, default run config); the timed region is the search itself (Tuner construction + fit;
nasplat.run), after `ray.init` returned, so both start from the same pool of idle Ray workers. Both keep their
results on disk, each in its own fresh temporary folder: Tune its experiment folder (`storage_path`), nasplat its
experiment folder (`storage`: every row appended, the state checkpointed).

    python benchmarks/overhead.py [--trials 200]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import ray
from ray import tune

import nasplat
from nasplat import Float, Trainer


class NoOp(Trainer):
    """One step that reports its config back."""

    def setup(self, config: dict[str, Any], ctx: nasplat.WorkerContext) -> None:
        self.x = config["x"]

    def step(self) -> dict[str, float]:
        return {"score": self.x}


def noop_trainable(config: dict[str, Any]) -> None:
    tune.report({"score": config["x"]})


def time_nasplat(trials: int, storage: str) -> float:
    started = time.perf_counter()
    result = nasplat.run(trainer=NoOp, space={"x": Float(0.0, 1.0)}, metric="score", executor="ray",
                         concurrency=2, max_trials=trials, seed=0, storage=storage, name="overhead")
    wall = time.perf_counter() - started
    assert len(result.ranked()) == trials, result.counts()
    assert (Path(storage) / "overhead" / "results.jsonl").stat().st_size > 0
    return wall


def time_tune(trials: int, storage: str) -> float:
    started = time.perf_counter()
    tuner = tune.Tuner(noop_trainable, param_space={"x": tune.uniform(0.0, 1.0)},
                       tune_config=tune.TuneConfig(num_samples=trials, metric="score", mode="max", reuse_actors=True),
                       run_config=tune.RunConfig(name="overhead", storage_path=storage))
    results = tuner.fit()
    wall = time.perf_counter() - started
    assert sum(r.error is None for r in results) == trials
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=200)
    args = parser.parse_args()
    ray.init(num_cpus=2)
    with tempfile.TemporaryDirectory() as storage:
        nasplat_s = time_nasplat(args.trials, storage)
    ray.shutdown()
    ray.init(num_cpus=2)
    with tempfile.TemporaryDirectory() as storage:
        tune_s = time_tune(args.trials, storage)
    ray.shutdown()
    ours, theirs = args.trials / nasplat_s, args.trials / tune_s
    print(f"both with storage: nasplat {ours:8.1f} trials/s ({nasplat_s:.2f} s)   Ray Tune (reuse_actors): "
          f"{theirs:6.1f} trials/s ({tune_s:.2f} s)   ratio {ours / theirs:.1f}x")
    print(json.dumps({"nasplat_trials_per_s": round(ours, 1), "tune_trials_per_s": round(theirs, 2),
                      "ratio": round(ours / theirs, 1)}))


if __name__ == "__main__":
    main()
