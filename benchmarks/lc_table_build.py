"""Build the MNIST-1D learning-curve table: every configuration of `search_spaces.lc_table`, trained to 27 epochs.

Each configuration is trained by `trainers.classification:ClassificationTrainer` (seed `SEED`, one thread) for
`EPOCHS` epochs; after each epoch it records the training loss, the validation loss and accuracy (the search
metric), the test accuracy (reported, never searched on) and `seconds`: the CPU time (one thread) of that epoch's
training and validation, what a search pays for the epoch's metric (the test evaluation is not counted). CPU time,
not wall time, because the build shares its cores: wall time would record the load of the moment (it is kept as
`wall_seconds`, to be looked at). Finished configurations
are appended to a cache file (JSON lines, one a configuration) as they finish, so a killed build resumes where it
stopped; once all are there, the table is written (one row per configuration and epoch, parquet with zstd).

    python benchmarks/lc_table_build.py                 # resumes from the cache; prints progress to stderr
    python benchmarks/lc_table_build.py --limit 5       # time a few configurations first
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nasplat.trainer import WorkerContext, start  # noqa: E402
from search_spaces.lc_table import EPOCHS, FIXED, GRID, SEED, cnn_config, configs  # noqa: E402
from trainers.classification import ClassificationTrainer, load_dataset  # noqa: E402

CURVES = ("train_loss", "valid_loss", "valid_acc", "test_acc", "seconds", "wall_seconds")  # per epoch
TABLE = Path(__file__).resolve().parent / "data" / "mnist1d_cnn_curves.parquet"
CACHE = Path(os.environ.get("NASPLAT_CACHE", "~/.cache/nasplat")).expanduser() / "lc_table_build_cpu.jsonl"


def key(config: dict[str, Any]) -> str:
    """A configuration's identity in the cache."""
    return json.dumps([config[k] for k in GRID])


def train(config: dict[str, Any]) -> dict[str, Any]:
    """One configuration's curves: per epoch train_loss, valid_loss, valid_acc, test_acc, seconds, wall_seconds."""
    trainer = start(ClassificationTrainer(), cnn_config(config), WorkerContext(seed=SEED))
    curves: dict[str, list[float]] = {k: [] for k in CURVES}
    for _ in range(EPOCHS):
        began, wall = time.process_time(), time.perf_counter()
        train_loss = trainer.train_epoch()
        valid_loss, valid_acc = trainer.evaluate("valid")
        seconds, wall = time.process_time() - began, time.perf_counter() - wall
        test_acc = trainer.evaluate("test")[1]
        for name, value in zip(curves, (train_loss, valid_loss, valid_acc, test_acc, seconds, wall)):
            curves[name].append(float(value))
    params = sum(p.numel() for p in trainer.net.parameters() if p.requires_grad)
    return {"key": key(config), "config": config, "params": params, **curves}


def load_cache(path: Path) -> dict[str, dict[str, Any]]:
    """The finished configurations of the grid in the cache (a torn last line, from a kill mid-write, is skipped)."""
    done: dict[str, dict[str, Any]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            config = entry["config"]  # kept if it is a config of the grid (an earlier grid's extra keys as fixed)
            if all(config.get(k) in options for k, options in GRID.items()) and \
                    all(config[k] == FIXED[k] for k in config if k not in GRID):
                entry["config"] = {k: config[k] for k in GRID}
                done[key(config)] = {**entry, "key": key(config)}
    return done


def write_table(entries: list[dict[str, Any]], path: Path) -> pd.DataFrame:
    """One row per (configuration, epoch), in grid order."""
    rows = []
    for index, entry in enumerate(entries):
        for epoch in range(EPOCHS):
            rows.append({"config_id": index, **entry["config"], "params": entry["params"], "epoch": epoch + 1,
                         **{k: entry[k][epoch] for k in CURVES}})
    frame = pd.DataFrame(rows)
    frame = frame.astype({"config_id": "int32", "params": "int32", "epoch": "int8"})
    frame[["seconds", "wall_seconds"]] = frame[["seconds", "wall_seconds"]].round(5)  # not more exact than that
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(path, compression="zstd", index=False)
    return frame


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, default=CACHE, help="finished configurations (JSON lines)")
    parser.add_argument("--out", type=Path, default=TABLE)
    parser.add_argument("--limit", type=int, default=None, help="train at most this many new configurations")
    args = parser.parse_args()
    torch.set_num_threads(1)
    load_dataset("mnist1d")
    grid = configs()
    order = np.random.default_rng(0).permutation(len(grid))  # a random order: any prefix is a fair sample
    done = load_cache(args.cache)
    todo = [grid[i] for i in order if key(grid[i]) not in done]
    print(f"{len(grid)} configurations, {len(done)} cached, {len(todo)} to train", file=sys.stderr, flush=True)
    args.cache.parent.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    for count, config in enumerate(todo[:args.limit], start=1):
        entry = train(config)
        with args.cache.open("a") as f:
            f.write(json.dumps(entry) + "\n")
        done[entry["key"]] = entry
        elapsed = time.perf_counter() - began
        print(f"{count}/{len(todo)} {elapsed:.0f}s ({elapsed / count:.2f}s a config) {entry['key']}: valid "
              f"{entry['valid_acc'][0]:.3f} -> {entry['valid_acc'][-1]:.3f}", file=sys.stderr, flush=True)
    if all(key(c) in done for c in grid):
        frame = write_table([done[key(c)] for c in grid], args.out)
        final = frame[frame["epoch"] == EPOCHS]
        print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.2f} MB): {len(grid)} configurations, "
              f"{len(frame)} rows, {frame['seconds'].sum():.0f} s of training recorded; final valid acc best "
              f"{final['valid_acc'].max():.4f}, median {final['valid_acc'].median():.4f}", file=sys.stderr)


if __name__ == "__main__":
    main()
