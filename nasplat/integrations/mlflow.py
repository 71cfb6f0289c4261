"""MLflow tracking: one parent run per experiment, one nested run per trial, the best trial tagged.

`callbacks: [mlflow]` in an experiment file, or `nasplat.run(callbacks=[MLflowLogger(...)])`; needs the
`mlflow` extra (`pip install nasplat[mlflow]`). Written through `mlflow.tracking.MlflowClient`.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from nasplat.core.rows import Status
from nasplat.core.trees import flatten
from nasplat.engine.listener import Listener
from nasplat.integrations.extras import require, row_metrics

BEST_TAG = "nasplat.best"
QUIET = "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"  # read by MLflow when a run ends


class MLflowLogger(Listener):
    """An engine listener logging the experiment to the MLflow tracking server at `tracking_uri`.

    `tracking_uri`: the server (`http://127.0.0.1:5000`), a local store (`sqlite:///mlflow.db`), or None for
    MLflow's default (`$MLFLOW_TRACKING_URI`). `experiment`: the MLflow experiment's name (created when
    missing; default: the nasplat experiment's name). The parent run holds the search's settings; each
    trial's nested run (`mlflow.parentRunId`) holds its config as params (nested decisions as `depth.n`),
    every step's metrics (MLflow's step = the trial's step) and its end status. At the end the best
    trial's run is tagged `nasplat.best=true` and the parent gets `best_trial_id` and `best_<metric>`.
    """

    def __init__(self, *, tracking_uri: str | None = None, experiment: str | None = None) -> None:
        require("mlflow", "mlflow")
        self.tracking_uri, self.experiment = tracking_uri, experiment
        self._reset()

    def _reset(self) -> None:
        self._client: Any = None
        self.experiment_id: str | None = None
        self.parent_run_id: str | None = None
        self.runs: dict[int, str] = {}  # trial id -> MLflow run id
        self._open: set[int] = set()  # trials whose run is not terminated yet

    def __getstate__(self) -> dict[str, Any]:
        return {"tracking_uri": self.tracking_uri, "experiment": self.experiment}  # no client, no run ids

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def on_start(self, engine: Any) -> None:
        from mlflow.tracking import MlflowClient

        self._client = MlflowClient(tracking_uri=self.tracking_uri)
        name = self.experiment or engine.name
        found = self._client.get_experiment_by_name(name)
        self.experiment_id = found.experiment_id if found is not None else self._client.create_experiment(name)
        controller = engine.controller
        run = self._client.create_run(self.experiment_id, run_name=engine.name, tags={
            "nasplat.experiment": engine.name, "nasplat.folder": str(engine.path or "")})
        self.parent_run_id = run.info.run_id
        settings = {"controller": type(controller).__name__, "metric": controller.metric, "mode": controller.mode,
                    "seed": engine.seed, "max_trials": engine.budget.max_trials,
                    "time_budget_s": engine.budget.time_s, "max_steps": engine.budget.max_steps,
                    "executor": type(engine.executor).__name__, "concurrency": engine.executor.concurrency}
        self._log_params(self.parent_run_id, settings)

    def on_row(self, engine: Any, row: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        trial = row["trial_id"]
        run_id = self.runs.get(trial) or self._start_trial(row)
        stamp = int(time.time() * 1000)
        metrics = [Metric(key, value, stamp, row["step"]) for key, value in row_metrics(row).items()]
        self._client.log_batch(run_id, metrics=metrics)
        if row["status"] != Status.RUNNING:
            self._client.set_tag(run_id, "nasplat.status", row["status"])
            self._client.set_tag(run_id, "nasplat.final_config", json.dumps(row["config"], default=repr))
            self._terminate(run_id, "FAILED" if row["status"] == Status.FAILED else "FINISHED")
            self._open.discard(trial)

    def on_end(self, engine: Any) -> None:
        if self._client is None:
            return
        for trial in sorted(self._open):  # interrupted: trials that did not end
            self._terminate(self.runs[trial], "KILLED")
        for trial, run_id in self.runs.items():  # the checkpoints kept, as artifacts of their trials' runs
            record = engine.trials.get(trial)
            uri = getattr(getattr(record, "checkpoint", None), "uri", None)
            if uri is not None and Path(uri).is_dir():  # a local checkpoint folder (not one behind a URI)
                self._client.log_artifacts(run_id, uri, artifact_path="checkpoint")
        best = engine.best_row
        if best is not None and best["trial_id"] in self.runs:
            self._client.set_tag(self.runs[best["trial_id"]], BEST_TAG, "true")
            self._client.set_tag(self.parent_run_id, "best_trial_id", str(best["trial_id"]))
            self._client.log_metric(self.parent_run_id, f"best_{engine.controller.metric}",
                                    float(best[engine.controller.metric]), step=int(best["step"]))
        self._client.set_terminated(self.parent_run_id, "KILLED" if self._open else "FINISHED")
        self._open.clear()

    def _start_trial(self, row: dict[str, Any]) -> str:
        from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

        trial = row["trial_id"]
        tags = {MLFLOW_PARENT_RUN_ID: self.parent_run_id, "nasplat.trial_id": str(trial)}
        if row.get("parent_id") is not None:
            tags["nasplat.parent_trial_id"] = str(row["parent_id"])
        run = self._client.create_run(self.experiment_id, run_name=f"trial-{trial}", tags=tags)
        self._log_params(run.info.run_id, flatten(row["config"]))
        self.runs[trial] = run.info.run_id
        self._open.add(trial)
        return run.info.run_id

    def _terminate(self, run_id: str, status: str) -> None:
        """End a trial's run without MLflow's two "View run" lines per trial (the parent run's still print)."""
        before = os.environ.get(QUIET)
        os.environ[QUIET] = "true"
        try:
            self._client.set_terminated(run_id, status)
        finally:
            if before is None:
                del os.environ[QUIET]
            else:
                os.environ[QUIET] = before

    def _log_params(self, run_id: str, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        self._client.log_batch(run_id, params=[Param(key, str(value)) for key, value in params.items()])
