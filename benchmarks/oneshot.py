"""One-shot NAS on the NAS-Bench-201 cell for MNIST-1D (issue 20): does the supernet rank cells as standalone
training does, and what does a one-shot search buy against standalone evolution? Flags shrink each part; the
defaults are the issue's. Everything is averaged over `--seeds` (3) seeds.

- **ground truth**: `--cells` (100) cells drawn uniformly (seed 0), each trained standalone by THE recipe
  (`benchmarks/oneshot_truth.py`), cached in `--cache` so that reruns reuse it; trained again with each trainer
  seed of `--repeat-seeds` (1 2 3): the Kendall tau of a repeat against the ground truth measures how well a second
  standalone training ranks the cells, and that of the repeats' mean how well a ranker that knew the mean of three
  more trainings would.
- **ranking**: per seed a supernet (`NB201SupernetTrainer`) trained `--supernet-epochs` (40) epochs as one
  checkpointed trial; the ground-truth cells judged by its shared weights as the trials of a search (random search
  seeded as the ground truth's draw proposes exactly those cells): Kendall tau of inherited against standalone
  validation accuracy (and of the inherited validation loss, reported beside it). Seed 0 writes `nasplat report`s of
  the supernet and of that search against the ground truth. Zero-cost proxies of the untrained supernet's paths
  (init seed 0, first 64 training signals): Spearman against standalone validation accuracy.
- **one-shot search**: that supernet's training, regularized evolution (population 20, sample 5) over
  `--oneshot-trials` (300) paths judged by its weights (valid split only), the best path by inherited validation
  accuracy retrained standalone: its test accuracy, epochs (supernet + retrain), CPU seconds (supernet training +
  every path trial, engine included + the retrain).
- **standalone evolution**: regularized evolution (population 10, sample 3) over `--evolution-cells` (100) cells
  trained by the recipe (`processes`, `--workers` 2; cached cells charged their recorded CPU seconds in full): the
  best cell by validation accuracy, its test accuracy, epochs, CPU seconds. compute_ratio = one-shot CPU seconds /
  standalone evolution CPU seconds.
- **GDAS** (`NB201DartsTrainer`, same network and epochs): its derived cell retrained -> darts_variant_test, and its
  parameter-free edges; random10: the best of 10 drawn cells by standalone validation accuracy -> its test.
- **data parallel**: supernet training samples/s of a nasplat gang of 2 workers against 1 (`--skip-dp` skips).

Supernet heuristics: FairNAS sampling, SGD lr 0.05 momentum 0.9 wd 3e-4 on a cosine, batch 64, batch norm of each
path recalibrated on 4 x 256 training signals; the epochs (40 over 30) and the 4 batches (over 1 and 2) were chosen
by probes of tau against this ground truth's validation accuracies (weight decay 0, 50 epochs and lr 0.025, probed
later, moved tau by less than its spread over seeds). Architectures are selected on validation
accuracy only; test accuracy is only reported.

    python benchmarks/oneshot.py                                  # the issue's sizes, ~25 min on 2 cores
    python benchmarks/oneshot.py --cells 30 --seeds 2 --evolution-cells 30 --epochs 6 --supernet-epochs 20

Every experiment is recorded under `--out` (default `results/oneshot-<time>`), with `groundtruth.jsonl` for
`nasplat report DIR --ground-truth`. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
from scipy.stats import kendalltau, spearmanr  # noqa: E402

import nasplat  # noqa: E402
from nasplat.oneshot import ProxyFeatures, SharedWeights, search_trainer  # noqa: E402
from nasplat.report import build_report  # noqa: E402
from nasplat.trainer import WorkerContext, start  # noqa: E402
from oneshot_truth import (  # noqa: E402
    CELL_SEED, NET, Cache, CachedCellTrainer, key_of, standalone_reproducibility)
from search_spaces import nb201  # noqa: E402
from trainers.supernet import (  # noqa: E402
    NB201DartsTrainer, NB201PathTrainer, NB201ProxyTrainer, NB201SupernetTrainer, signal_data)


def supernet_config(args: argparse.Namespace) -> dict[str, Any]:
    """The supernet's training settings (the heuristics the docstring names)."""
    return {**NET, "sampler": "fairnas", "lr": 0.05, "momentum": 0.9, "weight_decay": 3e-4, "batch_size": 64,
            "epochs": args.supernet_epochs, "bn_batches": 4, "eval_paths": 1}


def train_supernet(seed: int, args: argparse.Namespace, out: Path) -> tuple[SharedWeights, float, float]:
    """The supernet trained as one trial (`local` executor: in this process, checkpointed at its end into `out`):
    (its weights, CPU seconds, wall seconds)."""
    cpu, wall = time.process_time(), time.perf_counter()
    result = nasplat.run(trainer=NB201SupernetTrainer, space=supernet_config(args), metric="valid_acc", max_trials=1,
                         max_steps=args.supernet_epochs, seed=1000 + seed, executor="local", storage=out,
                         name=f"supernet-seed{seed}", checkpoint={"at_end": True}, progress=False)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    print(f"    supernet seed {seed}: {args.supernet_epochs} epochs, train loss {result.rows[-1]['train_loss']:.3f}, "
          f"{wall:.0f} s", flush=True)
    return SharedWeights.load(result), cpu, wall


def path_trainer(weights: SharedWeights, *, report_test: bool) -> type[NB201PathTrainer]:
    """The trial class of a search over `weights`: batch norm recalibrated on 4 x 256 training signals."""
    return search_trainer(NB201PathTrainer, weights, {**NET, "bn_batches": 4, "report_test": report_test})


def ranking(weights: SharedWeights, archs: list[str], seed: int, out: Path) -> tuple[list[float], list[float], Path]:
    """The inherited validation accuracy and loss of each ground-truth cell, judged as trials of a search (random
    search seeded as the ground truth's draw proposes exactly its cells), and that search's folder."""
    result = nasplat.run(trainer=path_trainer(weights, report_test=True), space=nb201.space, metric="valid_acc",
                         controller="random", seed=0, executor="local", max_trials=len(archs), max_steps=1, storage=out,
                         name=f"ranking-seed{seed}", progress=False)
    judged = [r for r in result.rows if r.get("valid_acc") is not None]
    inherited = {key_of(r["config"]): float(r["valid_acc"]) for r in judged}
    losses = {key_of(r["config"]): float(r["valid_loss"]) for r in judged}
    if set(inherited) != set(archs):
        raise RuntimeError(f"the ranking search judged {len(set(inherited) & set(archs))} of the {len(archs)} "
                           "ground-truth cells: random search no longer draws as space.sample(default_rng(0)) does")
    return [inherited[a] for a in archs], [losses[a] for a in archs], Path(result.path)


def proxy_scores(archs: list[str]) -> dict[str, list[float]]:
    """Each proxy of each cell, as a search's `ProxyTrainer` trials score it: one untrained supernet (init seed 0),
    the first 64 training signals."""
    features = ProxyFeatures(NB201ProxyTrainer, NET)
    scores = [features(nb201.from_arch_str(arch)) for arch in archs]
    return {name: [row[i] for row in scores] for i, name in enumerate(features.names)}


def oneshot_search(weights: SharedWeights, seed: int, args: argparse.Namespace, out: Path
                   ) -> tuple[dict[str, Any], float, int]:
    """Regularized evolution over paths with inherited weights: (best row, CPU seconds, evaluations)."""
    cpu = time.process_time()
    result = nasplat.run(trainer=path_trainer(weights, report_test=False), space=nb201.space, metric="valid_acc",
                         mode="max", controller="evolution",
                         controller_options={"population_size": 20, "sample_size": 5},
                         executor="local", max_trials=args.oneshot_trials, max_steps=1, seed=seed, storage=out,
                         name=f"oneshot-seed{seed}", progress=False)
    return result.best, time.process_time() - cpu, len(result.rows)


def standalone_evolution(cache: Cache, seed: int, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Regularized evolution over cells trained standalone: its best cell and what the search cost."""
    CachedCellTrainer.CACHE, CachedCellTrainer.EPOCHS = dict(cache.cells), args.epochs
    wall = time.perf_counter()
    result = nasplat.run(trainer=CachedCellTrainer, space=nb201.space, metric="valid_acc", mode="max",
                         controller="evolution", controller_options={"population_size": 10, "sample_size": 3},
                         executor="processes", concurrency=args.workers, max_trials=args.evolution_cells,
                         max_steps=1, seed=seed, storage=out, name=f"evolution-seed{seed}", progress=False)
    rows = [r for r in result.rows if r.get("valid_acc") is not None]
    cache.add(rows)
    best = result.best
    return {"test": float(best["test_acc"]), "valid": float(best["valid_acc"]), "arch": best["arch"],
            "epochs": int(sum(r["epochs"] for r in rows)), "cpu_s": float(sum(r["cpu_s"] for r in rows)),
            "cached": int(sum(r["cached"] for r in rows)), "wall_s": time.perf_counter() - wall}


def gdas(seed: int, args: argparse.Namespace) -> tuple[dict[str, Any], float]:
    """GDAS trained `--supernet-epochs` epochs: (its last metrics, the derived cell's among them; CPU seconds)."""
    cpu = time.process_time()
    trainer = start(NB201DartsTrainer(), {**NET, "method": "gdas", "epochs": args.supernet_epochs, "lr": 0.05,
                                          "batch_size": 64}, WorkerContext(seed=2000 + seed))
    for _ in range(args.supernet_epochs):
        metrics = trainer.step()
    return metrics, time.process_time() - cpu


def data_parallel(epochs: int, out: Path) -> dict[str, float]:
    """Supernet training samples/s as nasplat runs it data-parallel: one trial on the `ray` executor, a gang of
    1 and of 2 workers (allreduce backend: DDP over gloo, one CPU each), each rank a shard of the 3,200 training
    signals. Rank 0's `train_s` of each epoch after the first (warm-up), median; samples/s = 3,200 / that."""
    speeds = {}
    for workers in (1, 2):
        result = nasplat.run(trainer=NB201SupernetTrainer, space={**NET, "sampler": "fairnas", "eval_paths": 1},
                             metric="valid_acc", max_trials=1, max_steps=epochs + 1, executor="ray", seed=7,
                             executor_options={"workers": workers, "backend": "allreduce", "cpus_per_trial": 1},
                             storage=out, name=f"data-parallel-{workers}", progress=False)
        seconds = sorted(r["train_s"] for r in result.rows if r.get("epoch", 0) > 1)
        speeds[f"workers_{workers}"] = len(signal_data("mnist1d").y_train) / seconds[len(seconds) // 2]
    speeds["speedup"] = speeds["workers_2"] / speeds["workers_1"]
    return speeds


def one_seed(seed: int, args: argparse.Namespace, out: Path, cache: Cache, archs: list[str],
             valid: np.ndarray, repeats: list[np.ndarray]) -> dict[str, Any]:
    """Every per-seed part: ranking (against the ground truth, and against each repeat of it), one-shot search,
    standalone evolution, GDAS, random10."""
    print(f"seed {seed}", flush=True)
    row: dict[str, Any] = {"seed": seed}
    weights, sn_cpu, row["supernet_wall_s"] = train_supernet(seed, args, out)
    inherited, losses, ranked_in = ranking(weights, archs, seed, out)
    row["kendall_tau"] = float(kendalltau(inherited, valid).statistic)
    row["kendall_tau_loss"] = float(kendalltau(-np.array(losses), valid).statistic)  # reported beside, not chosen
    row["kendall_tau_repeats"] = [float(kendalltau(inherited, r).statistic) for r in repeats]
    row["kendall_tau_all_mean"] = float(kendalltau(inherited, np.mean([valid, *repeats], axis=0)).statistic)
    print(f"  kendall tau against standalone valid acc, {len(archs)} cells: inherited valid acc "
          f"{row['kendall_tau']:+.3f} (against each repeat {np.mean(row['kendall_tau_repeats'] or [np.nan]):+.3f}, "
          f"against the trainings' mean {row['kendall_tau_all_mean']:+.3f}), inherited valid loss (negated) "
          f"{row['kendall_tau_loss']:+.3f}", flush=True)
    if seed == 0:
        pages = [build_report(out / "supernet-seed0"), build_report(ranked_in, ground_truth=out / "groundtruth.jsonl")]
        print("  reports: " + ", ".join(map(str, pages)), flush=True)

    best, search_cpu, evaluations = oneshot_search(weights, seed, args, out)
    chosen = key_of(best["config"])
    again = cache.get([chosen], 1)[0]
    one = row["oneshot"] = {"arch": chosen, "inherited_valid": float(best["valid_acc"]), "valid": again["valid_acc"],
                            "test": again["test_acc"], "epochs": args.supernet_epochs + again["epochs"],
                            "evaluations": evaluations, "supernet_cpu_s": sn_cpu, "search_cpu_s": search_cpu,
                            "cpu_s": sn_cpu + search_cpu + again["cpu_s"]}
    print(f"  one-shot: {chosen} inherited valid {best['valid_acc']:.4f} -> standalone valid {one['valid']:.4f} "
          f"test {one['test']:.4f}; {one['epochs']} epochs, {one['cpu_s']:.0f} CPU s (supernet {sn_cpu:.0f} s, "
          f"{evaluations} path trials {search_cpu:.0f} s)", flush=True)

    ev = row["evolution"] = standalone_evolution(cache, seed, args, out)
    row["compute_ratio"] = one["cpu_s"] / ev["cpu_s"]
    print(f"  standalone evolution: {ev['arch']} valid {ev['valid']:.4f} test {ev['test']:.4f}; {ev['epochs']} "
          f"epochs, {ev['cpu_s']:.0f} CPU s ({ev['cached']} cells from the cache, {ev['wall_s']:.0f} s wall); "
          f"compute ratio {row['compute_ratio']:.3f}", flush=True)

    metrics, gdas_cpu = gdas(seed, args)
    derived = nb201.to_arch_str(json.loads(metrics["arch"]))
    trained = cache.get([derived], 1)[0]
    row["gdas"] = {"arch": derived, "test": trained["test_acc"], "valid": trained["valid_acc"],
                   "parameter_free_edges": int(metrics["parameter_free"]), "cpu_s": gdas_cpu + trained["cpu_s"]}
    print(f"  GDAS: {derived} ({int(metrics['parameter_free'])}/6 parameter-free edges) -> standalone test "
          f"{trained['test_acc']:.4f}", flush=True)

    rng = np.random.default_rng(3000 + seed)
    drawn = [nb201.to_arch_str(nb201.space.sample(rng)) for _ in range(args.random_cells)]
    results = cache.get(drawn, args.workers)
    pick = max(range(len(drawn)), key=lambda i: results[i]["valid_acc"])
    row["random10"] = {"arch": drawn[pick], "valid": results[pick]["valid_acc"], "test": results[pick]["test_acc"]}
    print(f"  random {args.random_cells}: {drawn[pick]} valid {results[pick]['valid_acc']:.4f} test "
          f"{results[pick]['test_acc']:.4f}", flush=True)
    return row


def summary(rows: list[dict[str, Any]], args: argparse.Namespace, proxies: dict[str, float], **extra: Any
            ) -> dict[str, Any]:
    """The issue's figures (means over the seeds) first, then the per-seed details."""
    def mean(part: str, key: str | None = None) -> float:
        return round(float(np.mean([r[part] if key is None else r[part][key] for r in rows])), 4)

    return {"kendall_tau": mean("kendall_tau"), "proxy_spearman": {k: round(v, 4) for k, v in proxies.items()},
            "oneshot_test": mean("oneshot", "test"), "standalone_evolution_test": mean("evolution", "test"),
            "compute_ratio": mean("compute_ratio"), "darts_variant_test": mean("gdas", "test"),
            "random10_test": mean("random10", "test"), "seeds": args.seeds, "cells": args.cells,
            "evolution_cells": args.evolution_cells, "recipe_epochs": args.epochs,
            "supernet_epochs": args.supernet_epochs, "oneshot_trials": args.oneshot_trials,
            "kendall_tau_per_seed": [round(r["kendall_tau"], 4) for r in rows],
            "kendall_tau_inherited_loss": mean("kendall_tau_loss"),
            "kendall_tau_against_repeats": round(float(np.mean([r["kendall_tau_repeats"] for r in rows])), 4)
            if rows and rows[0]["kendall_tau_repeats"] else None,
            "kendall_tau_against_mean_of_trainings": mean("kendall_tau_all_mean"),
            "compute_ratio_per_seed": [round(r["compute_ratio"], 4) for r in rows],
            **{f"{side}_{key}": mean(part, key) for side, part in (("oneshot", "oneshot"),
                                                                   ("standalone_evolution", "evolution"))
               for key in ("valid", "epochs", "cpu_s")},
            "oneshot_supernet_cpu_s": mean("oneshot", "supernet_cpu_s"),
            "oneshot_search_cpu_s": mean("oneshot", "search_cpu_s"),
            "gdas_parameter_free_edges": [r["gdas"]["parameter_free_edges"] for r in rows],
            "oneshot_archs": [r["oneshot"]["arch"] for r in rows], "gdas_archs": [r["gdas"]["arch"] for r in rows],
            **extra}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", type=int, default=100, help="ground-truth cells")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--evolution-cells", type=int, default=100, help="cells of each standalone evolution")
    parser.add_argument("--epochs", type=int, default=10, help="the standalone recipe's epochs")
    parser.add_argument("--supernet-epochs", type=int, default=40, help="supernet (and GDAS) epochs")
    parser.add_argument("--oneshot-trials", type=int, default=300, help="paths the one-shot evolution evaluates")
    parser.add_argument("--random-cells", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2, help="processes training standalone cells")
    parser.add_argument("--dp-epochs", type=int, default=3, help="timed epochs of each data-parallel run")
    parser.add_argument("--skip-dp", action="store_true")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "nasplat", help="the caches' folder")
    parser.add_argument("--repeat-seeds", type=int, nargs="*", default=[1, 2, 3],
                        help="trainer seeds the ground truth is trained again with (none: no repeat)")
    parser.add_argument("--out", type=Path, default=None,
                        help="the experiments' folder (default results/oneshot-<time>)")
    args = parser.parse_args()
    if CELL_SEED in args.repeat_seeds or len(set(args.repeat_seeds)) < len(args.repeat_seeds):
        parser.error(f"--repeat-seeds must be distinct seeds other than the ground truth's {CELL_SEED}, got "
                     f"{args.repeat_seeds}")
    begin = time.perf_counter()
    out = args.out or Path("results") / time.strftime("oneshot-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    cache = Cache(args.cache, args.epochs)
    print(f"NB-201 cell on MNIST-1D: {args.cells} ground-truth cells, {args.seeds} seeds, {args.evolution_cells} "
          f"standalone evolution cells, recipe {args.epochs} epochs, supernet {args.supernet_epochs} epochs; cache "
          f"{cache.path} ({len(cache.cells)} cells)", flush=True)

    rng = np.random.default_rng(0)
    archs = [nb201.to_arch_str(nb201.space.sample(rng)) for _ in range(args.cells)]
    if len(set(archs)) < len(archs):
        raise SystemExit(f"the ground truth's draw repeats a cell: {len(set(archs))} distinct of {len(archs)}")
    truth = cache.get(archs, args.workers)
    valid = np.array([t["valid_acc"] for t in truth])
    print(f"ground truth: {len(archs)} cells, valid acc {valid.mean():.4f} (25/50/75th percentiles "
          f"{np.percentile(valid, [25, 50, 75]).round(4).tolist()} on {len(signal_data('mnist1d').y_valid)} signals), "
          f"{np.mean([t['cpu_s'] for t in truth]):.2f} CPU s a cell", flush=True)
    repeats = [np.array([t["valid_acc"] for t in Cache(args.cache, args.epochs, s).get(archs, args.workers)])
               for s in args.repeat_seeds]
    reproducibility = standalone_reproducibility(valid, repeats, args.repeat_seeds)
    (out / "groundtruth.jsonl").write_text("".join(json.dumps({**nb201.from_arch_str(a), **t}) + "\n"
                                                   for a, t in zip(archs, truth)))
    proxies = proxy_scores(archs)
    proxy_spearman = {name: float(spearmanr(values, valid).statistic) for name, values in proxies.items()}
    print("proxies' spearman: " + ", ".join(f"{k} {v:+.3f}" for k, v in proxy_spearman.items()), flush=True)

    rows = [one_seed(seed, args, out, cache, archs, valid, repeats) for seed in range(args.seeds)]
    dp = None
    if not args.skip_dp:
        dp = {k: round(v, 2) for k, v in data_parallel(args.dp_epochs, out).items()}
        print(f"data-parallel supernet training (nasplat gang, allreduce over gloo): 1 worker {dp['workers_1']:.0f}, "
              f"2 workers {dp['workers_2']:.0f} samples/s: {dp['speedup']:.2f}x", flush=True)
    print(json.dumps(summary(rows, args, proxy_spearman, **reproducibility,
                             cell_cpu_s=round(float(np.mean([t["cpu_s"] for t in truth])), 3),
                             data_parallel_samples_per_s=dp, seconds=round(time.perf_counter() - begin, 1))))


if __name__ == "__main__":
    main()
