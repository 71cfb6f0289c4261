"""The `processes` executor in whole runs: steps side by side in forked workers, a killed worker, metrics that
cannot leave a worker, bad options, ASHA's pause and promotion. (The executor contract suite runs on it too:
tests/test_executor_contract.py.)"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from typing import Any

import pytest

import nasplat
from nasplat import Float, Trainer
from nasplat.engine.result import ExperimentResult

MEET = multiprocessing.get_context("fork").Barrier(2, timeout=60)  # inherited by the workers the executor forks


class Meeting(Trainer):
    """Each step waits at a barrier of two: it passes only if a step of another trial runs at the same time."""

    def setup(self, config: dict[str, Any], ctx: Any) -> None:
        self.x, self.t = config["x"], 0

    def step(self) -> dict[str, Any]:
        MEET.wait()
        self.t += 1
        return {"score": -(self.x - 1.0) ** 2 + self.t}


class Counting(Trainer):
    """Counts its steps; its state is that count."""

    def setup(self, config: dict[str, Any], ctx: Any) -> None:
        self.x, self.t = config["x"], 0

    def step(self) -> dict[str, Any]:
        self.t += 1
        return {"score": self.x + self.t, "t": self.t}

    def state_dict(self) -> dict[str, Any]:
        return {"t": self.t}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.t = state["t"]


def test_two_workers_step_side_by_side_in_their_own_processes():
    result = nasplat.run(trainer=Meeting, space={"x": Float(0.0, 2.0)}, metric="score", executor="processes",
                         concurrency=2, executor_options={"processes": 2}, max_trials=4, max_steps=2, seed=0)
    assert result.counts() == {"completed": 4}  # every step met one of another trial: none waited out the barrier
    pids = {row["pid"] for row in result.rows}
    assert len(pids) == 2 and os.getpid() not in pids


IN_STEP, NEVER = multiprocessing.get_context("fork").Event(), multiprocessing.get_context("fork").Event()
STEPPING_PID = multiprocessing.get_context("fork").Value("i", 0)


class HeldSecondStep(Counting):
    """`Counting`, except that the first trial to start its second step says so (its worker's pid in
    `STEPPING_PID`, then `IN_STEP`) and waits there (up to 30 s): its worker is killed mid-step."""

    def step(self) -> dict[str, Any]:
        if self.t == 1 and not IN_STEP.is_set():
            with STEPPING_PID.get_lock():
                first = STEPPING_PID.value == 0
                if first:
                    STEPPING_PID.value = os.getpid()
            if first:
                IN_STEP.set()
                NEVER.wait(30)  # the kill comes while it waits here
        return super().step()


class KillHeldWorker(threading.Thread):
    """A thread of the test that SIGKILLs the worker process holding a trial's second step, once it is held."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.killed: int | None = None  # the pid

    def run(self) -> None:
        if IN_STEP.wait(timeout=60):
            self.killed = STEPPING_PID.value
            os.kill(self.killed, signal.SIGKILL)


@pytest.mark.parametrize("max_failures", [0, 1])
def test_a_killed_worker_fails_its_trial_and_the_run_goes_on(tmp_path, max_failures):
    IN_STEP.clear()
    STEPPING_PID.value = 0
    killer = KillHeldWorker()
    killer.start()
    result = nasplat.run(trainer=HeldSecondStep, space={"x": Float(0.0, 2.0)}, metric="score", executor="processes",
                         concurrency=2, max_trials=6, max_steps=3, max_failures=max_failures, seed=0,
                         storage=tmp_path, name=f"kill-{max_failures}", checkpoint={"every": 1})
    killer.join(timeout=60)
    pid = killer.killed
    assert pid is not None
    ended = [r for r in result.rows if r["status"] in ("failed", "retried") and r["error"]]  # failed steps' rows
    assert len(ended) == 1  # the trial whose step the killed worker ran; the other worker's went on untouched
    trial = ended[0]["trial_id"]
    assert f"worker process {pid} died" in ended[0]["error"]
    assert {r["pid"] for r in result.rows if r["trial_id"] == trial and r["attempt"] == 0} <= {pid}
    counts = result.counts()
    if max_failures == 0:
        assert counts == {"completed": 5, "failed": 1}
    else:  # the retry runs on a new worker, from the trial's last durable checkpoint (the killed worker wrote
        # them, so maybe none), and reaches step 3 with a state that agrees with its steps
        assert counts == {"completed": 6}
        retry = [r for r in result.rows if r["trial_id"] == trial and r["attempt"] == 1]
        assert retry[-1]["step"] == 3 and all(r["t"] == r["step"] and r["pid"] != pid for r in retry)
    assert ExperimentResult.load(tmp_path / f"kill-{max_failures}").rows == result.rows  # every row on disk


@pytest.mark.parametrize("options, message", [
    ({"processes": 0}, "`processes` must be an integer >= 1 (worker processes), got processes=0"),
    ({"threads": "2"}, "`threads` must be an integer >= 1 (torch threads per worker), got threads='2'"),
])
def test_bad_options_get_one_clear_line(options, message):
    with pytest.raises(ValueError) as info:
        nasplat.run(trainer=Counting, space={"x": Float(0.0, 2.0)}, metric="score", executor="processes",
                    max_trials=1, executor_options=options)
    assert str(info.value) == message


class Unpicklable(Trainer):
    """Reports a metric that cannot leave the worker process (a function) at step 2 when x > 0.5."""

    def setup(self, config: dict[str, Any], ctx: Any) -> None:
        self.x, self.t = config["x"], 0

    def step(self) -> dict[str, Any]:
        self.t += 1
        return {"score": float(self.t), **({"how": lambda: self.t} if self.t == 2 and self.x > 0.5 else {})}


@pytest.mark.parametrize("executor", ["processes", "local"])
def test_metrics_that_cannot_leave_the_worker_fail_that_trial_only(executor):
    result = nasplat.run(trainer=Unpicklable, space={"x": Float(0.0, 1.0)}, metric="score", executor=executor,
                         concurrency=2, max_trials=8, max_steps=3, seed=0, max_failures=1)
    retried = [r for r in result.rows if r["status"] == "retried" and r["error"]]  # not the steps it went back over
    failed = [r for r in result.rows if r["status"] == "failed"]
    assert failed and {r["trial_id"] for r in retried} == {r["trial_id"] for r in failed}  # retried once, alike
    assert all(r["config"]["x"] > 0.5 and r["step"] == 2 for r in failed + retried)
    assert all("could not be sent from the worker process" in r["error"] for r in failed + retried)
    completed = [r for r in result.rows if r["status"] == "completed"]
    assert len(failed) + len(completed) == 8 and all(r["config"]["x"] <= 0.5 for r in completed)


def test_asha_promote_resumes_paused_trials_from_their_kept_state():
    result = nasplat.run(trainer=Counting, space={"x": Float(0.0, 2.0)}, metric="score", executor="processes",
                         concurrency=2, max_trials=6, max_steps=3, seed=5,
                         scheduler={"name": "asha", "type": "promote"})
    rows = result.rows
    promoted = [r for r in rows if r["step"] == 2]
    assert len([r for r in rows if r["status"] == "paused"]) == 6 and len(promoted) >= 2
    assert all(r["t"] == r["step"] for r in rows)  # a promoted trial went on from the state kept at its pause
    assert result.counts() == {"paused": 6 - len(promoted), "completed": len(promoted)}


HOLD, HELD = multiprocessing.get_context("fork").Event(), multiprocessing.get_context("fork").Event()


class Holding(Counting):
    """`Counting`, except that a config with `hold` makes its second step wait for `HOLD` (up to 3 s)."""

    def setup(self, config: dict[str, Any], ctx: Any) -> None:
        super().setup(config, ctx)
        self.hold = config.get("hold", False)

    def step(self) -> dict[str, Any]:
        if self.hold and self.t == 1:
            HELD.set()
            HOLD.wait(timeout=3)
        return super().step()


def test_an_exploit_waits_for_the_snapshot_its_donors_busy_worker_has_yet_to_take():
    """The donor's worker is busy with another trial's step when the donor is told to snapshot and go on: the exploit
    copies that snapshot (the state the donor was ranked with), not the donor's older one the driver already holds."""
    from nasplat.executors.processes import ProcessExecutor

    HOLD.clear(), HELD.clear()
    executor = ProcessExecutor(3, processes=2)
    executor.open(Holding, "exploit-wait")
    try:
        for trial_id, config in enumerate(({"x": 0.0}, {"x": 1.0}, {"x": 2.0, "hold": True})):
            executor.launch(trial_id, config, seed=trial_id)  # trials 0 and 2 share a worker; 1 has the other
        assert executor.trials[0].worker is executor.trials[2].worker is not executor.trials[1].worker
        assert _counts(executor, 3) == {0: 1, 1: 1, 2: 1}
        executor.step(0, snapshot=True)  # a snapshot at t=1, then t=2
        assert _counts(executor, 1) == {0: 2}
        executor.step(2)  # its worker is held in trial 2's step
        assert HELD.wait(timeout=30)
        executor.step(0, snapshot=True)  # snapshot at t=2: taken only once the worker reads this, after trial 2's step
        executor.exploit(1, 0, {"x": 0.5})
        HOLD.set()
        assert _counts(executor, 3) == {0: 3, 1: 3, 2: 2}  # trial 1 trained on from the donor's t=2
    finally:
        HOLD.set()
        executor.close()


def _counts(executor: Any, n: int) -> dict[int, int]:
    """The `t` of the next `n` step events, by trial."""
    counts: dict[int, int] = {}
    while len(counts) < n:
        counts.update({e.trial_id: e.metrics["t"] for e in executor.wait() if e.metrics is not None})
    return counts


SHORT_ENDED = multiprocessing.get_context("fork").Event()


class Uneven(Counting):
    """`Counting` whose even trials run 20 steps and odd trials 1 (it says it is done): trials of different lengths.
    A long trial's second step waits until both short trials are recorded (`SHORT_ENDED`)."""

    def step(self) -> dict[str, Any]:
        if self.ctx.trial_id % 2 == 0 and self.t == 1:
            SHORT_ENDED.wait(timeout=60)
        metrics = super().step()
        return {**metrics, "done": self.t >= (20 if self.ctx.trial_id % 2 == 0 else 1)}


class SetWhenShortTrialsEnd:
    """A listener that sets `SHORT_ENDED` once the driver has recorded both short trials' rows."""

    def __init__(self) -> None:
        self.ended = 0

    def on_row(self, engine: Any, row: dict[str, Any]) -> None:
        self.ended += row["trial_id"] % 2
        if self.ended == 2:
            SHORT_ENDED.set()


def test_a_worker_with_nothing_to_run_takes_over_a_trial_waiting_on_another():
    """Trials 0 and 2 (20 steps) are launched on one worker, 1 and 3 (1 step) on the other: once 1 and 3 end, one of
    the long trials moves to the idle worker with its state and goes on there, and every row is what the in-process
    executor records."""
    def run(executor: str) -> ExperimentResult:
        SHORT_ENDED.clear()
        return nasplat.run(trainer=Uneven, space={"x": Float(0.0, 1.0)}, metric="score", executor=executor,
                           concurrency=4, max_trials=4, max_steps=20, seed=0, callbacks=[SetWhenShortTrialsEnd()])

    moved, here = run("processes").rows, run("local").rows
    # Launched on one worker, the two long trials' steps ran on both (one moved, before or after its first step).
    assert len({r["pid"] for r in moved if r["trial_id"] in (0, 2)}) == 2

    def key(rows: list[dict[str, Any]]) -> list[tuple[int, int, float, int]]:
        return sorted((r["trial_id"], r["step"], r["score"], r["t"]) for r in rows)
    assert key(moved) == key(here) and len(here) == 42  # its state came along: nothing lost, nothing repeated


NO_TORCH = """
import json
import sys
import nasplat
from nasplat import Float, Trainer

class Plain(Trainer):
    def setup(self, config, ctx):
        self.x = config["x"]
    def step(self):
        return {"score": self.x, "torch": "torch" in sys.modules}
    def state_dict(self):
        return {"x": self.x}
    def load_state_dict(self, state):
        self.x = state["x"]

checkpoint = {"every": 1} if sys.argv[2] == "checkpoints" else None
result = nasplat.run(trainer=Plain, space={"x": Float(0.0, 1.0)}, metric="score", executor="processes",
                     concurrency=2, max_trials=4, storage=sys.argv[1], name=sys.argv[2], checkpoint=checkpoint)
print(json.dumps({"steps": sorted({row["torch"] for row in result.rows}), "driver": "torch" in sys.modules,
                  "rows": len(result.rows)}))
"""


@pytest.mark.parametrize("checkpoints", [False, True])
def test_a_worker_imports_torch_only_to_write_a_checkpoint(tmp_path: Any, checkpoints: bool) -> None:
    """A search that writes no checkpoint never imports torch in its workers (seconds per worker); one that does
    writes them with it."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", NO_TORCH, str(tmp_path), "checkpoints" if checkpoints else "none"],
                         capture_output=True, text=True, check=True, env={**os.environ, "NASPLAT_TENSORBOARD": "0"})
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["rows"] == 4 and seen["driver"] is False
    assert seen["steps"] == ([False, True] if checkpoints else [False]), out.stdout  # a worker's later trials: True
    written = list((tmp_path / ("checkpoints" if checkpoints else "none")).glob("checkpoints/trial-*/step-*"))
    assert len(written) == (4 if checkpoints else 0)
