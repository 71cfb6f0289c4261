"""A step that hangs no longer stalls a run: `step_timeout_s` on the `ray` executor kills the hung trial's gang and
retries it like any failure, and so does a `processes` executor built with its own `step_timeout_s`; `time_budget_s`
bounds the wait for running steps (the trials left resumable); executors that cannot stop a running step refuse
`step_timeout_s` in one line, and so do a bad value and a ready executor built with another timeout."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

import nasplat
from nasplat import Choice, Int, Trainer
from nasplat.cli import main
from nasplat.controllers.random_search import RandomSearch
from nasplat.engine.loop import Engine
from nasplat.engine.records import MIN_GRACE_S, Budget
from nasplat.executors.processes import ProcessExecutor
from nasplat.experiment.spec import ExperimentSpec


class HangsOnce(Trainer):
    """Trial 0's first step hangs (forever) the first time it runs: it creates the file `config["flag"]`, which a
    later attempt sees, then waits on an event nobody sets. Every other step reports at once."""

    def setup(self, config, ctx):
        self.x, self.flag, self.trial_id = config["x"], Path(config["flag"]), ctx.trial_id

    def step(self):
        if self.trial_id == 0 and not self.flag.exists():
            self.flag.touch()
            threading.Event().wait()
        return {"score": float(self.x)}


def space(tmp_path: Path) -> dict:
    return {"x": Int(0, 100), "flag": Choice([str(tmp_path / "hung")])}


def test_a_hung_step_on_ray_times_out_and_is_retried_while_the_other_trials_complete(ray_session, tmp_path):
    begin = time.monotonic()
    result = nasplat.run(trainer=HangsOnce, space=space(tmp_path), metric="score", executor="ray", concurrency=2,
                         max_trials=4, max_steps=2, max_failures=1, step_timeout_s=2, seed=0)
    assert time.monotonic() - begin < 60
    assert (tmp_path / "hung").exists()  # trial 0's first attempt did hang
    retried = [r for r in result.rows if r["status"] == "retried"]
    assert [r["trial_id"] for r in retried] == [0]
    assert "step timed out after 2 s (step_timeout_s=2)" in retried[0]["error"]
    assert result.counts() == {"completed": 4}  # trial 0's second attempt on a new gang, the others untouched
    assert [r["attempt"] for r in result.rows if r["trial_id"] == 0 and r["status"] != "retried"] == [1, 1]


def test_time_budget_bounds_the_wait_for_a_hung_step_and_leaves_its_trial_resumable(ray_session, tmp_path, capsys):
    begin = time.monotonic()
    result = nasplat.run(trainer=HangsOnce, space=space(tmp_path), metric="score", executor="ray", concurrency=2,
                         max_trials=3, max_steps=2, time_budget_s=3, seed=0, storage=tmp_path / "out", name="tb")
    elapsed = time.monotonic() - begin
    assert elapsed < 60 and Budget(time_s=3).grace_s == MIN_GRACE_S
    assert result.final_status().get(0, "running") == "running"  # left as it was (no row): resume continues it
    assert "left resumable" in capsys.readouterr().err
    resumed = nasplat.resume(tmp_path / "out" / "tb")
    assert resumed.final_status()[0] == "completed"
    assert [r["step"] for r in resumed.rows if r["trial_id"] == 0] == [1, 2]


@pytest.mark.parametrize("executor", ["local", "simulated"])
def test_step_timeout_on_an_executor_that_cannot_stop_a_step_is_one_line(tmp_path, executor):
    with pytest.raises(ValueError, match=rf"`step_timeout_s` needs an executor that can stop a running step, one "
                                         rf"of \[.*'ray'.*\]; executor '{executor}' cannot, got step_timeout_s=5"):
        nasplat.run(trainer=HangsOnce, space=space(tmp_path), metric="score", executor=executor, max_trials=2,
                    step_timeout_s=5, storage=tmp_path / "out")
    assert not (tmp_path / "out").exists()  # refused before the folder was created


def test_a_processes_executor_built_with_a_step_timeout_kills_a_hung_step_in_a_run_given_none(tmp_path):
    executor = ProcessExecutor(2, processes=2, step_timeout_s=2)
    begin = time.monotonic()
    result = nasplat.run(trainer=HangsOnce, space=space(tmp_path), metric="score", executor=executor,
                         max_trials=4, max_steps=2, max_failures=1, seed=0)
    assert time.monotonic() - begin < 60
    assert (tmp_path / "hung").exists()  # trial 0's first attempt did hang
    retried = [r for r in result.rows if r["status"] == "retried"]
    assert [r["trial_id"] for r in retried] == [0]
    assert retried[0]["error"].startswith("step timed out after 2 s (step_timeout_s=2): trial 0's step")
    assert result.counts() == {"completed": 4}
    assert [r["attempt"] for r in result.rows if r["trial_id"] == 0 and r["status"] != "retried"] == [1, 1]


def test_a_ready_executor_built_with_another_step_timeout_than_the_run_is_refused_in_one_line(tmp_path):
    for built, line in [
        (ProcessExecutor(2), ("got step_timeout_s=5 for a ProcessExecutor built with step_timeout_s=None; pass it "
                             "to the executor's constructor, e.g. ProcessExecutor(step_timeout_s=5)")),
        (ProcessExecutor(2, step_timeout_s=3), ("got step_timeout_s=5 for a ProcessExecutor built with "
                                               "step_timeout_s=3.0; pass it to the executor's constructor, e.g. "
                                               "ProcessExecutor(step_timeout_s=5)")),
    ]:
        with pytest.raises(ValueError) as refused:
            nasplat.run(trainer=HangsOnce, space=space(tmp_path), metric="score", executor=built, max_trials=2,
                        step_timeout_s=5, storage=tmp_path / "out")
        assert str(refused.value) == f"`step_timeout_s` of the run differs from the ready executor's own: {line}"
        assert not (tmp_path / "out").exists()  # refused before the folder was created
    with pytest.raises(ValueError, match=r"^`step_timeout_s` must be a finite number > 0 \(or None\), got "
                                         r"step_timeout_s=0$"):
        ProcessExecutor(2, step_timeout_s=0)


def test_the_engine_reads_the_step_timeout_and_its_grace_from_the_executor_and_never_sets_it():
    controller = RandomSearch({"x": Int(0, 3)}, metric="score", seed=0)
    executor = ProcessExecutor(2, step_timeout_s=3)
    engine = Engine(controller=controller, executor=executor, trainer=HangsOnce, budget=Budget(time_s=20))
    assert (engine.budget.step_timeout_s, engine.budget.grace_s, executor.step_timeout_s) == (3, 3, 3)
    same = Engine(controller=controller, executor=executor, trainer=HangsOnce,
                  budget=Budget(time_s=20, step_timeout_s=3))
    assert same.budget.grace_s == 3
    with pytest.raises(ValueError, match=r"got step_timeout_s=4 for a ProcessExecutor built with step_timeout_s=3"):
        Engine(controller=controller, executor=executor, trainer=HangsOnce, budget=Budget(time_s=20, step_timeout_s=4))
    assert executor.step_timeout_s == 3 and ProcessExecutor(2).step_timeout_s is None


GOOD = {"name": "t", "trainer": "test_timeouts:HangsOnce", "space": {"x": Int(0, 3)}, "metric": "score",
        "controller": "random", "executor": "local"}


@pytest.mark.parametrize("value, message", [
    (0, "`step_timeout_s` must be a finite number > 0 (or None), got step_timeout_s=0"),
    ("5", "`step_timeout_s` must be a finite number > 0 (or None), got step_timeout_s='5'"),
])
def test_a_bad_step_timeout_in_yaml_is_refused_in_one_line(tmp_path, capsys, value, message):
    import yaml

    text = yaml.safe_dump({**GOOD, "space": "search_spaces.nb201:space", "budget": {"max_trials": 2,
                                                                                   "step_timeout_s": value}})
    (tmp_path / "experiment.yaml").write_text(text)
    assert main(["run", str(tmp_path / "experiment.yaml"), "--quiet", "--storage", str(tmp_path / "out")]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and message in lines[0] and lines[0].startswith("nasplat run: error: ")
    assert not (tmp_path / "out").exists()


def test_step_timeout_is_kept_with_the_spec_and_old_specs_load_without_it():
    spec = ExperimentSpec(trainer="trainers.nb201_table:NB201Table", step_timeout_s=30.0, max_trials=1)
    assert ExperimentSpec.from_dict(spec.to_dict()).step_timeout_s == 30.0
    stored = {k: v for k, v in spec.to_dict().items() if k != "step_timeout_s"}  # an experiment.json of before
    assert ExperimentSpec.from_dict(stored).check().step_timeout_s is None


def test_the_grace_after_the_time_budget_is_the_step_timeout_else_a_tenth_of_the_budget_at_least_10_s():
    assert Budget(time_s=1000).grace_s == 100
    assert Budget(time_s=20).grace_s == MIN_GRACE_S == 10
    assert Budget(time_s=20, step_timeout_s=3).grace_s == 3
    assert Budget(max_trials=2, step_timeout_s=3).grace_s is None
