"""The NAS-Bench-201 tabular objective: one step = one 12-epoch evaluation looked up in `nb201.csv`.

Follows the benchmark's search protocol (../shared/data/README.md): the search signal is the 12-epoch
validation accuracy; an evaluation costs `12 * train_s_per_epoch + valid_s_per_epoch` simulated seconds
(twice that on CIFAR-100); a search is scored by the 200-epoch test accuracy of the cell it returns.
Cost metrics beside the accuracies, for searches with several objectives: `params_mb` (parameters, millions)
and `train_s_per_epoch` (measured seconds per training epoch).
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from nasplat.space import Config
from nasplat.trainer import Trainer, WorkerContext
from search_spaces.nb201 import EDGES, OPS, from_arch_str

DATASETS = ("cifar10", "cifar100")
METRICS = ("valid_acc", "test_acc", "time_cost", "params_mb", "train_s_per_epoch")  # what each step reports


def shared_data_dir() -> Path:
    """`$NASPLAT_SHARED_DATA`, else `../shared/data` beside the repository."""
    default = Path(__file__).resolve().parents[1].parent / "shared" / "data"
    return Path(os.environ.get("NASPLAT_SHARED_DATA", default))


@lru_cache(maxsize=4)
def load_table(dataset: str = "cifar10") -> dict[str, np.ndarray]:
    """Columns of the table indexed by cell code (base-5 digits of the edges' operation indices)."""
    if dataset not in DATASETS:
        raise ValueError(f"unknown NAS-Bench-201 dataset {dataset!r}; allowed: {DATASETS}")
    path = shared_data_dir() / "nb201.csv"
    if not path.exists():
        raise FileNotFoundError(f"NAS-Bench-201 table not found at {path}; set NASPLAT_SHARED_DATA to its folder")
    frame = pd.read_csv(path)
    codes = np.array([cell_code(from_arch_str(a)) for a in frame["arch"]])
    order = np.argsort(codes)
    if not np.array_equal(codes[order], np.arange(len(OPS) ** len(EDGES))):
        raise ValueError(f"{path} must hold each of the {len(OPS) ** len(EDGES)} cells exactly once")
    scale = 2.0 if dataset == "cifar100" else 1.0  # CIFAR-100 trains on twice the images (see the README)
    cost = 12 * frame["cifar10_train_s_per_epoch"] + frame["cifar10_valid_s_per_epoch"]
    columns = {
        "valid_acc": frame[f"{dataset}_valid_acc_12ep"], "test_acc": frame[f"{dataset}_test_acc_200ep"],
        "time_cost": cost * scale, "params_mb": frame["params_mb"],
        "train_s_per_epoch": frame["cifar10_train_s_per_epoch"] * scale, "index": frame["index"],
    }
    return {k: np.asarray(v)[order] for k, v in columns.items()}


_OP_INDEX = {op: i for i, op in enumerate(OPS)}


def cell_code(config: Config) -> int:
    code = 0
    for edge in EDGES:
        code = code * len(OPS) + _OP_INDEX[config[edge]]
    return code


class NB201Table(Trainer):
    """Looks the cell up; `config["dataset"]` (default cifar10) picks the table's columns."""

    deterministic = True  # a lookup: a cell evaluated before is answered from the record

    def setup(self, config: Config, ctx: WorkerContext) -> None:
        self.table = load_table(config.get("dataset", "cifar10"))
        self.code = cell_code(config)

    def step(self) -> dict[str, Any]:
        t = self.table
        return {key: float(t[key][self.code]) for key in METRICS}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class NB201Protocol(NB201Table):
    """The table as the benchmark's published protocol uses it (`benchmarks/nb201.py`, Table 5): a cell proposed
    again is evaluated again and charged its simulated seconds again, as in the paper's searches, so that the
    figures compare with the published ones (`NB201Table` answers it from the record at no cost)."""

    deterministic = False


def best_possible(dataset: str = "cifar10") -> float:
    """The table's highest 200-epoch test accuracy (the benchmark's 'optimal' row)."""
    return float(load_table(dataset)["test_acc"].max())
