"""Per-trial overhead on Ray: nasplat's `ray` executor against Ray's own floor and against Ray Tune, in one run.

Each side runs in its own subprocess on its own fresh embedded Ray (`ray.init(num_cpus=2)`); the clock starts
after `ray.init` returned, so every side starts from the same pool of idle Ray workers:

- nasplat: 200 one-step no-op trials (random search over one float, concurrency 2, storage on: every row appended
  to `results.jsonl`, TensorBoard's files, the journal), "cold" right after `ray.init` (the actors' start-up
  included), then "warm": a second experiment in the same driver on the same Ray;
- Ray's floor, measured as `../shared/anchors/bench_ray_floor.py --variant pool1` does: 2 actors created, then 200
  no-op calls through an `ActorPool` of them ("cold", creation included), then the same 200 calls again on the same
  actors ("warm");
- Ray Tune, as `../shared/anchors/bench_tune_overhead.py --reuse-actors`: a function trainable reporting once,
  `reuse_actors=True`, its experiment folder on disk; the timed region is Tuner construction + fit.

The last line is JSON: nasplat cold and warm trials/s, the floor's, Tune's. With `--scale N`, a further subprocess
runs 200 trials cold, 200 warm, then N trials on the same warm Ray, sampling the driver's resident memory every
N/10 trials: the N-trial rate against the 200-trial warm rate, and the memory at each tenth.

    python benchmarks/overhead.py [--trials 200] [--scale 10000]
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
from typing import Any

import ray

import nasplat
from nasplat import Float, Trainer

GOALS = {"cold_vs_floor": 0.5, "cold_vs_tune": 5.0, "warm_vs_floor": 1 / 3}


class NoOp(Trainer):
    """One step that reports its config back."""

    def setup(self, config: dict[str, Any], ctx: nasplat.WorkerContext) -> None:
        self.x = config["x"]

    def step(self) -> dict[str, float]:
        return {"score": self.x}


class MemoryProbe:
    """A listener that notes, every `every` rows, the seconds since it was made and the driver's resident memory."""

    def __init__(self, every: int) -> None:
        self.every, self.rows = every, 0
        self.start = time.perf_counter()
        self.samples: list[tuple[int, float, float]] = []  # (rows, seconds, resident MB)

    def on_row(self, engine: Any, row: dict[str, Any]) -> None:
        import psutil

        self.rows += 1
        if self.rows % self.every == 0:
            mb = psutil.Process().memory_info().rss / 2**20
            self.samples.append((self.rows, round(time.perf_counter() - self.start, 3), round(mb, 1)))


def run_nasplat(trials: int, storage: str, name: str, callbacks: list[Any] | None = None,
                executor: str = "ray") -> float:
    """Seconds for one nasplat experiment of `trials` no-op trials on `executor` (its rows checked on disk)."""
    started = time.perf_counter()
    result = nasplat.run(trainer=NoOp, space={"x": Float(0.0, 1.0)}, metric="score", executor=executor,
                         concurrency=2, max_trials=trials, seed=0, storage=storage, name=name,
                         callbacks=callbacks or [])
    wall = time.perf_counter() - started
    assert len(result.ranked()) == trials, result.counts()
    with open(Path(storage) / name / "results.jsonl", "rb") as rows:
        assert sum(1 for _ in rows) == trials
    return wall


def part_nasplat(trials: int) -> dict[str, float]:
    ray.init(num_cpus=2)
    with tempfile.TemporaryDirectory() as storage:
        cold = run_nasplat(trials, storage, "cold")
        warm = run_nasplat(trials, storage, "warm")
    ray.shutdown()
    return {"cold_s": cold, "warm_s": warm}


def part_floor(trials: int) -> dict[str, float]:
    """Ray alone: 2 no-op actors through an `ActorPool`, created inside the cold pass."""
    from ray.util import ActorPool

    @ray.remote(num_cpus=1)
    class Echo:
        def run(self, x: float) -> dict[str, float]:
            return {"score": x}

    ray.init(num_cpus=2)
    actors: list[Any] = []
    times = {}
    for phase in ("cold", "warm"):
        started = time.perf_counter()
        if not actors:
            actors = [Echo.remote() for _ in range(2)]
        values = [i / trials for i in range(trials)]
        done = list(ActorPool(actors).map_unordered(lambda actor, x: actor.run.remote(x), values))
        times[f"{phase}_s"] = time.perf_counter() - started
        assert len(done) == trials
    ray.shutdown()
    return times


def part_tune(trials: int) -> dict[str, float]:
    from ray import tune

    def noop_trainable(config: dict[str, Any]) -> None:
        tune.report({"score": config["x"]})

    ray.init(num_cpus=2)
    with tempfile.TemporaryDirectory() as storage:
        started = time.perf_counter()
        tuner = tune.Tuner(noop_trainable, param_space={"x": tune.uniform(0.0, 1.0)},
                           tune_config=tune.TuneConfig(num_samples=trials, metric="score", mode="max",
                                                       reuse_actors=True),
                           run_config=tune.RunConfig(name="overhead", storage_path=storage))
        results = tuner.fit()
        wall = time.perf_counter() - started
        assert sum(r.error is None for r in results) == trials
    ray.shutdown()
    return {"s": wall}


def part_scale(trials: int, scale: int) -> dict[str, Any]:
    """200 cold, 200 warm, then `scale` trials on the same warm Ray with the driver's memory sampled; then as many
    on `local` (in the driver), whose memory growth is the engine's own (the rows it keeps for the result)."""
    ray.init(num_cpus=2)
    probe, local = MemoryProbe(max(1, scale // 10)), MemoryProbe(max(1, scale // 10))
    with tempfile.TemporaryDirectory() as storage:
        cold = run_nasplat(trials, storage, "cold")
        warm = run_nasplat(trials, storage, "warm")
        probe.start = time.perf_counter()
        big = run_nasplat(scale, storage, "scale", callbacks=[probe])
        local.start = time.perf_counter()
        run_nasplat(scale, storage, "local", callbacks=[local], executor="local")
    ray.shutdown()
    return {"cold_s": cold, "warm_s": warm, "scale_s": big, "samples": probe.samples, "local": local.samples}


def run_part(part: str, trials: int, scale: int) -> dict[str, Any]:
    """Run one part in a fresh Python process (its own `ray.init`); its RESULT line, parsed."""
    command = [sys.executable, __file__, "--part", part, "--trials", str(trials), "--scale", str(scale)]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "RAY_DEDUP_LOGS": "0"})
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"part {part} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--scale", type=int, default=0, help="also run this many trials on a warm Ray (e.g. 10000)")
    parser.add_argument("--part", choices=["nasplat", "floor", "tune", "scale"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    parts = {"nasplat": lambda: part_nasplat(args.trials), "floor": lambda: part_floor(args.trials),
             "tune": lambda: part_tune(args.trials), "scale": lambda: part_scale(args.trials, args.scale)}
    if args.part:
        print("RESULT " + json.dumps(parts[args.part]()), flush=True)
        return
    n = args.trials
    ours, floor, tune_ = run_part("nasplat", n, 0), run_part("floor", n, 0), run_part("tune", n, 0)
    rates = {"nasplat_trials_per_s": n / ours["cold_s"], "ray_floor_per_s": n / floor["cold_s"],
             "tune_trials_per_s": n / tune_["s"], "warm_nasplat_per_s": n / ours["warm_s"],
             "warm_floor_per_s": n / floor["warm_s"]}
    cold_floor = rates["nasplat_trials_per_s"] / rates["ray_floor_per_s"]
    cold_tune = rates["nasplat_trials_per_s"] / rates["tune_trials_per_s"]
    warm_floor = rates["warm_nasplat_per_s"] / rates["warm_floor_per_s"]
    print(f"{n} no-op trials, storage on (nasplat, Tune)")
    print(f"  cold: nasplat {rates['nasplat_trials_per_s']:7.1f}/s ({ours['cold_s']:.2f} s)   Ray floor "
          f"{rates['ray_floor_per_s']:7.1f}/s ({floor['cold_s']:.2f} s): {cold_floor:.2f}x (goal >= "
          f"{GOALS['cold_vs_floor']:.2f})   Ray Tune {rates['tune_trials_per_s']:6.1f}/s ({tune_['s']:.2f} s): "
          f"{cold_tune:.1f}x (goal >= {GOALS['cold_vs_tune']:.0f})")
    print(f"  warm: nasplat {rates['warm_nasplat_per_s']:7.1f}/s ({ours['warm_s']:.2f} s)   Ray floor "
          f"{rates['warm_floor_per_s']:7.1f}/s ({floor['warm_s']:.2f} s): {warm_floor:.2f}x (goal >= "
          f"{GOALS['warm_vs_floor']:.2f})")
    if args.scale:
        big = run_part("scale", n, args.scale)
        print(f"  scale: {args.scale} trials on a warm Ray {args.scale / big['scale_s']:7.1f}/s "
              f"({big['scale_s']:.1f} s) against {n} warm {n / big['warm_s']:.1f}/s (cold {n / big['cold_s']:.1f}/s)")
        samples = big["samples"]
        tenths = [(b[0] - a[0]) / (b[1] - a[1]) for a, b in zip([(0, 0.0, 0.0), *samples], samples)]
        print("  trials/s in each tenth: " + ", ".join(f"{rate:.0f}" for rate in tenths))
        print("  driver resident MB after each tenth: " + ", ".join(f"{mb:.0f}" for _, _, mb in samples))
        first, last = samples[0], samples[-1]
        growth = (last[2] - first[2]) * 1024 / (last[0] - first[0])
        local = big["local"]
        engine = (local[-1][2] - local[0][2]) * 1024 / (local[-1][0] - local[0][0])
        print(f"  driver memory growth after the first tenth: {growth:.3f} KB a trial (the same trials on `local`: "
              f"{engine:.3f} KB, the rows the engine keeps for the result)")
        rates.update(scale_trials_per_s=args.scale / big["scale_s"], scale_warm_per_s=n / big["warm_s"],
                     scale_last_tenth_per_s=tenths[-1], scale_kb_per_trial=growth)
    print(json.dumps({key: round(value, 3 if key == "scale_kb_per_trial" else 1) for key, value in rates.items()}))


if __name__ == "__main__":
    main()
