"""TensorBoard, MLflow, Optuna's study, dashboard and importance, and table export, on one real search.

A tiny PyTorch MLP (one or two hidden layers: a conditional space) trains on scikit-learn's digits on the
`local` executor, run from an experiment file through `nasplat run`, with `callbacks: [mlflow]` against a
real `mlflow server` (SQLite backend) on 127.0.0.1 for MLflow's test; TensorBoard's event files are written
by default. Everything is read back with each tool's own reader and compared with `results.jsonl`.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from browser import chromium, console_errors, needs_chromium
from servers import free_port, server
from sklearn.datasets import load_digits

import nasplat
from nasplat import Choice, Float, Int, Trainer, WorkerContext
from nasplat.cli import main
from nasplat.core.trees import flatten
from nasplat.engine.result import ExperimentResult
from nasplat.integrations import param_importances
from nasplat.integrations.export import table
from nasplat.report import build_report

BIN = Path(sys.executable).parent
SPACE = {
    "lr": Float(1e-3, 1e-1, log=True),
    "act": Choice(["relu", "tanh"]),
    "depth": Choice([{"n": 1, "width0": Int(8, 32)}, {"n": 2, "width0": Int(8, 32), "width1": Int(8, 32)}]),
}
TRIALS, STEPS = 6, 3


class TinyMLP(Trainer):
    """An MLP on digits' 8x8 pixels: six minibatches of Adam per step, accuracy on the last 597 digits."""

    def setup(self, config: dict[str, Any], ctx: WorkerContext) -> None:
        features, labels = load_digits(return_X_y=True)
        self.x, self.y = torch.tensor(features / 16.0, dtype=torch.float32), torch.tensor(labels)
        torch.manual_seed(ctx.seed)
        depth = config["depth"]
        widths = [depth["width0"]] + ([depth["width1"]] if depth["n"] == 2 else [])
        layers: list[torch.nn.Module] = []
        width = 64
        for hidden in widths:
            layers += [torch.nn.Linear(width, hidden), torch.nn.ReLU() if config["act"] == "relu" else torch.nn.Tanh()]
            width = hidden
        self.model = torch.nn.Sequential(*layers, torch.nn.Linear(width, 10))
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=config["lr"])

    def step(self) -> dict[str, Any]:
        for start in range(0, 1200, 200):
            self.optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(self.model(self.x[start:start + 200]),
                                                     self.y[start:start + 200])
            loss.backward()
            self.optimizer.step()
        with torch.no_grad():
            accuracy = (self.model(self.x[1200:]).argmax(1) == self.y[1200:]).float().mean().item()
        return {"val_acc": accuracy, "loss": loss.item()}

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])


def run_file(folder: Path, name: str, **spec: Any) -> tuple[Path, str]:
    """Run the search from an experiment file through `nasplat run`; returns its folder and the run's stderr."""
    spec = {"name": name, "trainer": "test_integrations:TinyMLP", "space": "test_integrations:SPACE",
            "metric": "val_acc", "controller": "random", "budget": {"max_trials": TRIALS, "max_steps": STEPS},
            "executor": "local", "storage": str(folder), "seed": 3, **spec}
    (folder / f"{name}.yaml").write_text(yaml.safe_dump(spec))
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        assert main(["run", str(folder / f"{name}.yaml")]) == 0, err.getvalue()[-3000:]
    return folder / name, err.getvalue()


@pytest.fixture(scope="module")
def experiment(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The search of every test but MLflow's: its folder and the run's stderr."""
    return run_file(tmp_path_factory.mktemp("experiment"), "digits")


def rows_by_trial(folder: Path) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    for line in (folder / "results.jsonl").read_text().splitlines():
        row = json.loads(line)
        out.setdefault(row["trial_id"], []).append(row)
    return out


@pytest.mark.slow  # the server's start-up (it migrates a fresh SQLite database) takes 30-60 s here
def test_mlflow_server_holds_a_parent_run_and_one_nested_run_per_trial(mlflow_url, tmp_path):
    from mlflow.tracking import MlflowClient

    callback = {"name": "mlflow", "tracking_uri": mlflow_url, "experiment": "nasplat-digits"}
    folder, _ = run_file(tmp_path, "digits", callbacks=[callback],  # `callbacks:` in the YAML
                         checkpoint={"at_end": True, "keep_best": 2})
    trials, best = rows_by_trial(folder), ExperimentResult.load(folder).best
    client = MlflowClient(tracking_uri=mlflow_url)  # every call below is a REST request to the server
    runs = client.search_runs([client.get_experiment_by_name("nasplat-digits").experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert [r.info.run_name for r in parents] == ["digits"]
    parent = parents[0]
    assert parent.info.status == "FINISHED" and parent.data.params["metric"] == "val_acc"
    assert parent.data.tags["best_trial_id"] == str(best["trial_id"])
    assert parent.data.metrics["best_val_acc"] == pytest.approx(best["val_acc"], rel=1e-12)
    children = {int(r.data.tags["nasplat.trial_id"]): r for r in runs if r is not parent}
    assert sorted(children) == sorted(trials) == list(range(TRIALS))
    for trial, rows in trials.items():
        run = children[trial]
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id and run.info.run_name == f"trial-{trial}"
        assert run.data.params == {k: str(v) for k, v in flatten(rows[0]["config"]).items()}
        for metric in ("val_acc", "loss"):
            history = client.get_metric_history(run.info.run_id, metric)
            assert [(m.step, m.value) for m in history] == [(r["step"], r[metric]) for r in rows]
        assert run.info.status == "FINISHED" and run.data.tags["nasplat.status"] == "completed"
        assert run.data.tags.get("nasplat.best") == ("true" if trial == best["trial_id"] else None)
    # the checkpoints kept (the 2 best trials' final states) are the artifacts of their trials' runs
    kept = {int(p.name.split("-")[1]) for p in (folder / "checkpoints").glob("trial-*")}
    assert len(kept) == 2 and best["trial_id"] in kept
    for trial, run in children.items():
        names = {a.path for a in client.list_artifacts(run.info.run_id, "checkpoint")}
        assert names == ({"checkpoint/state.pt", "checkpoint/manifest.json"} if trial in kept else set()), trial


def test_tensorboard_event_files_hold_every_step_and_the_config_as_hparams(experiment):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import metadata
    from tensorboard.plugins.hparams.api_pb2 import Status

    folder, stderr = experiment
    assert f"tensorboard --logdir {folder}" in stderr
    trials = rows_by_trial(folder)
    assert sorted(p.name for p in (folder / "tensorboard").iterdir()) == [f"trial-{t}" for t in sorted(trials)]
    for trial, rows in trials.items():
        events = EventAccumulator(str(folder / "tensorboard" / f"trial-{trial}"))
        events.Reload()
        for metric in ("val_acc", "loss"):
            scalars = [(e.step, e.value) for e in events.Scalars(metric)]
            assert scalars == [(r["step"], float(np.float32(r[metric]))) for r in rows]  # stored as float32
        content = events.PluginTagToContent(metadata.PLUGIN_NAME)
        start = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG])
        shown = {k: v.string_value or v.number_value for k, v in start.hparams.items()}
        assert shown == flatten(rows[0]["config"])
        end = metadata.parse_session_end_info_plugin_data(content[metadata.SESSION_END_INFO_TAG])
        assert end.status == Status.Value("STATUS_SUCCESS")


def test_to_optuna_writes_a_study_optuna_loads_with_every_trial_step_and_the_best(experiment, tmp_path):
    import optuna

    folder, _ = experiment
    result, trials = ExperimentResult.load(folder), rows_by_trial(folder)
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    nasplat.to_optuna(result, storage=storage)
    study = optuna.load_study(study_name="digits", storage=storage)
    assert study.direction == optuna.study.StudyDirection.MAXIMIZE and len(study.trials) == TRIALS
    for trial in study.trials:
        rows = trials[trial.user_attrs["nasplat_trial_id"]]
        config = rows[0]["config"]
        assert trial.state == optuna.trial.TrialState.COMPLETE
        assert trial.intermediate_values == {r["step"]: r["val_acc"] for r in rows}
        assert trial.value == max(r["val_acc"] for r in rows)
        branch = config["depth"]["n"] - 1
        expected = {"lr": config["lr"], "act": config["act"], "depth": branch,
                    f"depth[{branch}].width0": config["depth"]["width0"]}
        if branch:
            expected["depth[1].width1"] = config["depth"]["width1"]
        assert trial.params == expected
        assert trial.distributions["act"] == optuna.distributions.CategoricalDistribution(["relu", "tanh"])
        assert trial.distributions["lr"] == optuna.distributions.FloatDistribution(1e-3, 1e-1, log=True)
    assert study.best_trial.user_attrs["nasplat_trial_id"] == result.best["trial_id"]
    assert study.best_value == result.best["val_acc"]


@needs_chromium
def test_optuna_dashboard_lists_the_exported_trials_in_headless_chromium(experiment, tmp_path):
    import optuna

    folder, _ = experiment
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = nasplat.to_optuna(ExperimentResult.load(folder), storage=storage)
    port = free_port()
    command = [str(BIN / "optuna-dashboard"), storage, "--host", "127.0.0.1", "--port", str(port)]
    with server(command, f"http://127.0.0.1:{port}/api/studies", tmp_path / "dashboard.log"):
        study_id = optuna.storages.RDBStorage(storage).get_study_id_from_name(study.study_name)
        page = f"http://127.0.0.1:{port}/dashboard/studies/{study_id}/trials"
        shown = chromium(page, tmp_path, "--virtual-time-budget=15000", "--dump-dom")
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert not console_errors(shown.stderr)
    listed = {int(n) for n in re.findall(r"Trial (\d+)", shown.stdout)}
    assert listed == {t.number for t in study.trials} == set(range(TRIALS))


def test_export_parquet_and_csv_round_trip_with_one_column_per_decision(experiment, tmp_path, capsys, monkeypatch):
    folder, _ = experiment
    monkeypatch.chdir(tmp_path)  # the default output goes here, named after the experiment, never into its folder
    expected = table(ExperimentResult.load(folder))
    assert {"config.lr", "config.act", "config.depth.n", "config.depth.width0", "config.depth.width1"} <= set(
        expected.columns) and "config" not in expected.columns
    one_layer = expected["config.depth.n"] == 1
    assert expected.loc[one_layer, "config.depth.width1"].isna().all()
    assert expected.loc[~one_layer, "config.depth.width1"].notna().all()
    assert main(["export", str(folder)]) == 0
    assert capsys.readouterr().out.strip() == f"exported: {folder.name}.parquet"
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / f"{folder.name}.parquet"), expected)
    assert main(["export", str(folder), "--format", "csv", "-o", str(tmp_path / "rows.csv")]) == 0
    back = pd.read_csv(tmp_path / "rows.csv")
    assert list(back.columns) == list(expected.columns)
    for column in ("trial_id", "step", "val_acc", "loss", "config.lr", "config.depth.n", "config.depth.width1"):
        np.testing.assert_array_equal(back[column].to_numpy(float), expected[column].to_numpy(float))
    assert list(back["config.act"]) == list(expected["config.act"])


def test_status_importance_prints_optunas_importances_and_the_report_shows_them(experiment, capsys):
    folder, _ = experiment
    result = ExperimentResult.load(folder)
    for evaluator, flag in (("fanova", []), ("ped-anova", ["ped-anova"])):
        importances = param_importances(result, evaluator=evaluator)
        assert main(["status", str(folder), "--importance", *flag]) == 0
        out = capsys.readouterr().out
        lines = out.split(f"decision importance for val_acc (Optuna, {evaluator}):\n")[1].splitlines()
        assert [line.split() for line in lines] == [[k, f"{v:.3f}"] for k, v in importances.items()]
    fanova = param_importances(result)
    assert set(fanova) == {"lr", "act", "depth"} and math.isclose(sum(fanova.values()), 1.0)
    page = build_report(folder).read_text()
    section = page.split("<section id='importance'>")[1].split("</section>")[0]
    assert all(f"<td>{name}</td>" in section for name in fanova)


def test_too_few_trials_for_importance_is_one_clear_line(experiment, tmp_path, capsys):
    folder, _ = experiment
    rows = [r for r in ExperimentResult.load(folder).rows if r["trial_id"] == 0]
    with pytest.raises(ValueError, match=r"needs at least 2 completed trials, got 1"):
        param_importances(ExperimentResult(rows, "val_acc"), space=SPACE)
    with pytest.raises(ValueError, match=r"`evaluator` must be one of \['fanova', 'ped-anova'\], got 'gini'"):
        param_importances(ExperimentResult(rows, "val_acc"), evaluator="gini", space=SPACE)


def test_a_missing_extra_is_one_line_naming_the_extra(tmp_path, monkeypatch, capsys):
    from nasplat.integrations import MLflowLogger, TensorBoardLogger, default_listeners, make_callbacks

    by_name = make_callbacks(["mlflow", {"name": "tensorboard", "logdir": str(tmp_path)}])
    assert [type(c) for c in by_name] == [MLflowLogger, TensorBoardLogger] and by_name[1].logdir == tmp_path
    assert default_listeners(tmp_path, by_name) == []  # no second TensorBoard writer beside the one asked for
    assert [type(c) for c in default_listeners(tmp_path, [])] == [TensorBoardLogger]
    spec = {"trainer": "test_integrations:TinyMLP", "space": "test_integrations:SPACE", "metric": "val_acc",
            "controller": "random", "budget": {"max_trials": 1}, "executor": "local", "callbacks": ["mlflow"]}
    (tmp_path / "e.yaml").write_text(yaml.safe_dump(spec))
    monkeypatch.setitem(sys.modules, "mlflow", None)  # what an install without the extra looks like to import
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    assert main(["run", str(tmp_path / "e.yaml"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err == ("nasplat run: error: mlflow is not installed (needed by nasplat's mlflow integration); "
                   "install it with: pip install 'nasplat[mlflow]'\n")
    with pytest.raises(ImportError, match=r"pip install 'nasplat\[tensorboard\]'"):
        make_callbacks(["tensorboard"])
    assert default_listeners(tmp_path, []) == []  # TensorBoard is on by default only where it is installed
    with pytest.raises(ValueError, match=r"unknown callback 'wandb' in 'wandb'; allowed: \['mlflow', 'tensorboard'\]"):
        make_callbacks(["wandb"])


class FlakyMLP(TinyMLP):
    """`TinyMLP` whose first attempt of trial 0 crashes at its second step, and whose trial 1 never trains."""

    crashes_left = 1

    def setup(self, config: dict[str, Any], ctx: WorkerContext) -> None:
        super().setup(config, ctx)
        self.steps = 0
        self.doomed = config["act"] == "tanh"

    def step(self) -> dict[str, Any]:
        self.steps += 1
        if self.doomed or (self.steps == 2 and FlakyMLP.crashes_left):
            FlakyMLP.crashes_left -= not self.doomed
            raise RuntimeError("synthetic crash")
        return super().step()


def test_tensorboard_shows_a_retried_trial_once_and_a_failed_one_as_failed(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import metadata
    from tensorboard.plugins.hparams.api_pb2 import Status

    result = nasplat.run(trainer=FlakyMLP, space={**SPACE, "act": Choice(["relu"])}, metric="val_acc",
                         executor="local", max_trials=1, max_steps=STEPS, max_failures=1, storage=tmp_path,
                         name="flaky")
    rows = rows_by_trial(tmp_path / "flaky")[0]
    assert [(r["attempt"], r["step"], r["status"]) for r in rows] == [
        (0, 1, "running"), (0, 2, "retried"), (1, 1, "running"), (1, 2, "running"), (1, 3, "completed")]
    events = EventAccumulator(str(tmp_path / "flaky" / "tensorboard" / "trial-0"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("val_acc")] == [
        (r["step"], float(np.float32(r["val_acc"]))) for r in rows[2:]]  # the first attempt's step 1 is hidden
    assert result.counts() == {"completed": 1}

    doomed = nasplat.run(trainer=FlakyMLP, space={**SPACE, "act": Choice(["tanh"])}, metric="val_acc",
                         executor="local", max_trials=1, max_steps=STEPS, storage=tmp_path, name="doomed")
    assert doomed.counts() == {"failed": 1}
    events = EventAccumulator(str(tmp_path / "doomed" / "tensorboard" / "trial-0"))
    events.Reload()
    content = events.PluginTagToContent(metadata.PLUGIN_NAME)
    end = metadata.parse_session_end_info_plugin_data(content[metadata.SESSION_END_INFO_TAG])
    assert end.status == Status.Value("STATUS_FAILURE")
