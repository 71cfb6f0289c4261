"""What storage costs per trial as an experiment grows, and whether resume still rebuilds it exactly.

Regularized evolution (population 50, tournament 10) on a cheap objective, on the `simulated` executor (one step per
trial, 4 virtual workers), at 1,000, 10,000 and 100,000 trials: once without storage and once with it (rows and
journal appended, fsynced at most every second). Reported per size: microseconds per trial with storage, and
without. The default TensorBoard writer (on where its package is installed: one event file per trial) is not
storage and is switched off here (`NASPLAT_TENSORBOARD=0`); its cost is printed once, at the smallest size.
A warm-up run of 50 trials with storage comes first, so that one-time imports are not counted per trial. Then the stored folder is replayed into a fresh engine, as `nasplat resume` does, and the rebuilt controller
must equal the live one (population, RNG state, next trial id) and every row must be kept.

    python benchmarks/storage_scale.py                   # 1k, 10k, 100k trials; ~2 minutes here
    python benchmarks/storage_scale.py --sizes 1000 10000

Last line: {"us_per_trial": {"1000": .., "10000": .., "100000": ..}, "no_storage_us_per_trial": .., "resume_exact": ..}
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from nasplat import Choice, Float, Int, Trainer
from nasplat.engine.replay import resume_engine
from nasplat.experiment.run import _build, _engine
from nasplat.storage import ExperimentFolder, read_spec

SPACE = {"x": Float(-3.0, 3.0), "y": Float(-3.0, 3.0), "k": Int(1, 16), "op": Choice(["a", "b", "c", "d"])}


class Cheap(Trainer):
    """A closed-form objective: one step, one simulated second."""

    def setup(self, config, ctx):
        self.config = config

    def step(self):
        c = self.config
        return {"score": -(c["x"] - 1) ** 2 - (c["y"] + 0.5) ** 2 - 0.01 * (c["k"] - 9) ** 2 + (c["op"] == "b"),
                "time_cost": 1.0}


def spec(trials: int, storage: str | None) -> dict:
    return dict(trainer=Cheap, controller="evolution", space=SPACE, metric="score", mode="max", executor="simulated",
                concurrency=4, max_trials=trials, time_budget_s=None, max_steps=1, max_failures=0,
                max_failed_trials=10, seed=0, name="scale", storage=storage, checkpoint=None,
                controller_options={"population_size": 50, "sample_size": 10}, executor_options={}, callbacks=[])


def timed_run(trials: int, storage: str | None) -> tuple[float, object]:
    """Microseconds per trial of one run, and its engine (to compare the controller afterwards)."""
    built = _build(spec(trials, storage))
    folder = None
    if storage is not None:
        folder = ExperimentFolder(Path(storage) / "scale")
        import cloudpickle

        folder.create({"experiment.pkl": cloudpickle.dumps(spec(trials, storage))})
    engine = _engine(built, folder, progress=False)
    began = time.perf_counter()
    engine.run()
    return (time.perf_counter() - began) / trials * 1e6, engine


def same_state(a: dict, b: dict) -> bool:
    """Controller states equal, numpy arrays compared by value."""
    return json.dumps(a, sort_keys=True, default=lambda v: np.asarray(v).tolist()) == json.dumps(
        b, sort_keys=True, default=lambda v: np.asarray(v).tolist())


def main() -> None:
    os.environ["NASPLAT_TENSORBOARD"] = "0"
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000])
    args = parser.parse_args()
    per_trial, bare, exact = {}, [], True
    with tempfile.TemporaryDirectory() as tmp:  # warm-up: one-time imports (pyarrow.fs, ...) are not per trial
        timed_run(50, tmp)
    for size in args.sizes:
        with tempfile.TemporaryDirectory() as tmp:
            bare_us, _ = timed_run(size, None)
            stored_us, live = timed_run(size, tmp)
            folder = ExperimentFolder(Path(tmp) / "scale")
            rows, journal = folder.open_existing()
            began = time.perf_counter()
            fresh = _engine(_build(read_spec(folder.path, allow_pickle=True)), folder, progress=False)  # its own folder
            line = resume_engine(fresh, rows, journal)
            replay_s = time.perf_counter() - began
            folder.close()
            ok = same_state(live.controller.state_dict(), fresh.controller.state_dict()) and len(rows) == size
            exact &= ok
        per_trial[str(size)], bare = round(stored_us, 1), bare + [bare_us]
        print(f"{size:>7} trials: {stored_us:7.1f} us/trial with storage, {bare_us:7.1f} without; "
              f"replay {replay_s:.1f} s, controller rebuilt exactly: {ok} ({line})", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["NASPLAT_TENSORBOARD"] = "1"
        tensorboard_us, _ = timed_run(min(args.sizes), tmp)
        print(f"{min(args.sizes):>7} trials with the default TensorBoard writer on as well: {tensorboard_us:.1f} us/trial")
    print(json.dumps({"us_per_trial": per_trial, "no_storage_us_per_trial": round(float(np.mean(bare)), 1),
                      "resume_exact": exact}))


if __name__ == "__main__":
    main()
