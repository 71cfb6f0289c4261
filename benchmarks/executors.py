"""Trials per second of nasplat's own executors on no-op trials (issue 32): what the engine and an executor cost a
trial when the trial itself costs nothing.

Regularized evolution (population 50, tournament 10) on a closed-form objective, one step per trial, storage on (rows
and journal in a fresh temporary folder, TensorBoard off), after a 50-trial warm-up on the same executor kind:
`simulated` (4 virtual workers), `local` (one at a time) and `processes` (2 forked workers, concurrency 4) at the
sizes given. `--compare DIR` measures the code in DIR (another checkout) in the same run, each size alternately,
for a before/after ratio on the same machine load.

    python benchmarks/executors.py                               # simulated 10k, local 20k, processes 2k and 10k
    python benchmarks/executors.py --compare /tmp/old-checkout   # the same, old and new side by side

Last line: {"trials_per_s": {"simulated@10000": .., ...}, "compare": {...} or null}
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nasplat import Choice, Float, Int, Trainer

SPACE = {"x": Float(-3.0, 3.0), "y": Float(-3.0, 3.0), "k": Int(1, 16), "op": Choice(["a", "b", "c", "d"])}
RUNS = (("simulated", 10_000), ("local", 20_000), ("processes", 2_000), ("processes", 10_000))
CONCURRENCY = {"simulated": 4, "local": 1, "processes": 4}


class NoOp(Trainer):
    """A closed-form objective: one step, one simulated second, no work."""

    def setup(self, config, ctx):
        self.config = config

    def step(self):
        c = self.config
        return {"score": -(c["x"] - 1) ** 2 - (c["y"] + 0.5) ** 2 - 0.01 * (c["k"] - 9) ** 2 + (c["op"] == "b"),
                "time_cost": 1.0}


def trials_per_s(executor: str, trials: int) -> float:
    """Trials per second of one run with storage, after a 50-trial warm-up on the same executor."""
    import nasplat

    options = {"trainer": NoOp, "space": SPACE, "metric": "score", "mode": "max", "controller": "evolution",
               "controller_options": {"population_size": 50, "sample_size": 10}, "executor": executor,
               "concurrency": CONCURRENCY[executor], "max_steps": 1, "seed": 0,
               "executor_options": {"processes": 2} if executor == "processes" else {}}
    with tempfile.TemporaryDirectory() as tmp:
        nasplat.run(max_trials=50, storage=tmp, name="warmup", **options)
        start = time.perf_counter()
        result = nasplat.run(max_trials=trials, storage=tmp, name="timed", **options)
        elapsed = time.perf_counter() - start
    assert len(result.rows) == trials, len(result.rows)
    return trials / elapsed


def measure(runs: list[tuple[str, int]]) -> dict[str, float]:
    return {f"{executor}@{trials}": round(trials_per_s(executor, trials), 1) for executor, trials in runs}


def measure_in(code: Path, runs: list[tuple[str, int]]) -> dict[str, float]:
    """The same measurement with the nasplat of `code` first on the path, in a fresh interpreter."""
    env = {**os.environ, "PYTHONPATH": str(code), "NASPLAT_TENSORBOARD": "0"}
    spec = json.dumps(runs)
    out = subprocess.run([sys.executable, __file__, "--inner", spec], env=env, capture_output=True, text=True,
                         check=True, cwd=code).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compare", type=Path, default=None, help="another checkout to measure beside this one")
    parser.add_argument("--only", nargs="+", default=None, help="runs as executor@trials (default: all)")
    parser.add_argument("--inner", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ["NASPLAT_TENSORBOARD"] = "0"
    if args.inner is not None:
        print(json.dumps(measure([tuple(r) for r in json.loads(args.inner)])))
        return
    runs = list(RUNS) if args.only is None else [(o.split("@")[0], int(o.split("@")[1])) for o in args.only]
    here = Path(__file__).resolve().parents[1]
    new: dict[str, float] = {}
    old: dict[str, float] = {}
    for run in runs:  # alternately, so that both see the same load
        new.update(measure_in(here, [run]))
        if args.compare is not None:
            old.update(measure_in(args.compare.resolve(), [run]))
    print(f"{'run':<18} {'trials/s':>10}" + (f" {'compare':>10} {'ratio':>7}" if old else ""))
    for key, value in new.items():
        extra = f" {old[key]:>10.1f} {value / old[key]:>6.2f}x" if old else ""
        print(f"{key:<18} {value:>10.1f}{extra}")
    print(json.dumps({"trials_per_s": new, "compare": old or None}))


if __name__ == "__main__":
    main()
