"""PBT and PB2 on real training: nasplat's PBT and PB2 against random search and Ray Tune's PopulationBasedTraining
and PB2.

`ClassificationTrainer` on MNIST-1D (3,200 training / 800 validation signals held out of the training set,
stratified / 1,000 test signals) with the fixed CNN of `search_spaces.cnn.PBT_ARCHITECTURE` (batch 64). The space
is learning rate (1e-3 to 0.3, log), momentum (0.5 to 0.99) and weight decay (1e-6 to 1e-3, log). One step is one
epoch. Per seed, in one run, each method trains the same `--members` configs (8; drawn by nasplat's random search
with that seed) with the same trial seeds (nasplat's `SeedSequence([seed, trial, 0])`), each member `--epochs`
epochs:

  nasplat-pbt  nasplat's PBT, every `--interval` epochs the bottom `--quantile` copies a top member's state and
               perturbs its config (`--resample` probability of resampling a value, else x0.8 / x1.2); the state
               is the one the donor was ranked with (at its latest perturbation step), and the receiver trains on
               from the donor's progress, so a run can train a few more epochs than members x epochs (as Tune's)
  nasplat-pb2  the same with `explore="pb2"`: the copied member's learning rate, momentum and weight decay are
               chosen by nasplat's time-varying GP-UCB bandit (`nasplat.controllers.pb2`, each on the space's
               scale: log for learning rate and weight decay)
  random       random search: the same configs trained `--epochs` epochs each, no exploits
  tune-pbt     Ray Tune's PopulationBasedTraining with the same interval, quantile, resample probability and
               space (`hyperparam_mutations`; values clipped to the space's bounds like nasplat's, since Tune's
               x1.2 would take momentum past 1), a checkpoint every interval as Tune's PBT needs,
               `reuse_actors=True`, one trial per member at `--cpus`/members CPU each
  tune-pb2     Ray Tune's PB2 (`ray.tune.schedulers.pb2.PB2`: scikit-learn's GP in Ray 2.60, no GPy) with the same
               interval, quantile and `hyperparam_bounds` = the space's bounds (Tune's PB2 scales them linearly),
               otherwise run as tune-pbt

nasplat runs on the `processes` executor by default: one worker process forked from the driver per core (2), one
torch thread each, 4 members a worker stepped in turn; no Ray, no start-up per trial. (`--executor local`: the
same in the driver's process, one core, deterministic; `--executor ray`: 8 actors at 2/8 CPU each, like Tune's
trials, which pay 8 torch imports.) Tune runs on a local Ray of `--cpus` (2) CPUs. Ray starts its workers at
niceness 15, so the `processes` and `local` runs are made at `--niceness` 15 too: on a machine that other jobs
load, a trial process gets the same share of the cores on both sides. Both keep results on disk in a fresh
temporary folder (nasplat `storage`, Tune `storage_path`); each wall time is measured around `nasplat.run` /
`Tuner(...)` + `fit()` as ../shared/anchors/bench_pbt.py does. Tune's schedulers draw from the global `random` and
NumPy generators: both are seeded with the seed before each Tune run.

Metric of every method: the best validation accuracy any member reported at any epoch (and that row's test
accuracy, only reported), mean ± std over seeds. Before the seeds, `--cpus` forked processes (one torch thread
each) train one member side by side for `--floor-epochs` epochs to print the compute floor: the seconds a run's
192 epochs need on `--cpus` busy cores with nothing else to do, against the wall times measured, and each method's
wall against the floor of its own mean epochs. Last line: JSON, accuracies in percent.

    python benchmarks/pbt_real.py [--members 8] [--seeds 3] [--first-seed 0] [--epochs 24] [--interval 4]
                                  [--executor processes|local|ray] [--methods nasplat-pbt,nasplat-pb2,...]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nasplat
from nasplat.controllers import RandomSearch
from nasplat.space import Config, Float, Space
from nasplat.trainer import WorkerContext, start
from search_spaces.cnn import pbt_space
from trainers.classification import ClassificationTrainer, load_dataset

METHODS = ("nasplat-pbt", "nasplat-pb2", "random", "tune-pbt", "tune-pb2")
HYPERPARAMETERS = ("lr", "momentum", "weight_decay")
space = Space({**pbt_space.domains, "weight_decay": Float(1e-6, 1e-3, log=True), "dataset": "mnist1d"})
"""`pbt_space` (fixed CNN, learning rate, momentum) with weight decay searched too, on MNIST-1D."""


def member_configs(seed: int, members: int) -> list[Config]:
    """The configs nasplat's random search draws first with `seed`: every method starts from these."""
    controller = RandomSearch(space, metric="valid_acc", seed=seed)
    return [controller.ask().config for _ in range(members)]


def trial_seeds(seed: int, members: int) -> list[int]:
    """The seed nasplat's engine gives trial i's first attempt (`SeedSequence([seed, i, 0])`)."""
    return [int(np.random.SeedSequence([seed, i, 0]).generate_state(1)[0]) for i in range(members)]


def best_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Epochs trained, the best validation accuracy any member reported and that row's test accuracy."""
    best = max(rows, key=lambda r: r["valid_acc"])
    return {"epochs": len(rows), "best_valid": best["valid_acc"], "best_test": best["test_acc"]}


@contextmanager
def niceness(value: int) -> Iterator[None]:
    """Run this process at `value` (Ray starts its workers, Tune's trials among them, at niceness 15), then go back."""
    before = os.getpriority(os.PRIO_PROCESS, 0)
    os.setpriority(os.PRIO_PROCESS, 0, value)
    try:
        yield
    finally:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, before)
        except PermissionError:  # lowering it again needs privileges: the driver stays at `value`
            print(f"could not restore niceness {before}; the rest runs at {value}", file=sys.stderr)


def nasplat_niceness(args: argparse.Namespace) -> Any:
    """`--niceness` for nasplat's `processes` and `local` runs (Ray's workers run at 15); `ray`'s as it is."""
    return niceness(args.niceness if args.executor != "ray" else os.getpriority(os.PRIO_PROCESS, 0))


def run_nasplat(seed: int, args: argparse.Namespace, storage: str, *, explore: str | None) -> dict[str, Any]:
    """nasplat's PBT (`explore` "perturb") or PB2 ("pb2"), or (None) random search over the same configs."""
    options: dict[str, Any] = {"executor": args.executor, "concurrency": args.members, "max_trials": args.members,
                               "max_steps": args.epochs, "seed": seed, "storage": storage,
                               "name": f"{explore or 'random'}-{seed}"}
    if args.executor == "ray":
        options["executor_options"] = {"cpus_per_trial": args.cpus / args.members}
    with nasplat_niceness(args):
        began = time.perf_counter()
        result = _run(seed, args, options, explore=explore)
        wall = time.perf_counter() - began
    rows = [r for r in result.rows if r["status"] not in ("failed", "retried")]
    starts = {r["trial_id"]: r["config"] for r in rows if r["step"] == 1}
    if explore is None and [starts[i] for i in sorted(starts)] != member_configs(seed, args.members):
        raise RuntimeError("random search did not draw the configs PBT and Tune start from")
    return {**best_row(rows), "wall": wall, "exploits": sum(r["donor_id"] is not None for r in rows)}


def _run(seed: int, args: argparse.Namespace, options: dict[str, Any], *, explore: str | None
         ) -> nasplat.ExperimentResult:
    if explore is not None:
        controller = nasplat.PopulationBasedTraining(
            space, metric="valid_acc", population_size=args.members, perturbation_interval=args.interval,
            quantile_fraction=args.quantile, resample_probability=args.resample,
            initial_configs=member_configs(seed, args.members), explore=explore, seed=seed)
        return nasplat.run(trainer=ClassificationTrainer, controller=controller, **options)
    return nasplat.run(trainer=ClassificationTrainer, controller="random", space=space, metric="valid_acc", **options)


def epoch_seconds(args: argparse.Namespace) -> float:
    """Median wall time of one epoch of member 0 (seed 0's first config) while `--cpus` forked processes, one torch
    thread each (as both systems' trials run), train it side by side: the cost of an epoch with every core busy."""
    context = multiprocessing.get_context("fork")
    times: Any = context.Queue()

    def train() -> None:
        torch.set_num_threads(1)
        trainer = start(ClassificationTrainer(), member_configs(0, 1)[0],
                        WorkerContext(trial_id=0, seed=trial_seeds(0, 1)[0]))
        for _ in range(args.floor_epochs):
            began = time.perf_counter()
            trainer.step()
            times.put(time.perf_counter() - began)

    with nasplat_niceness(args):
        workers = [context.Process(target=train) for _ in range(args.cpus)]
        for worker in workers:
            worker.start()
        measured = [times.get() for _ in range(args.cpus * args.floor_epochs)]
        for worker in workers:
            worker.join()
    return float(np.median(measured))


def run_tune(seed: int, args: argparse.Namespace, storage: str, *, pb2: bool = False) -> dict[str, Any]:
    """Ray Tune's PopulationBasedTraining (or PB2) over the same configs, trial seeds, space and PBT settings."""
    from ray import tune
    from ray.tune.schedulers import PopulationBasedTraining
    from ray.tune.schedulers.pb2 import PB2

    members, name = args.members, f"tune-{'pb2' if pb2 else 'pbt'}-{seed}"
    configs, seeds, epochs, interval = member_configs(seed, members), trial_seeds(seed, members), args.epochs, \
        args.interval
    events = os.path.join(storage, f"{name}.jsonl")  # every epoch any member trained, from the trainable
    bounds = {key: space.domains[key] for key in HYPERPARAMETERS}

    def trainable(config: dict[str, Any]) -> None:
        index = int(tune.get_context().get_trial_id()[-5:])  # Tune numbers trials in grid order: 00000, 00001, ...
        member = {**configs[index], **{key: config[key] for key in HYPERPARAMETERS}}
        trainer = start(ClassificationTrainer(), member, WorkerContext(trial_id=index, seed=seeds[index]))
        checkpoint = tune.get_checkpoint()
        if checkpoint is not None:  # a donor's (after an exploit) or its own state
            with checkpoint.as_directory() as folder:
                trainer.load_state_dict(torch.load(os.path.join(folder, "state.pt")))
            trainer.update_config(member)  # the optimizer's saved hyperparameters give way to the new config
        while trainer.epoch < epochs:
            metrics = trainer.step()
            with open(events, "a") as f:
                f.write(json.dumps({"valid_acc": metrics["valid_acc"], "test_acc": metrics["test_acc"]}) + "\n")
            if trainer.epoch % interval == 0:
                with tempfile.TemporaryDirectory() as folder:
                    torch.save(trainer.state_dict(), os.path.join(folder, "state.pt"))
                    tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(folder))
            else:
                tune.report(metrics)

    def clip(config: dict[str, Any]) -> dict[str, Any]:  # keep perturbed values inside the space, as nasplat does
        for key, domain in bounds.items():
            config[key] = min(max(float(config[key]), domain.low), domain.high)
        return config

    def tune_domain(domain: Float) -> Any:
        return (tune.loguniform if domain.log else tune.uniform)(domain.low, domain.high)

    random.seed(seed)  # Tune's PBT draws from the global `random` generator, its PB2 from NumPy's too
    np.random.seed(seed)
    if pb2:
        scheduler: Any = PB2(time_attr="training_iteration", perturbation_interval=interval,
                             quantile_fraction=args.quantile, custom_explore_fn=clip,
                             hyperparam_bounds={k: [d.low, d.high] for k, d in bounds.items()})
    else:
        scheduler = PopulationBasedTraining(
            time_attr="training_iteration", perturbation_interval=interval, quantile_fraction=args.quantile,
            resample_probability=args.resample, hyperparam_mutations={k: tune_domain(d) for k, d in bounds.items()},
            custom_explore_fn=clip)
    param_space = {"index": tune.grid_search(list(range(members))),
                   **{key: tune.sample_from(lambda config, key=key: configs[config["index"]][key])
                      for key in HYPERPARAMETERS}}
    began = time.perf_counter()
    tuner = tune.Tuner(tune.with_resources(trainable, {"cpu": args.cpus / members}), param_space=param_space,
                       tune_config=tune.TuneConfig(metric="valid_acc", mode="max", scheduler=scheduler,
                                                   reuse_actors=True),
                       run_config=tune.RunConfig(name=name, storage_path=storage, verbose=0,
                                                 stop={"training_iteration": epochs}))
    grid = tuner.fit()
    wall = time.perf_counter() - began
    if any(result.error is not None for result in grid):
        raise RuntimeError(f"a Tune trial failed: {next(str(r.error) for r in grid if r.error is not None)}")
    rows = [json.loads(line) for line in Path(events).read_text().splitlines()]
    exploits = 0
    log = Path(storage, name, "pbt_global.txt")
    if log.exists():
        exploits = sum(1 for line in log.read_text().splitlines() if line.strip())
    return {**best_row(rows), "wall": wall, "exploits": exploits}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--members", type=int, default=8, help="population size (members trained side by side)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0, help="seeds first-seed .. first-seed + seeds - 1")
    parser.add_argument("--epochs", type=int, default=24, help="epochs of each member (one epoch a step)")
    parser.add_argument("--interval", type=int, default=4, help="epochs between exploits (perturbation interval)")
    parser.add_argument("--quantile", type=float, default=0.25, help="quantile fraction")
    parser.add_argument("--resample", type=float, default=0.25, help="resample probability")
    parser.add_argument("--executor", default="processes", choices=["processes", "local", "ray"],
                        help="nasplat's executor")
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, of {', '.join(METHODS)}")
    parser.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray")
    parser.add_argument("--floor-epochs", type=int, default=6, help="epochs each process times for the floor")
    parser.add_argument("--niceness", type=int, default=15,
                        help="niceness of nasplat's processes and local runs (Ray's workers, Tune's trials, run at it)")
    args = parser.parse_args()
    methods = [m for m in args.methods.split(",") if m]
    if not methods or any(m not in METHODS for m in methods) or args.members < 2:
        parser.error(f"--methods must name some of {list(METHODS)} and --members be >= 2, got {args.methods!r}, "
                     f"{args.members}")
    import ray

    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    load_dataset("mnist1d")
    epoch = epoch_seconds(args)
    runs: dict[str, Any] = {
        "nasplat-pbt": lambda seed, storage: run_nasplat(seed, args, storage, explore="perturb"),
        "nasplat-pb2": lambda seed, storage: run_nasplat(seed, args, storage, explore="pb2"),
        "random": lambda seed, storage: run_nasplat(seed, args, storage, explore=None),
        "tune-pbt": lambda seed, storage: run_tune(seed, args, storage),
        "tune-pb2": lambda seed, storage: run_tune(seed, args, storage, pb2=True),
    }
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in methods}
    with tempfile.TemporaryDirectory(prefix="nasplat-pbt-real-") as storage:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for name in methods:
                results[name].append(runs[name](seed, storage))
                print(f"seed {seed} {name}: {json.dumps({k: round(v, 4) for k, v in results[name][-1].items()})}",
                      file=sys.stderr, flush=True)
    ray.shutdown()
    report(results, args, epoch)


def report(results: dict[str, list[dict[str, Any]]], args: argparse.Namespace, epoch: float) -> None:
    """The table (means over seeds), the compute floor, the goals of the methods run and the JSON line."""
    def values(name: str, key: str) -> np.ndarray:
        return np.array([r[key] for r in results[name]], dtype=float)

    print(f"PBT on MNIST-1D, fixed CNN, {args.members} members x {args.epochs} epochs, exploit every {args.interval} "
          f"(quantile {args.quantile}, resample {args.resample}), {args.seeds} seeds, nasplat on `{args.executor}`")
    print(f"{'method':<13}{'best valid':>16}{'its test':>10}{'epochs':>8}{'exploits':>10}{'wall s':>9}")
    for name in results:
        valid = 100 * values(name, "best_valid")
        print(f"{name:<13}{valid.mean():>9.2f} ± {valid.std():>4.2f}{100 * values(name, 'best_test').mean():>10.2f}"
              f"{values(name, 'epochs').mean():>8.1f}{values(name, 'exploits').mean():>10.1f}"
              f"{values(name, 'wall').mean():>9.1f}")
    mean = {name: round(100 * float(values(name, "best_valid").mean()), 2) for name in results}
    work = args.members * args.epochs * epoch
    print(f"compute floor: an epoch takes {epoch:.3f} s with {args.cpus} cores busy; {args.members * args.epochs} "
          f"epochs = {work / args.cpus:.1f} s on {args.cpus} cores")
    print("wall against the floor of each method's own epochs: " + ", ".join(
        f"{name} {values(name, 'wall').mean() / (values(name, 'epochs').mean() * epoch / args.cpus):.2f}x"
        for name in results))
    goals = [(a, b) for a, b in (("nasplat-pbt", "random"), ("nasplat-pbt", "tune-pbt"), ("nasplat-pb2", "nasplat-pbt"),
                                 ("nasplat-pb2", "tune-pb2")) if a in mean and b in mean]
    summary: dict[str, Any] = {f"{name.replace('-', '_')}_valid": value for name, value in mean.items()}
    if "nasplat-pbt" in results and "tune-pbt" in results:
        ratio = float(values("nasplat-pbt", "wall").mean()) / float(values("tune-pbt", "wall").mean())
        summary["wall_ratio_vs_tune"] = round(ratio, 3)
        print(f"wall: nasplat PBT {ratio:.3f}x Tune's PBT (goal <= 0.333)")
    if "nasplat-pb2" in results and "tune-pb2" in results:
        ratio = float(values("nasplat-pb2", "wall").mean()) / float(values("tune-pb2", "wall").mean())
        summary["pb2_wall_ratio_vs_tune"] = round(ratio, 3)
        print(f"wall: nasplat PB2 {ratio:.3f}x Tune's PB2")
    print("goals: " + "; ".join(f"{a} >= {b} ({mean[a]} vs {mean[b]}: {'met' if mean[a] >= mean[b] else 'NOT met'})"
                                for a, b in goals))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
