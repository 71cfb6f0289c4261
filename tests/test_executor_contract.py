"""The executor contract (`nasplat.executors.base.Executor`), the same tests on `local`, `processes`, `simulated`
and `ray`, with a small real torch trainer: launch, step, exploit, checkpoint (durable, complete, reported once),
restore from a checkpoint, failure."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from nasplat.executors.base import Executor, StepEvent
from nasplat.executors.local import LocalExecutor
from nasplat.executors.processes import ProcessExecutor
from nasplat.executors.simulated import SimulatedExecutor
from nasplat.storage import Storage
from nasplat.storage.checkpoints import MANIFEST_FILE, Checkpoint, list_checkpoints, load_checkpoint, read_manifest
from nasplat.trainer import Trainer

KINDS = ["local", "processes", "simulated", "ray"]


class Regression(Trainer):
    """Full-batch SGD with momentum on a fixed linear problem: deterministic, so a restored trial must reproduce an
    uninterrupted one exactly. `fail_at` makes that step raise."""

    def setup(self, config: dict[str, Any], ctx: Any) -> None:
        torch.manual_seed(ctx.seed)
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(64, 4, generator=generator)
        self.y = self.x @ torch.tensor([1.0, -2.0, 3.0, 0.5])
        self.model = torch.nn.Linear(4, 1)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=config["lr"], momentum=0.9)
        self.t = 0

    def step(self) -> dict[str, Any]:
        if self.config.get("fail_at") == self.t + 1:
            raise ValueError(f"synthetic failure at step {self.t + 1}")
        loss = torch.nn.functional.mse_loss(self.model(self.x).squeeze(1), self.y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.t += 1
        return {"loss": loss.item(), "t": self.t, "lr": self.opt.param_groups[0]["lr"], "time_cost": 1.0}

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "opt": self.opt.state_dict(), "t": self.t}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["opt"])
        self.t = state["t"]

    def update_config(self, config: dict[str, Any]) -> None:
        for group in self.opt.param_groups:
            group["lr"] = config["lr"]


@pytest.fixture(params=KINDS)
def make(request: pytest.FixtureRequest, tmp_path: Any) -> Callable[..., Executor]:
    """Opens an executor of the parametrised kind (checkpoints in `tmp_path/checkpoints` unless `storage=False`);
    closes them all at the end."""
    opened: list[Executor] = []

    def factory(*, storage: bool = True) -> Executor:
        if request.param == "ray":
            request.getfixturevalue("ray_session")
            from nasplat.executors.ray.executor import RayExecutor
            executor: Executor = RayExecutor(concurrency=2, cpus_per_trial=1)
        else:
            executor = {"local": LocalExecutor, "processes": ProcessExecutor, "simulated": SimulatedExecutor}[
                request.param](2)
        executor.open(Regression, f"{request.node.name}-{len(opened)}",
                      Storage(tmp_path / "checkpoints") if storage else None)
        opened.append(executor)
        return executor

    factory.kind = request.param  # type: ignore[attr-defined]
    yield factory
    for executor in opened:
        executor.close()


def next_step(executor: Executor, trial_id: int, events: list[StepEvent]) -> StepEvent:
    """The trial's next step event not yet taken: from `events` (every event seen), else by waiting."""
    taken = getattr(executor, "taken_by_test", set())
    executor.taken_by_test = taken  # type: ignore[attr-defined]
    while True:
        for index, event in enumerate(events):
            if (index not in taken and event.trial_id == trial_id
                    and (event.metrics is not None or event.error is not None)):
                taken.add(index)
                return event
        events.extend(executor.wait())


def saved(events: list[StepEvent]) -> list[Checkpoint]:
    return [checkpoint for event in events for checkpoint in event.saved]


def run_alone(make: Callable[..., Executor], steps: int, lr: float = 0.05) -> list[float]:
    executor, events = make(storage=False), []
    executor.launch(0, {"lr": lr}, seed=7)
    losses = [next_step(executor, 0, events).metrics["loss"]]
    for _ in range(steps - 1):
        executor.step(0)
        losses.append(next_step(executor, 0, events).metrics["loss"])
    executor.stop(0)
    return losses


def test_launch_and_step_run_trials_side_by_side(make):
    executor, events = make(), []
    for trial_id, lr in ((0, 0.01), (1, 0.05)):
        executor.launch(trial_id, {"lr": lr}, seed=trial_id)
    last = {}
    for _ in range(3):
        for trial_id in (0, 1):
            event = next_step(executor, trial_id, events)
            last[trial_id] = event.metrics
            executor.step(trial_id)
    for trial_id in (0, 1):
        last[trial_id] = next_step(executor, trial_id, events).metrics
        executor.stop(trial_id)
    assert {t: m["t"] for t, m in last.items()} == {0: 4, 1: 4}
    assert last[0]["lr"] == 0.01 and last[1]["lr"] == 0.05
    assert last[1]["loss"] < last[0]["loss"]  # the larger lr has come further on this problem
    assert all(e.end >= e.start for e in events) and saved(events) == []


def test_exploit_loads_the_donor_and_puts_the_new_config_in_effect(make):
    executor, events = make(), []
    executor.launch(0, {"lr": 0.001}, seed=0)
    executor.launch(1, {"lr": 0.05}, seed=1)
    donor = {}
    for _ in range(3):
        for trial_id in (0, 1):
            donor[trial_id] = next_step(executor, trial_id, events).metrics
            executor.step(trial_id, snapshot=trial_id == 1)
    donor[0] = next_step(executor, 0, events).metrics
    donor[1] = next_step(executor, 1, events).metrics  # trial 1's snapshot was taken after its step 3
    executor.step(1)
    executor.exploit(0, 1, {"lr": 0.02})
    after = next_step(executor, 0, events).metrics
    assert after["t"] == 4  # the snapshot of the donor after its step 3, stepped once
    assert after["lr"] == 0.02
    assert after["loss"] < donor[0]["loss"] / 4  # far better than its own lr=0.001 weights
    next_step(executor, 1, events)
    for trial_id in (0, 1):
        executor.stop(trial_id)


def test_saves_are_durable_complete_and_reported_once(make, tmp_path):
    executor, events = make(), []
    executor.launch(0, {"lr": 0.05}, seed=0)
    for step in range(1, 4):
        metrics = next_step(executor, 0, events).metrics
        assert metrics["t"] == step
        executor.step(0, save=step if step != 2 else None)  # the state after step 1 and after step 3
    assert next_step(executor, 0, events).metrics["t"] == 4
    executor.stop(0, save=4)  # the final state, written after the last step: reported with no step in flight
    while sorted(c.step for c in saved(events)) != [1, 3, 4]:
        events.extend(executor.wait())
    checkpoints = [c for c in saved(events) if c.uri is not None]
    # where writes fall behind (a loaded machine), a queued one gives way to the trial's next: never the last one
    assert all(c.error.startswith("superseded") for c in saved(events) if c.uri is None)
    assert all(c.trial_id == 0 and c.error is None for c in checkpoints) and checkpoints[-1].step == 4
    storage = Storage(tmp_path / "checkpoints")
    assert [c.step for c in list_checkpoints(storage, 0)] == sorted(c.step for c in checkpoints)
    for checkpoint in checkpoints:
        assert Storage(checkpoint.uri).exists(MANIFEST_FILE)
        assert read_manifest(checkpoint.uri)["config"] == {"lr": 0.05}
        assert load_checkpoint(checkpoint.uri)["t"] == checkpoint.step
    with pytest.raises(RuntimeError, match="no step running"):  # nothing is left to report
        executor.wait()


def test_restore_from_a_checkpoint_continues_exactly(make):
    uninterrupted = run_alone(make, 6)
    executor, events = make(), []
    executor.launch(0, {"lr": 0.05}, seed=7)
    for _ in range(3):
        next_step(executor, 0, events)
        executor.step(0)
    next_step(executor, 0, events)
    executor.stop(0, save=4)
    while not saved(events):
        events.extend(executor.wait())
    [checkpoint] = saved(events)
    executor.launch(0, {"lr": 0.05}, seed=7, state=checkpoint)  # the retried trial, from its durable state
    resumed = [next_step(executor, 0, events).metrics]
    executor.step(0)
    resumed.append(next_step(executor, 0, events).metrics)
    executor.stop(0)
    assert [m["t"] for m in resumed] == [5, 6]
    assert [m["loss"] for m in resumed] == uninterrupted[4:]


def test_exploit_from_an_ended_donor_loads_its_checkpoint(make):
    executor, events = make(), []
    executor.launch(1, {"lr": 0.05}, seed=1)
    next_step(executor, 1, events)
    executor.step(1)
    next_step(executor, 1, events)
    executor.stop(1, save=2)
    while not saved(events):
        events.extend(executor.wait())
    [fallback] = saved(events)
    executor.launch(0, {"lr": 0.001}, seed=0)
    next_step(executor, 0, events)
    executor.exploit(0, 1, {"lr": 0.03}, fallback=fallback)
    after = next_step(executor, 0, events).metrics
    executor.stop(0)
    assert after["t"] == 3 and after["lr"] == 0.03


def test_a_failing_step_is_an_error_event_and_the_executor_goes_on(make):
    executor, events = make(), []
    executor.launch(0, {"lr": 0.05, "fail_at": 3}, seed=0)
    next_step(executor, 0, events)
    executor.step(0, save=1)
    next_step(executor, 0, events)
    executor.step(0)
    failed = next_step(executor, 0, events)
    assert failed.metrics is None and "synthetic failure at step 3" in failed.error
    executor.stop(0)
    executor.launch(1, {"lr": 0.05}, seed=0)
    assert next_step(executor, 1, events).metrics["t"] == 1
    executor.stop(1)
    while [c.step for c in saved(events)] != [1]:  # the save before the failure is still reported, once
        events.extend(executor.wait())
    assert saved(events)[0].uri is not None


def test_a_failed_write_is_reported_once_and_the_trial_goes_on(make, tmp_path):
    executor, events = make(), []
    (tmp_path / "checkpoints").mkdir(exist_ok=True)
    (tmp_path / "checkpoints" / "trial-0").write_text("a file where the trial's folder should go")
    executor.launch(0, {"lr": 0.05}, seed=0)
    next_step(executor, 0, events)
    executor.step(0, save=1)
    assert next_step(executor, 0, events).metrics["t"] == 2
    executor.stop(0)
    while not saved(events):
        events.extend(executor.wait())
    [failed] = saved(events)
    assert (failed.trial_id, failed.step, failed.uri) == (0, 1, None) and "trial-0" in failed.error
