"""PBT's exploit carries the donor's training progress: a member that copies a donor's earlier state trains on until
its own lineage has trained `max_steps` steps, on the in-process and the forked-worker executors."""

from __future__ import annotations

from typing import Any

import pytest

import nasplat
from nasplat import Float, Trainer

STEPS, INTERVAL = 8, 2


class Lineage(Trainer):
    """`t` counts the steps trained along the member's lineage (a donor's count comes with its state)."""

    def setup(self, config: dict[str, Any], ctx: Any) -> None:
        self.x, self.t = config["x"], 0

    def step(self) -> dict[str, Any]:
        self.t += 1
        return {"score": self.x + 0.01 * self.t, "t": self.t}

    def state_dict(self) -> dict[str, Any]:
        return {"t": self.t}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.t = state["t"]

    def update_config(self, config: dict[str, Any]) -> None:
        self.x = config["x"]


def _run(executor: str) -> list[dict[str, Any]]:
    controller = nasplat.PopulationBasedTraining(
        {"x": Float(0.0, 1.0)}, metric="score", population_size=4, perturbation_interval=INTERVAL,
        initial_configs=[{"x": x} for x in (0.0, 0.3, 0.6, 0.9)], seed=0)
    result = nasplat.run(trainer=Lineage, controller=controller, executor=executor, concurrency=4, max_trials=4,
                         max_steps=STEPS, seed=0)
    assert result.counts() == {"completed": 4}
    return result.rows


@pytest.mark.parametrize("executor", ["local", "processes"])
def test_an_exploit_copies_the_ranked_snapshot_and_trains_on_to_max_steps(executor: str) -> None:
    rows = _run(executor)
    for trial_id in range(4):
        steps = [r["step"] for r in rows if r["trial_id"] == trial_id]
        assert steps == list(range(1, len(steps) + 1))  # one row a step, none twice
        assert [r["t"] for r in rows if r["trial_id"] == trial_id][-1] == STEPS  # its lineage trained STEPS steps
    exploits = [(index, r) for index, r in enumerate(rows) if r["donor_id"] is not None]
    assert exploits
    for index, row in exploits:
        # The donor's state is its snapshot at its latest perturbation step recorded before the exploit, where it
        # went on (it was ranked there): the receiver's next step trains on from that state.
        ranked = [r for r in rows[:index] if r["trial_id"] == row["donor_id"] and r["step"] % INTERVAL == 0
                  and r["donor_id"] is None]
        after = next(r for r in rows[index + 1:] if r["trial_id"] == row["trial_id"])
        assert after["t"] == ranked[-1]["t"] + 1


def test_a_member_given_a_donors_earlier_state_gets_those_steps_back() -> None:
    """In-process, members step in turn: member 0 (the worst) reaches step 4 while the others have reported step 3,
    so the state it copies is the best member's at step 2, and it trains two steps more than the others."""
    rows = _run("local")
    first = next(r for r in rows if r["donor_id"] is not None)
    assert (first["trial_id"], first["step"], first["donor_id"]) == (0, 4, 3)
    assert max(r["step"] for r in rows if r["trial_id"] == 0) == STEPS + 2
