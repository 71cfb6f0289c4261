"""The simulated executor keeps time: a step's result and its effect on the trial's state exist only from the moment
the simulated clock reaches the step's end."""

from __future__ import annotations

import pytest

import nasplat
from nasplat import Trainer
from nasplat.controllers import CONTINUE, Controller, Exploit
from nasplat.executors.simulated import SimulatedExecutor


class Counting(Trainer):
    """Counts its steps in its state; a step costs `cost` simulated seconds."""

    def setup(self, config, ctx):
        self.t = 0

    def step(self):
        self.t += 1
        return {"score": float(self.t), "t": self.t, "time_cost": self.config["cost"]}

    def state_dict(self):
        return {"t": self.t}

    def load_state_dict(self, state):
        self.t = state["t"]


class FastCopiesSlow(Controller):
    """Trial 0 (1 s steps) copies trial 1 (10 s steps) after its steps 2 and 12."""

    def ask(self):
        return self._propose({"cost": 1.0 if self.next_trial_id == 0 else 10.0}) if self.next_trial_id < 2 else None

    def on_result(self, trial_id, result):
        if trial_id == 0 and result.step in (2, 12):
            return Exploit(1, {"cost": 1.0})
        return CONTINUE


def test_an_exploit_copies_the_donors_state_as_of_its_last_finished_step():
    executor = SimulatedExecutor(2)
    result = nasplat.run(trainer=Counting, controller=FastCopiesSlow({}, metric="score"), executor=executor,
                         max_trials=2, max_steps=14)
    fast = {r["step"]: (r["t"], r["end"]) for r in result.rows if r["trial_id"] == 0}
    # at t=2 the donor's first step (0-10 s) has not finished: its state is the initial one, t=0
    assert fast[3] == (1, 3.0)
    # at t=12 the donor finished step 1 (at 10 s) and runs step 2 (10-20 s): its state has t=1
    assert fast[13] == (2, 13.0)
    slow = [(r["step"], r["t"], r["end"]) for r in result.rows if r["trial_id"] == 1]
    assert slow[:2] == [(1, 1, 10.0), (2, 2, 20.0)]  # the donor itself went on undisturbed
    assert not executor.settled  # every kept pre-step state was let go once its step ended


def test_a_paused_trial_keeps_the_state_of_its_finished_step():
    executor = SimulatedExecutor(1)
    result = nasplat.run(trainer=Counting, space={"cost": 2.0}, metric="score", executor=executor, max_trials=4,
                         max_steps=3, scheduler={"name": "asha", "type": "promote"})
    promoted = [r for r in result.rows if r["step"] == 2]
    assert promoted and all(r["t"] == 2 for r in promoted)
    assert [r["end"] for r in result.rows] == [2.0 * (i + 1) for i in range(len(result.rows))]  # one worker, no gaps


class Timeless(Trainer):
    """Reports a score but no `time_cost`; counts the trials it set up."""

    setups: list = []

    def setup(self, config, ctx):
        Timeless.setups.append(ctx.trial_id)

    def step(self):
        return {"score": 1.0}


def test_a_trainer_that_reports_no_time_cost_is_refused_at_its_first_step_before_more_trials_start(tmp_path):
    # before: each trial failed in turn, and the run ended only after max_failed_trials + 1 = 11 of them (issue 31)
    Timeless.setups.clear()
    with pytest.raises(ValueError) as info:
        nasplat.run(trainer=Timeless, space={"x": 1}, metric="score", executor="simulated", concurrency=4,
                    max_trials=40, storage=tmp_path, name="exp")
    line = str(info.value)
    assert line.startswith("the simulated executor needs every step to report 'time_cost'") and "\n" not in line
    assert "trial 0's step reported ['score']" in line
    assert Timeless.setups == [0]
    assert nasplat.ExperimentResult.load(tmp_path / "exp").rows == []
