"""Bad input through the real `nasplat` command: each mistake is one stderr line naming what was wrong, exit code 2,
and nothing is created. The trainer and space live in the test's own folder, found because the command runs there."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nasplat.controllers import CONTROLLERS, RegularizedEvolution, check_controller_options
from nasplat.core.checks import check_int, check_name, check_real, check_run_options
from nasplat.core.pareto import parse_constraints
from nasplat.experiment.file import read_experiment
from nasplat.trainer import check_trainer

NASPLAT = Path(sys.executable).parent / "nasplat"  # the console script: it puts nothing on sys.path by itself

USER_MODULE = """
from nasplat import Float, Int, Trainer

space = {"x": Float(-2.0, 2.0), "k": Int(1, 5)}

class Toy(Trainer):
    def setup(self, config, ctx):
        self.x, self.t = config["x"], 0
    def step(self):
        self.t += 1
        return {"score": -(self.x - 1.0) ** 2 + 0.01 * self.t, "time_cost": 1.0}

class NotATrainer:
    def step(self):
        return {"score": 1.0}

def toy_function(config):
    return {"score": 1.0}
"""

GOOD = {"name": "ok", "trainer": "nsv_user:Toy", "space": "nsv_user:space", "metric": "score",
        "controller": {"name": "evolution", "population_size": 4, "sample_size": 2},
        "budget": {"max_trials": 6, "max_steps": 2}, "resources": {"concurrency": 2}, "executor": "simulated",
        "storage": "out", "seed": 0, "max_failures": 0}


def nasplat_cli(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(NASPLAT), *args], cwd=folder, capture_output=True, text=True, timeout=120)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "nsv_user.py").write_text(USER_MODULE)
    (tmp_path / "nsv_raises.py").write_text("import math\nspace = {'x': 1 / 0}\n")
    (tmp_path / "nsv_missing.py").write_text("import nsv_no_such_dependency\n")
    return tmp_path


def run_file(folder: Path, text: str, *extra: str) -> subprocess.CompletedProcess:
    (folder / "experiment.yaml").write_text(text)
    return nasplat_cli(folder, "run", "experiment.yaml", "--quiet", *extra)


def one_error_line(done: subprocess.CompletedProcess) -> str:
    """The single stderr line of a refused command, after checking the exit code and that nothing was created."""
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("nasplat run: error: "), done.stderr
    return lines[0]


def test_a_good_file_with_the_trainer_in_the_current_folder_runs_and_its_status_loads(folder: Path) -> None:
    done = run_file(folder, yaml.safe_dump(GOOD))
    assert done.returncode == 0, done.stderr
    status = nasplat_cli(folder, "status", "out/ok")
    assert status.returncode == 0 and "trials: 6 (6 completed)" in status.stdout, status.stderr


def test_malformed_yaml_names_the_file_and_the_line(folder: Path) -> None:
    text = yaml.safe_dump(GOOD, sort_keys=False).replace("metric: score", "metric: [score")
    line = one_error_line(run_file(folder, text))
    number = text.splitlines().index(next(s for s in text.splitlines() if s.startswith("metric"))) + 1
    assert "experiment.yaml: invalid YAML at line" in line
    assert int(line.split("line ")[1].split(",")[0]) in (number, number + 1)  # where the parser noticed it


@pytest.mark.parametrize("key, value, message", [
    ("space", "nsv_raises:space", "importing module 'nsv_raises' raised ZeroDivisionError: division by zero"),
    ("trainer", "nsv_missing:Toy", "cannot import module 'nsv_missing' (No module named 'nsv_no_such_dependency')"),
    ("trainer", "nsv_user:NotATrainer", "`trainer` must be a subclass of nasplat.Trainer"),
    ("trainer", "nsv_user:toy_function", "got the function nsv_user.toy_function"),
    ("trainer", "nsv_user:Nope", "module 'nsv_user' has no attribute 'Nope'"),
])
def test_user_modules_that_fail_or_name_no_trainer_are_one_line(folder: Path, key: str, value: str,
                                                                  message: str) -> None:
    line = one_error_line(run_file(folder, yaml.safe_dump({**GOOD, key: value})))
    assert message in line and value.split(":")[0] in line
    assert not (folder / "out").exists()


@pytest.mark.parametrize("budget_line, message", [
    ('time_budget_s: "10"', "`time_budget_s` must be a finite number > 0 (or None), got time_budget_s='10' (a string"),
    ('time_budget_s: "1e3"', "got time_budget_s='1e3' (a string: write numbers without quotes)"),
    ("max_trials: true", "`max_trials` must be an integer >= 1 (or None), got max_trials=True (a bool"),
    ('max_steps: "3"', "`max_steps` must be an integer >= 1, got max_steps='3'"),
    ("max_trials: 2.5", "`max_trials` must be an integer >= 1 (or None), got max_trials=2.5"),
    ("time_budget_s: .inf", "`time_budget_s` must be a finite number > 0 (or None), got time_budget_s=inf"),
])
def test_budget_numbers_must_be_numbers(folder: Path, budget_line: str, message: str) -> None:
    text = yaml.safe_dump({**GOOD, "budget": {}}).replace("budget: {}", "budget:\n  " + budget_line)
    assert message in one_error_line(run_file(folder, text))


def test_an_exponent_without_a_dot_is_a_number_in_a_file_as_in_a_constraint(tmp_path: Path) -> None:
    path = tmp_path / "e.yaml"
    path.write_text(yaml.safe_dump({**GOOD, "constraints": ["score <= 1e3"]}).replace(
        "budget:", "budget:\n  time_budget_s: 1e3\n  step_timeout_s: 2E+1\n", 1), encoding="utf-8")
    spec = read_experiment(path)
    assert (spec.time_budget_s, spec.step_timeout_s, parse_constraints(spec.constraints)[0].threshold) == (
        1000.0, 20.0, 1000.0)


@pytest.mark.parametrize("change, message", [
    ({"seed": True}, "`seed` must be an integer >= 0, got seed=True"),
    ({"max_failures": True}, "`max_failures` must be an integer >= 0, got max_failures=True"),
    ({"resources": {"concurrency": True}}, "`concurrency` must be an integer >= 1 (or None), got concurrency=True"),
    ({"executor": "ray", "resources": {"workers": True}}, "`workers` must be an integer >= 1, got workers=True"),
    ({"executor": "ray", "resources": {"cpus_per_trial": "1"}}, "`cpus_per_trial` must be a finite number > 0"),
    ({"executor": "gpu"}, "`executor` must be one of ['ray', 'local', 'processes', 'simulated'], got executor='gpu'"),
    ({"name": "../../x"}, "`name` must be a non-empty folder name without '/'"),
    ({"name": "a/b"}, "got name='a/b'"),
    ({"name": ""}, "got name=''"),
    ({"name": 7}, "got name=7"),
    ({"controller": {"name": "evolution", "populaton_size": 4}},
     "unknown option(s) ['populaton_size'] for controller 'evolution'; "
     "allowed: ['population_size', 'sample_size', 'inherit_weights']"),
    ({"controller": {"name": "evolution", "seed": 3}}, "controller options ['seed'] belong to the experiment itself"),
    ({"controller": "evolve"}, f"`controller` must be one of {sorted(CONTROLLERS)}, got controller='evolve'"),
    ({"controller": {"name": "evolution", "population_size": True}}, "`population_size` must be an integer >= 1"),
    ({"controller": {"name": "pbt", "quantile_fraction": "0.25"}}, "`quantile_fraction` must be a finite number > 0"),
    ({"metric": ""}, "`metric` must be a non-empty string"),
    ({"storage": 5}, "`storage` must be a folder path or a URI (a string), got storage=5"),
    ({1: "x"}, "unknown key(s) [1]; allowed: ['name', 'trainer'"),
])
def test_every_field_refuses_a_wrong_type_naming_key_value_and_what_is_allowed(folder: Path, change: dict,
                                                                                message: str) -> None:
    line = one_error_line(run_file(folder, yaml.safe_dump({**GOOD, **change})))
    assert message in line
    assert not (folder / "out").exists() and not (folder.parent / "x").exists()


def test_debug_shows_the_traceback_and_usage_mistakes_are_one_line(folder: Path) -> None:
    (folder / "experiment.yaml").write_text(yaml.safe_dump({**GOOD, "seed": True}))
    debug = nasplat_cli(folder, "run", "experiment.yaml", "--debug")
    assert debug.returncode == 2 and debug.stderr.startswith("Traceback") and "ValueError: " in debug.stderr
    usage = nasplat_cli(folder, "run")
    assert usage.returncode == 2 and usage.stderr.splitlines() == [
        "nasplat run: error: the following arguments are required: experiment (see nasplat run --help)"]
    missing = nasplat_cli(folder, "status", "nowhere")
    assert missing.returncode == 2 and len(missing.stderr.splitlines()) == 1
    assert missing.stderr.startswith("nasplat status: error: ") and "nowhere" in missing.stderr


# -- the helpers themselves (what nasplat.run calls for the Python API) ------------------------------------------
def test_helpers_refuse_bools_and_strings_and_accept_numpy_numbers() -> None:
    import numpy as np

    assert check_int("seed", np.int64(3), minimum=0) == 3 and check_real("lr", np.float32(0.5)) == 0.5
    with pytest.raises(ValueError, match=r"`seed` must be an integer >= 0, got seed=False \(a bool"):
        check_int("seed", False, minimum=0)
    with pytest.raises(ValueError, match=r"got x='nan'"):
        check_real("x", "nan")
    with pytest.raises(ValueError, match=r"`x` must be a finite number, got x=nan"):
        check_real("x", float("nan"))
    for bad in ("..", ".", "a\\b", " x", "a\0b"):
        with pytest.raises(ValueError, match="`name` must be a non-empty folder name"):
            check_name(bad)
    assert check_name("exp-1.v2") == "exp-1.v2"
    with pytest.raises(ValueError, match="a budget needs"):
        check_run_options(metric="score")
    with pytest.raises(ValueError, match=r"`concurrency` must be an integer >= 1 \(or None\), got concurrency=0"):
        check_run_options(metric="score", max_trials=1, concurrency=0)


def test_check_trainer_and_controller_options_name_what_is_allowed() -> None:
    from nasplat import Trainer

    class Fine(Trainer):
        def setup(self, config, ctx): ...
        def step(self): return {}

    assert check_trainer(Fine) is Fine
    with pytest.raises(TypeError, match=r"got an instance of test_validation.*Fine"):
        check_trainer(Fine())
    with pytest.raises(TypeError, match=r"got the class builtins.int"):
        check_trainer(int)
    assert check_controller_options(RegularizedEvolution, {"sample_size": 2}) == {"sample_size": 2}
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['size'\] for controller 'evolution'"):
        check_controller_options(RegularizedEvolution, {"size": 2})


# -- the registries: one shape, listed once, read by YAML, Python and the command line ---------------------------
def test_every_plugin_kind_is_one_registry_and_the_run_help_lists_every_name(capsys) -> None:
    from nasplat.cli import main
    from nasplat.core.registry import Registry
    from nasplat.distributed.context import BACKENDS
    from nasplat.executors import EXECUTORS
    from nasplat.executors.local import LocalExecutor
    from nasplat.integrations import CALLBACKS
    from nasplat.schedulers import SCHEDULERS, Hyperband

    registries = {"controller": CONTROLLERS, "scheduler": SCHEDULERS, "executor": EXECUTORS, "callback": CALLBACKS,
                  "backend": BACKENDS}
    assert all(isinstance(r, Registry) and r.kind == kind for kind, r in registries.items())
    assert list(EXECUTORS) == ["ray", "local", "processes", "simulated"]
    assert EXECUTORS["local"] is LocalExecutor and SCHEDULERS.lookup("hyperband") is Hyperband
    assert CONTROLLERS.name_of(RegularizedEvolution) == "evolution"
    with pytest.raises(SystemExit) as done:
        main(["run", "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    for key, kind in (("controller", "controller"), ("scheduler", "scheduler"), ("executor", "executor"),
                      ("callbacks", "callback")):
        assert f"{kind}s ({key}:): {', '.join(registries[kind])}" in text
    assert "{" + ",".join(EXECUTORS) + "}" in text  # --executor's choices


def test_naming_an_executor_imports_only_that_one() -> None:
    code = ("import sys, nasplat\nfrom nasplat.executors import EXECUTORS\nassert 'ray' in EXECUTORS\n"
            "EXECUTORS.lookup('local')\nloaded = [m for m in ('nasplat.executors.ray.executor', 'ray') if m in "
            "sys.modules]\nassert not loaded, loaded\nassert EXECUTORS['ray'].__name__ == 'RayExecutor'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_one_default_executor_for_yaml_and_python(folder: Path) -> None:
    import inspect
    import json

    import nasplat
    from nasplat.executors import DEFAULT_EXECUTOR
    from nasplat.experiment.file import experiment_kwargs

    file = {k: v for k, v in GOOD.items() if k not in ("executor", "resources")}
    assert DEFAULT_EXECUTOR == "local" == inspect.signature(nasplat.run).parameters["executor"].default
    assert experiment_kwargs(file)["executor"] == DEFAULT_EXECUTOR
    assert run_file(folder, yaml.safe_dump(file)).returncode == 0
    assert json.loads((folder / "out" / "ok" / "meta.json").read_text())["executor"] == "local"
    line = one_error_line(run_file(folder, yaml.safe_dump({**file, "name": "r", "resources": {"workers": 2}})))
    assert line.endswith("resources ['workers'] need executor 'ray', got executor='local' (the default: add "
                         "`executor: ray`)")


def test_the_ray_dashboard_follows_what_the_executor_declares() -> None:
    from nasplat.executors.simulated import SimulatedExecutor
    from nasplat.experiment.run import _build, _engine
    from nasplat.integrations.ray_dashboard import RayMetrics

    class OnRay(SimulatedExecutor):
        ray_dashboard = True

    spec = dict(trainer="trainers.pbt_toy:PBTToy", space="trainers.pbt_toy:space", metric="Q", max_trials=1)
    for executor, expected in ((OnRay(), True), ("simulated", False), ("local", False)):
        built = _build({**spec, "executor": executor})
        gauges = [x for x in _engine(built, None, progress=False).listeners if isinstance(x, RayMetrics)]
        assert built.ray_dashboard is expected and len(gauges) == int(expected), executor


def test_a_folder_stored_before_constraints_and_schedulers_still_resumes(tmp_path: Path) -> None:
    import json

    import nasplat

    nasplat.run(trainer="trainers.pbt_toy:PBTToy", space="trainers.pbt_toy:space", metric="Q", max_trials=4,
                max_steps=2, storage=tmp_path, name="old")
    spec_file = tmp_path / "old" / "experiment.json"
    stored = json.loads(spec_file.read_text())
    assert set(stored) >= {"constraints", "scheduler", "executor"} and stored["name"] == "old"
    spec_file.write_text(json.dumps({k: v for k, v in stored.items() if k not in ("constraints", "scheduler")}))
    assert nasplat.resume(tmp_path / "old").counts() == {"completed": 4}
