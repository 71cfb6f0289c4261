"""A tabular objective on the `simulated` executor: a search over a table of precomputed results.

Each trial looks its config up in a table (here a synthetic one: an accuracy and the seconds a real
training run would have taken) and reports `time_cost`; the simulated executor advances its clock by that
many seconds instead of waiting, so a search of hours of "training" runs in a second and the time budget
means simulated seconds. A space rule forbids the configs the table has no entry for.

    python examples/tabular.py
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import numpy as np

import nasplat
from nasplat import Choice, Space, Trainer

WIDTHS, DEPTHS, OPS = [16, 32, 64, 128], [1, 2, 3, 4], ["conv", "pool", "skip"]
OP_BONUS = {"conv": 1.0, "pool": 0.3, "skip": 0.0}


def make_table(seed: int = 0) -> dict[tuple[int, int, str], tuple[float, float]]:
    """(width, depth, op) -> (accuracy in %, seconds to train): wider and deeper is better and slower."""
    rng = np.random.default_rng(seed)
    table = {}
    for width, depth, op in itertools.product(WIDTHS, DEPTHS, OPS):
        quality = 0.4 * np.log2(width / 16) + 0.5 * depth - 0.1 * depth ** 2 + OP_BONUS[op]
        table[width, depth, op] = (float(80 + 4 * quality + rng.normal(0, 0.3)), float(width * depth * 0.5))
    del table[128, 4, "skip"]  # a run that never finished: the space must not propose it
    return table


TABLE = make_table()


def missing(config: dict[str, Any]) -> bool:
    """True for a config the table has no entry for."""
    return (config["width"], config["depth"], config["op"]) not in TABLE


space = Space({"width": Choice(WIDTHS), "depth": Choice(DEPTHS), "op": Choice(OPS)},
              forbidden={"not in the table": missing})


class TableLookup(Trainer):
    """One step = one finished training run, looked up; `time_cost` is what the simulated clock charges."""

    def setup(self, config, ctx):
        self.accuracy, self.seconds = TABLE[config["width"], config["depth"], config["op"]]

    def step(self):
        return {"accuracy": self.accuracy, "time_cost": self.seconds}

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def main() -> None:
    result = nasplat.run(trainer=TableLookup, space=space, metric="accuracy", controller="local_search",
                         executor="simulated", time_budget_s=1_000.0, seed=0)
    frame = result.dataframe()
    best = result.best
    table_best = max(TABLE.values())[0]
    print(f"{len(frame)} lookups, {frame['time_cost'].sum():.0f} simulated seconds of training; "
          f"best accuracy {best['accuracy']:.2f} (the table's best: {table_best:.2f})")
    print(json.dumps({"trials": len(frame), "simulated_s": float(frame["time_cost"].sum()),
                      "best_accuracy": float(best["accuracy"]), "table_best": table_best,
                      "best_config": {k: best["config"][k] for k in ("width", "depth", "op")}}))


if __name__ == "__main__":
    main()
