"""The standalone side of `benchmarks/oneshot.py`: THE recipe a cell is trained by, and a cache of its results.

A cell's standalone result is a function of the cell and the recipe (`trainers.nb201_cell:NB201CellTrainer`, the
one `nasplat retrain` uses for NB-201 searches: `epochs` epochs, lr 0.05, batch 64, weight decay 3e-4, a trainer
seed, one torch thread). `Cache` keeps each cell's valid_acc, test_acc, epochs and CPU seconds in a JSON file named
by the recipe's hash, so that reruns reuse the ground truth; a cell taken from the cache is charged its recorded CPU
seconds in full. `standalone_reproducibility` measures how well one standalone training ranks the cells that
another (other trainer seeds) does.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import time
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import kendalltau

from nasplat.trainer import Trainer, WorkerContext, start
from search_spaces import nb201
from trainers.nb201_cell import NB201CellTrainer

CELL_SEED = 0  # the recipe's trainer seed
NET = {"channels": 16, "cells_per_stage": 1, "dataset": "mnist1d"}  # the network around the cell, everywhere


def recipe(epochs: int, seed: int = CELL_SEED) -> dict[str, Any]:
    """The standalone recipe: trainer, epochs, seed and every setting it trains with."""
    return {"trainer": "trainers.nb201_cell:NB201CellTrainer", "epochs": epochs, "seed": seed, **NET,
            "lr": 0.05, "batch_size": 64, "weight_decay": 3e-4}


def recipe_hash(epochs: int, seed: int = CELL_SEED) -> str:
    """12 hex digits naming `recipe(epochs, seed)`: the cache file's name."""
    return hashlib.sha1(json.dumps(recipe(epochs, seed), sort_keys=True).encode()).hexdigest()[:12]


def key_of(config: dict[str, Any]) -> str:
    """A config's cell as NAS-Bench-201's architecture string."""
    return nb201.to_arch_str({edge: config[edge] for edge in nb201.EDGES})


def train_cell(arch: str, epochs: int, seed: int = CELL_SEED) -> dict[str, Any]:
    """One cell trained standalone by the recipe: final valid/test accuracy, epochs, CPU and wall seconds, params."""
    cpu, wall = time.process_time(), time.perf_counter()
    settings = {k: v for k, v in recipe(epochs, seed).items() if k not in ("trainer", "seed")}
    trainer = start(NB201CellTrainer(), {**nb201.from_arch_str(arch), **settings}, WorkerContext(seed=seed))
    while not (metrics := trainer.step()).get("done"):
        pass
    return {"valid_acc": float(metrics["valid_acc"]), "test_acc": float(metrics["test_acc"]),
            "epochs": int(metrics["epoch"]), "cpu_s": time.process_time() - cpu, "wall_s": time.perf_counter() - wall,
            "params": float(metrics["params"])}


def _train_cell_star(job: tuple[str, int, int]) -> tuple[str, dict[str, Any]]:
    return job[0], train_cell(*job)


class Cache:
    """Standalone results by cell for one recipe (epochs and trainer seed), kept in `folder`."""

    def __init__(self, folder: Path, epochs: int, seed: int = CELL_SEED) -> None:
        self.path = folder / f"oneshot-groundtruth-{recipe_hash(epochs, seed)}.json"
        self.epochs, self.seed = epochs, seed
        self.cells: dict[str, dict[str, Any]] = {}
        if self.path.exists():
            saved = json.loads(self.path.read_text())
            if saved.get("recipe") == recipe(epochs, seed):
                self.cells = saved["cells"]

    def save(self) -> None:
        """Write the cache (atomically: a temporary file renamed over it)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"recipe": recipe(self.epochs, self.seed), "cells": self.cells}, sort_keys=True))
        tmp.replace(self.path)

    def add(self, rows: list[dict[str, Any]]) -> None:
        """Results trained elsewhere (rows of `CachedCellTrainer` trials), for later parts and reruns."""
        for row in rows:
            self.cells.setdefault(row["arch"], {k: row[k] for k in ("valid_acc", "test_acc", "epochs", "cpu_s",
                                                                     "wall_s", "params")})
        self.save()

    def get(self, archs: list[str], workers: int) -> list[dict[str, Any]]:
        """The results of `archs`, training (in `workers` forked processes) those not cached yet."""
        missing = list(dict.fromkeys(a for a in archs if a not in self.cells))
        started = time.perf_counter()
        jobs = [(a, self.epochs, self.seed) for a in missing]
        if not jobs:
            return [self.cells[a] for a in archs]
        with mp.get_context("fork").Pool(min(workers, len(jobs))) as pool:
            for i, (arch, result) in enumerate(pool.imap_unordered(_train_cell_star, jobs), 1):
                self.cells[arch] = result
                if i % 10 == 0 or i == len(jobs):
                    print(f"    trained {i}/{len(jobs)} cells standalone ({time.perf_counter() - started:.0f} s)",
                          flush=True)
                    self.save()
        return [self.cells[a] for a in archs]


class CachedCellTrainer(Trainer):
    """A standalone evolution trial: its cell trained by the recipe in one step, or the cached result (charged its
    CPU seconds in full). The driver sets `CACHE` and `EPOCHS` before the run; forked workers see them."""

    CACHE: dict[str, dict[str, Any]] = {}
    EPOCHS = 10

    def setup(self, config: dict[str, Any], ctx: WorkerContext) -> None:
        self.arch = key_of(config)

    def step(self) -> dict[str, Any]:
        cached = self.CACHE.get(self.arch)
        result = dict(cached) if cached is not None else train_cell(self.arch, self.EPOCHS)
        return {**result, "cached": float(cached is not None), "arch": self.arch, "done": True}


def standalone_reproducibility(valid: np.ndarray, repeats: list[np.ndarray], seeds: list[int]) -> dict[str, Any]:
    """How well standalone training ranks the ground truth's cells (printed as well): the Kendall tau against the
    ground truth `valid` of each repeat (the same cells, trainer seeds `seeds`) and of the repeats' mean accuracy,
    and the mean tau of each training (ground truth or repeat) against the mean of the others."""
    if not repeats:
        return {"standalone_repeat_tau": None, "standalone_repeat_tau_per_seed": [], "standalone_mean_repeat_tau": None,
                "standalone_leave_one_out_tau": None}
    per_seed = [round(float(kendalltau(r, valid).statistic), 4) for r in repeats]
    of_mean = round(float(kendalltau(np.mean(repeats, axis=0), valid).statistic), 4)
    runs = [valid, *repeats]
    left_out = [float(kendalltau(run, np.mean(runs[:i] + runs[i + 1:], axis=0)).statistic)
                for i, run in enumerate(runs)]
    print("  kendall tau of standalone repeats against trainer seed "
          f"{CELL_SEED}: " + ", ".join(f"seed {s} {t:+.3f}" for s, t in zip(seeds, per_seed))
          + f"; their mean accuracy {of_mean:+.3f}; each training against the mean of the others "
          f"{np.mean(left_out):+.3f}", flush=True)
    return {"standalone_repeat_tau": round(float(np.mean(per_seed)), 4), "standalone_repeat_tau_per_seed": per_seed,
            "standalone_mean_repeat_tau": of_mean, "standalone_leave_one_out_tau": round(float(np.mean(left_out)), 4)}
