"""Checkpoint cost: step time with a checkpoint after every step against none, nasplat against Ray Tune.

The ~10.5 M-parameter MLP of pbt_exploit.py (with SGD momentum: ~84 MB of state), `--inner` SGD iterations per
step, calibrated to about one second. One trial at a time on a Ray actor with one CPU, in one run:
- nasplat: the `ray` executor with checkpoint storage; `step(save=k)` copies the state on the worker and its writer
  thread serialises and writes it (`checkpoints/trial-<id>/step-<k>/`) while the next step runs;
- Ray Tune: the trainable `torch.save`s its state into a temporary folder and calls
  `tune.report(metrics, checkpoint=Checkpoint.from_directory(folder))` every step, into Tune's default storage
  (~/ray_results); the comparison run calls `tune.report(metrics)`.
Step time = worker-clock time between the starts of consecutive steps (everything between two steps counts), the
median over `--rounds` trials of `--steps` steps (the first two intervals of each left out), run in the order
nasplat, Tune, nasplat, each alternating without and with checkpoints, since the load on the machine drifts.
Overhead = (with checkpoints - without) / without.

    python benchmarks/checkpoint.py [--steps 8] [--rounds 2] [--inner N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import ray
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pbt_exploit import make_model, train_step  # noqa: E402

from nasplat import Trainer  # noqa: E402
from nasplat.executors.ray.executor import RayExecutor  # noqa: E402
from nasplat.storage import Storage  # noqa: E402

WARMUP = 2  # step intervals left out: the first steps page memory in


class TimedMLP(Trainer):
    """`inner` SGD iterations per step; reports when the step began (worker clock)."""

    def setup(self, config: dict[str, Any], ctx: Any) -> None:
        torch.set_num_threads(1)
        torch.manual_seed(ctx.seed)
        self.model, self.inner, self.t = make_model(), config["inner"], 0
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3, momentum=0.9)

    def step(self) -> dict[str, Any]:
        began = time.time()
        for _ in range(self.inner):
            self.t += 1
            loss = train_step(self.model, self.opt, self.t)
        return {"neg_loss": -loss, "began": began}

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "opt": self.opt.state_dict(), "t": self.t}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["opt"])
        self.t = state["t"]


def calibrate(target_s: float = 1.0) -> int:
    """SGD iterations that take about `target_s` on one thread here (the fastest of 8 timings: the load on a shared
    machine only ever slows them down)."""
    torch.set_num_threads(1)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    times = []
    for seed in range(8):
        began = time.perf_counter()
        train_step(model, opt, seed)
        times.append(time.perf_counter() - began)
    return max(1, round(target_s / min(times[1:])))


def intervals(began: list[float]) -> list[float]:
    """Times between the starts of consecutive steps, the first `WARMUP` left out."""
    return [b - a for a, b in zip(began, began[1:])][WARMUP:]


def nasplat_steps(steps: int, inner: int, save: bool, folder: str) -> tuple[list[float], int]:
    """Step times of one trial on the ray executor (saving after every step or not); checkpoints written."""
    executor = RayExecutor(concurrency=1, cpus_per_trial=1)
    executor.open(TimedMLP, f"checkpoint-bench-{uuid.uuid4().hex[:6]}", Storage(folder))
    executor.launch(0, {"inner": inner}, seed=0)
    began, written, done = [], 0, 0
    while done < steps or written < (steps if save else 0):
        for event in executor.wait():
            for checkpoint in event.saved:
                assert checkpoint.uri is not None, checkpoint.error
                written += 1
            assert event.error is None, event.error
            if event.metrics is None:
                continue
            began.append(event.metrics["began"])
            done += 1
            if done < steps:
                executor.step(0, save=done if save else None)
            else:
                executor.stop(0, save=done if save else None)
    executor.close()
    return intervals(began), written


def tune_steps(steps: int, inner: int, rounds: int) -> dict[bool, list[float]]:
    """Step times of Tune trials reporting with a checkpoint every step and without, alternating, `rounds` each."""
    from ray import tune

    def trainable(config: dict[str, Any]) -> None:
        trainer = TimedMLP()
        trainer.setup({"inner": config["inner"]}, type("Ctx", (), {"seed": 0})())
        for _ in range(config["steps"]):
            metrics = trainer.step()
            if config["save"]:
                with tempfile.TemporaryDirectory() as folder:
                    torch.save(trainer.state_dict(), os.path.join(folder, "state.pt"))
                    tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(folder))
            else:
                tune.report(metrics)

    name = f"nasplat-checkpoint-bench-{uuid.uuid4().hex[:6]}"
    tuner = tune.Tuner(tune.with_resources(trainable, {"cpu": 1}),
                       param_space={"inner": inner, "steps": steps,
                                    "save": tune.grid_search([False, True] * rounds)},
                       tune_config=tune.TuneConfig(max_concurrent_trials=1),
                       run_config=tune.RunConfig(name=name, verbose=0))
    results = tuner.fit()
    out: dict[bool, list[float]] = {False: [], True: []}
    for result in results:
        assert result.error is None, result.error
        out[result.config["save"]] += intervals(list(result.metrics_dataframe["began"]))
    shutil.rmtree(os.path.join(os.path.expanduser("~"), "ray_results", name), ignore_errors=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8, help="steps per trial")
    parser.add_argument("--rounds", type=int, default=2, help="trials per case and system")
    parser.add_argument("--inner", type=int, help="SGD iterations per step (default: about one second's worth)")
    args = parser.parse_args()
    if args.steps < WARMUP + 3:
        raise SystemExit(f"--steps must be >= {WARMUP + 3}, got {args.steps}")
    inner = args.inner or calibrate()
    here = os.path.dirname(os.path.abspath(__file__))  # the workers import pbt_exploit from here
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    ours: dict[bool, list[float]] = {False: [], True: []}
    written = 0
    with tempfile.TemporaryDirectory(dir=os.path.expanduser("~")) as folder:  # the same disk as Tune's storage
        for part in range(2):  # nasplat, Tune, nasplat: the load on the machine drifts
            for _ in range(args.rounds // 2 if part == 0 else args.rounds - args.rounds // 2):
                for save in (False, True):
                    times, count = nasplat_steps(args.steps, inner, save, folder)
                    ours[save] += times
                    written += count
            if part == 0:
                theirs = tune_steps(args.steps, inner, args.rounds)
        state_mb = (Path(folder) / "trial-0" / "step-1" / "state.pt").stat().st_size / 1e6
    ray.shutdown()
    plain, saving = statistics.median(ours[False]), statistics.median(ours[True])
    tune_plain, tune_saving = statistics.median(theirs[False]), statistics.median(theirs[True])
    ours_pct = 100 * (saving - plain) / plain
    theirs_pct = 100 * (tune_saving - tune_plain) / tune_plain
    print(f"{inner} SGD iterations per step; {written} checkpoints of {state_mb:.0f} MB written by nasplat; "
          f"medians over {len(ours[True])} steps per case")
    print(f"nasplat: {plain:.3f} s per step without checkpoints, {saving:.3f} s with one every step: "
          f"{ours_pct:+.1f}%")
    print(f"Ray Tune: {tune_plain:.3f} s per step without, {tune_saving:.3f} s with: {theirs_pct:+.1f}%")
    ratio = theirs_pct / ours_pct if ours_pct > 0 else float("inf")
    print(json.dumps({"nasplat_overhead_pct": round(ours_pct, 2), "tune_overhead_pct": round(theirs_pct, 1),
                      "ratio": round(ratio, 1) if ratio != float("inf") else "inf"}))


if __name__ == "__main__":
    main()
