"""The MNIST-1D learning-curve table as a trainer: one step = one recorded epoch of a `search_spaces.lc_table` config.

Replays `benchmarks/data/mnist1d_cnn_curves.parquet` (built by `benchmarks/lc_table_build.py`): step k reports
epoch k's `valid_acc` (the metric to search on), `test_acc` (reported only, never to be searched on), `valid_loss`,
`train_loss`, `epoch`, and `time_cost`, the measured seconds of that epoch's training and validation, so the
`simulated` executor spends exactly the time the real training took. The last recorded epoch also reports
`done: True`. The state is the epoch count: pausing, promoting, checkpoints and resume go on from where it stopped.

    nasplat.run(trainer=LCTable, space=search_spaces.lc_table.space, metric="valid_acc", executor="simulated",
                max_steps=27, concurrency=4, scheduler={"name": "asha", "type": "promote"})
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from nasplat.space import Config
from nasplat.trainer import Trainer, WorkerContext
from search_spaces.lc_table import EPOCHS, GRID, configs

TABLE = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "mnist1d_cnn_curves.parquet"
CURVES = ("valid_acc", "test_acc", "valid_loss", "train_loss", "seconds")  # the table's columns per epoch


class Curves:
    """The table as arrays of shape (configurations, epochs), configurations in `configs()` order."""

    def __init__(self, frame: pd.DataFrame, source: str) -> None:
        grid = configs()
        expected = len(grid) * EPOCHS
        if len(frame) != expected:
            raise ValueError(f"{source} must hold {len(grid)} configurations x {EPOCHS} epochs = {expected} rows, "
                             f"has {len(frame)}")
        frame = frame.sort_values(["config_id", "epoch"])
        ids, epochs = frame["config_id"].to_numpy(), frame["epoch"].to_numpy()
        if not (np.array_equal(ids, np.repeat(np.arange(len(grid)), EPOCHS))
                and np.array_equal(epochs, np.tile(np.arange(1, EPOCHS + 1), len(grid)))):
            raise ValueError(f"{source} must hold epochs 1..{EPOCHS} of each config_id 0..{len(grid) - 1} once")
        firsts = frame[frame["epoch"] == 1]
        for config_id, row in zip(firsts["config_id"], firsts[list(GRID)].to_dict("records")):
            if row != grid[config_id]:
                raise ValueError(f"{source}: config_id {config_id} is {row}, the space's is {grid[config_id]}")
        self.curves = {name: frame[name].to_numpy(dtype=float).reshape(len(grid), EPOCHS) for name in CURVES}
        self.params = firsts["params"].to_numpy()

    def index(self, config: Config) -> int:
        """The row of `config` (a config of `search_spaces.lc_table.space`); a ValueError names a value not in it."""
        index = 0
        for key, options in GRID.items():
            value = config.get(key)
            matches = [i for i, option in enumerate(options) if option == value and type(value) is not bool]
            if not matches:
                raise ValueError(f"config[{key!r}] must be one of {options} (the learning-curve table's grid), "
                                 f"got {value!r}")
            index = index * len(options) + matches[0]
        return index


@lru_cache(maxsize=2)
def load_curves(path: str = str(TABLE)) -> Curves:
    """The table at `path` (default: the one in the repository), read once per process."""
    if not Path(path).exists():
        raise FileNotFoundError(f"learning-curve table not found at {path}; build it with benchmarks/lc_table_build.py")
    return Curves(pd.read_parquet(path), path)


class LCTable(Trainer):
    """Replays a configuration's recorded epochs; `config` is one of `search_spaces.lc_table.space`."""

    deterministic = True  # equal configs report equal values at every step, whatever the seed

    def setup(self, config: Config, ctx: WorkerContext) -> None:
        self.table = load_curves()
        self.index = self.table.index(config)
        self.epoch = 0

    def step(self) -> dict[str, Any]:
        if self.epoch >= EPOCHS:
            raise ValueError(f"the learning-curve table records {EPOCHS} epochs; set max_steps <= {EPOCHS}")
        self.epoch += 1
        at = self.index, self.epoch - 1
        curves = self.table.curves
        metrics = {name: float(curves[name][at]) for name in ("valid_acc", "test_acc", "valid_loss", "train_loss")}
        return {**metrics, "time_cost": float(curves["seconds"][at]), "epoch": self.epoch,
                "params": int(self.table.params[self.index]), "done": self.epoch == EPOCHS}

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])
