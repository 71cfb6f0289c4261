"""A supernet training trial is an ordinary trial to the trackers: its curve is in TensorBoard's event files and on
a real MLflow server, step by step as its rows record it (issue 20)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import nasplat
from nasplat import Choice
from nasplat.engine.result import ExperimentResult
from nasplat.integrations import MLflowLogger
from trainers.supernet import NB201SupernetTrainer

EPOCHS = 3
CURVE = ("train_loss", "valid_acc", "paths_trained")  # the supernet's training curve, as the report draws it


@pytest.mark.slow  # the MLflow server's start-up, when no earlier test started it
def test_a_supernet_trial_is_tracked_in_tensorboard_and_mlflow(mlflow_url: str, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    nasplat.run(trainer=NB201SupernetTrainer, space={"channels": Choice([4]), "train_size": Choice([640]),
                                                     "sampler": Choice(["fairnas"]), "eval_paths": Choice([2])},
                metric="valid_acc", max_trials=1, max_steps=EPOCHS, seed=5, storage=str(tmp_path), name="supernet",
                callbacks=[MLflowLogger(tracking_uri=mlflow_url, experiment="nasplat-supernet")], progress=False)
    rows = ExperimentResult.load(tmp_path / "supernet").rows
    assert [r["step"] for r in rows] == list(range(1, EPOCHS + 1))
    assert rows[1]["paths_trained"] == 2 * rows[0]["paths_trained"] > 0  # one sampled path per batch, every epoch

    events = EventAccumulator(str(tmp_path / "supernet" / "tensorboard" / "trial-0"))
    events.Reload()
    client = MlflowClient(tracking_uri=mlflow_url)
    runs = client.search_runs([client.get_experiment_by_name("nasplat-supernet").experiment_id])
    trial_runs = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert [r.info.run_name for r in trial_runs] == ["trial-0"] and trial_runs[0].data.params["sampler"] == "fairnas"
    for metric in CURVE:
        scalars = [(e.step, e.value) for e in events.Scalars(metric)]
        assert scalars == [(r["step"], float(np.float32(r[metric]))) for r in rows]  # TensorBoard stores float32
        history = client.get_metric_history(trial_runs[0].info.run_id, metric)
        assert [(m.step, m.value) for m in history] == [(r["step"], r[metric]) for r in rows]
