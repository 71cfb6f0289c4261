"""The MNIST-1D learning-curve table (`benchmarks/data/mnist1d_cnn_curves.parquet`), its space and its replaying
trainer: every configuration is there, and a run on `simulated` or `local` reports the recorded numbers exactly."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import nasplat
from search_spaces.lc_table import EPOCHS, GRID, configs, space
from trainers.lc_table import TABLE, LCTable, load_curves


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    """The table, indexed by the grid's decisions and the epoch (read by pandas, not by the trainer)."""
    return pd.read_parquet(TABLE).set_index([*GRID, "epoch"]).sort_index()


def recorded(frame: pd.DataFrame, config: dict, epoch: int) -> pd.Series:
    return frame.loc[tuple(config[k] for k in GRID) + (epoch,)]


def test_every_configuration_of_the_space_is_in_the_table_with_every_epoch(frame):
    grid = configs()
    assert len(grid) == int(np.prod([len(v) for v in GRID.values()])) == 192
    in_table = {key[:-1] for key in frame.index}
    assert in_table == {tuple(c[k] for k in GRID) for c in grid} and len(frame) == len(grid) * EPOCHS
    for config in grid:
        space.validate(config)
    assert frame.groupby(level=list(GRID)).size().eq(EPOCHS).all()
    assert frame["seconds"].gt(0).all() and np.isfinite(frame["seconds"]).all()
    assert frame["valid_acc"].between(0, 1).all() and frame["test_acc"].between(0, 1).all()
    sampled = space.sample(np.random.default_rng(0))
    assert tuple(sampled[k] for k in GRID) in in_table
    assert TABLE.stat().st_size < 3_000_000


def test_the_table_is_hard_the_best_configs_are_rare_and_early_epochs_mislead(frame):
    final = frame.xs(EPOCHS, level="epoch")["valid_acc"]
    early = frame.xs(3, level="epoch")["valid_acc"]
    assert (final >= final.max() - 0.01).sum() <= 0.05 * len(final)  # within a point of the best: at most 5%
    ranks = np.corrcoef(early.rank(), final.rank())[0, 1]
    assert 0.2 < ranks < 0.95  # epoch 3 predicts epoch 27, imperfectly
    assert early.idxmax() != final.idxmax()


def test_replay_on_the_simulated_executor_reports_the_table_and_spends_its_seconds_exactly(frame):
    result = nasplat.run(trainer=LCTable, space=space, metric="valid_acc", executor="simulated", concurrency=1,
                         max_trials=3, max_steps=EPOCHS + 3, seed=0)
    rows = result.rows
    assert len(rows) == 3 * EPOCHS and {r["status"] for r in rows if r["step"] == EPOCHS} == {"completed"}
    clock = 0.0
    for row in rows:  # one worker: the steps run one after another
        table = recorded(frame, row["config"], row["step"])
        assert row["epoch"] == row["step"] and row["done"] == (row["step"] == EPOCHS)
        assert (row["valid_acc"], row["test_acc"], row["time_cost"]) == (table.valid_acc, table.test_acc,
                                                                          table.seconds)
        assert row["start"] == clock and row["end"] == pytest.approx(clock + table.seconds, abs=1e-9)
        clock = row["end"]


def test_replay_on_the_local_executor_reports_the_same_numbers(frame):
    result = nasplat.run(trainer=LCTable, space=space, metric="valid_acc", executor="local", max_trials=4,
                         max_steps=5, seed=1)
    assert len(result.rows) == 20
    for row in result.rows:
        table = recorded(frame, row["config"], row["step"])
        assert (row["valid_acc"], row["test_acc"], row["valid_loss"], row["train_loss"], row["time_cost"]) == (
            table.valid_acc, table.test_acc, table.valid_loss, table.train_loss, table.seconds)


def test_a_promoted_trial_goes_on_from_its_epoch(frame):
    result = nasplat.run(trainer=LCTable, space=space, metric="valid_acc", executor="simulated", concurrency=4,
                         max_trials=30, max_steps=EPOCHS, seed=2, scheduler={"name": "asha", "type": "promote"})
    promoted = [r for r in result.rows if r["step"] in (2, 4, 10)]
    assert promoted and all(r["epoch"] == r["step"] for r in promoted)
    for row in promoted:
        assert row["valid_acc"] == recorded(frame, row["config"], row["step"]).valid_acc


def test_a_config_outside_the_grid_is_named():
    trainer = LCTable()
    config = {**configs()[0], "lr": 0.03}
    with pytest.raises(ValueError, match=r"config\['lr'\] must be one of \[0.001, .*\] .* got 0.03"):
        trainer.setup(config, nasplat.WorkerContext())
    assert load_curves() is load_curves()  # read once per process


def test_the_build_script_trains_a_configuration_to_the_tables_numbers(frame):
    from benchmarks_path import BENCHMARKS  # noqa: F401  (puts benchmarks/ on sys.path)
    from lc_table_build import train

    config = {"depth": 1, "channels": 16, "lr": 0.1, "batch_size": 128, "weight_decay": 1e-3}  # the cheapest kind
    entry = train(config)
    table = frame.loc[tuple(config[k] for k in GRID)]
    assert entry["valid_acc"] == table["valid_acc"].tolist() and entry["test_acc"] == table["test_acc"].tolist()
    assert entry["train_loss"] == pytest.approx(table["train_loss"].tolist(), rel=1e-6)
