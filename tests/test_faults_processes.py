"""Faults on the `processes` executor (issue 21): a killed driver leaves no worker and no lock behind, a hung step
times out and fails that trial alone, a dead worker charges only the trial whose step it ran."""

from __future__ import annotations

import contextlib
import fcntl
import json
import multiprocessing
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from processes import children, still_running

import nasplat
from nasplat import Float, Trainer
from nasplat.engine.result import ExperimentResult
from nasplat.executors.processes import ProcessExecutor
from nasplat.storage import read_rows

BIN = Path(sys.executable).parent

# -- a driver killed mid-run ----------------------------------------------------------------------------------------
FAULTY = """
import os, threading
from pathlib import Path
from nasplat import Float, Trainer

space = {"x": Float(0.0, 1.0)}

class Toy(Trainer):
    def setup(self, config, ctx):
        self.x, self.t = config["x"], 0
        Path(os.environ["NASPLAT_TEST_PIDS"], str(os.getpid())).touch()  # every worker that hosts a trial
    def step(self):
        self.t += 1
        if os.environ.get("HOLD") == "1" and self.ctx.trial_id == 5 and self.t == 1:
            print("HELD", os.getpid(), flush=True)
            threading.Event().wait(120)  # mid-step when the driver is killed
        return {"score": self.x + 0.01 * self.t, "t": self.t}
    def state_dict(self):
        return {"t": self.t}
    def load_state_dict(self, state):
        self.t = state["t"]
"""
RUN = ("import sys, nasplat; nasplat.run(trainer='faulty:Toy', space='faulty:space', metric='score', "
       "executor='processes', concurrency=2, max_trials=8, max_steps=4, seed=3, checkpoint={'every': 1}, "
       "scheduler={'name': 'asha', 'type': 'promote'}, storage=sys.argv[1], name='exp')")


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_killed_driver_leaves_no_worker_and_resume_takes_over(tmp_path: Path, how: signal.Signals) -> None:
    (tmp_path / "faulty.py").write_text(FAULTY)
    (tmp_path / "pids").mkdir()
    path = os.pathsep.join([str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "PYTHONPATH": path, "NASPLAT_TEST_PIDS": str(tmp_path / "pids")}
    driver = subprocess.Popen([sys.executable, "-c", RUN, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                              env={**env, "HOLD": "1"})
    try:
        line = driver.stdout.readline().split()  # a worker is mid-step; the driver holds the folder
        assert line[:1] == ["HELD"], line
        workers = set(children(driver.pid)) | {int(p.name) for p in (tmp_path / "pids").iterdir()}
        assert int(line[1]) in workers and len(workers) >= 2
        driver.send_signal(how)
        assert driver.wait(timeout=30) == -how
    finally:
        driver.kill()
        driver.wait()
    left = still_running(sorted(workers), timeout=10)
    for pid in left:  # leave nothing behind, then fail
        os.kill(pid, signal.SIGKILL)
    assert left == [], f"worker processes {left} outlived their driver {driver.pid}"
    resumed = subprocess.run([str(BIN / "nasplat"), "resume", str(tmp_path / "exp"), "--quiet"],
                             capture_output=True, text=True, timeout=120, env=env, check=False)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = read_rows(tmp_path / "exp" / "results.jsonl")
    keys = Counter((r["trial_id"], r["step"], r["attempt"]) for r in rows)
    assert [k for k, n in keys.items() if n > 1] == []  # every row once
    assert {r["trial_id"] for r in rows} == set(range(8)) and all(r["t"] == r["step"] for r in rows)
    last = {r["trial_id"]: r["status"] for r in rows}
    assert set(last.values()) <= {"completed", "paused", "stopped"}  # every trial ended (ASHA pauses most)
    assert any(r["step"] > 1 for r in rows)  # some were promoted


def test_a_worker_holds_no_lock_no_file_open_for_writing_and_no_other_pipe(tmp_path: Path) -> None:
    lock = open(tmp_path / "lock", "a+")  # noqa: SIM115 - held across the test, like the folder's lock
    rows = open(tmp_path / "rows.jsonl", "a")  # noqa: SIM115
    data = open(tmp_path / "data.bin", "wb+")  # noqa: SIM115
    data.write(b"0123")
    data.flush()
    dataset = open(tmp_path / "data.bin", "rb")  # noqa: SIM115 - read-only: a dataset a trainer may read
    fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
    executor = ProcessExecutor(2, processes=2)
    executor.open(Counting, "fds")
    try:
        for trial_id in range(2):  # one on each worker: a worker that steps has let go of what it inherited
            executor.launch(trial_id, {}, seed=trial_id)
        assert len(_steps(executor, 2)) == 2
        for index, worker in enumerate(executor.pool.workers):
            pid = worker.process.pid
            driver_ends = {w.conn.fileno() for w in executor.pool.workers[: index + 1]}  # open when it was forked
            targets = {}
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    targets[int(fd)] = os.readlink(f"/proc/{pid}/fd/{fd}")
            held = {Path(t).name for t in targets.values()}
            assert not held & {"lock", "rows.jsonl"}, targets
            assert "data.bin" in held  # the read-only one stays
            for fd in driver_ends & set(targets):  # the driver's ends of the pipes: /dev/null there now
                assert targets[fd] == "/dev/null", (fd, targets[fd])
            assert not any("lock:" in Path(f"/proc/{pid}/fdinfo/{fd}").read_text() for fd in targets
                           if Path(f"/proc/{pid}/fdinfo/{fd}").exists())
    finally:
        executor.close()
        for file in (lock, rows, data, dataset):
            file.close()


def test_a_worker_ends_at_the_end_of_its_pipe_though_later_workers_were_forked() -> None:
    """Worker 0's pipe is closed on the driver's side (as a dead driver's is): it ends, though worker 1, forked
    after it, inherited the driver's end of that pipe (and lets go of it)."""
    executor = ProcessExecutor(2, processes=2)
    executor.open(Counting, "eof")
    try:
        for trial_id in range(2):
            executor.launch(trial_id, {}, seed=trial_id)
        assert len(_steps(executor, 2)) == 2
        first, second = (w.process for w in executor.pool.workers)
        executor.pool.workers[0].conn.close()
        assert still_running([first.pid], timeout=10) == []
        assert first.exitcode == 0 and second.is_alive()
    finally:
        executor.pool.workers[0].alive = False
        executor.close()


# -- a step that hangs --------------------------------------------------------------------------------------------
@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Fail the test (a TimeoutError in this thread) if the block runs longer than `seconds`."""
    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"no end after {seconds} s")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


NEVER = multiprocessing.get_context("fork").Event()  # set by nobody: a step that waits on it hangs


class Counting(Trainer):
    """Counts its steps; its state is that count."""

    def setup(self, config: dict[str, Any], ctx: Any) -> None:
        self.t = 0

    def step(self) -> dict[str, Any]:
        self.t += 1
        return {"score": float(self.ctx.trial_id + self.t), "t": self.t}

    def state_dict(self) -> dict[str, Any]:
        return {"t": self.t}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.t = state["t"]


class HangsInTrialOne(Counting):
    """Trial 1's second step hangs."""

    def step(self) -> dict[str, Any]:
        if self.ctx.trial_id == 1 and self.t == 1:
            NEVER.wait()
        return super().step()


def test_a_hung_step_times_out_fails_its_trial_and_the_trials_beside_it_complete(tmp_path: Path) -> None:
    """Three trials on one worker: trial 1's step hangs; the worker is killed at `step_timeout_s`, trial 1 fails
    with the timeout, trials 0 and 2 are relaunched on a new worker, uncharged, and complete."""
    executor = ProcessExecutor(3, processes=1, step_timeout_s=2)  # as `nasplat.run(step_timeout_s=2)` builds it
    with time_limit(60):
        result = nasplat.run(trainer=HangsInTrialOne, space={"x": Float(0.0, 1.0)}, metric="score",
                             executor=executor, max_trials=3, max_steps=4, seed=0, storage=tmp_path, name="hang",
                             checkpoint={"every": 2})
    rows = result.rows
    failed = [r for r in rows if r["status"] == "failed"]
    assert [r["trial_id"] for r in failed] == [1] and failed[0]["step"] == 2
    assert failed[0]["error"].startswith("step timed out after 2 s (step_timeout_s=2)"), failed[0]["error"]
    assert result.counts() == {"completed": 2, "failed": 1}
    others = [r for r in rows if r["trial_id"] != 1]
    assert all(r["attempt"] == 0 and r["status"] in ("running", "completed") for r in others)
    assert sorted((r["trial_id"], r["step"]) for r in others) == [(t, s) for t in (0, 2) for s in range(1, 5)]
    assert all(r["t"] == r["step"] for r in others)  # relaunched where they stood
    assert len({r["pid"] for r in others}) == 2  # on the first worker, then on its replacement
    assert ExperimentResult.load(tmp_path / "hang").rows == rows


# -- a worker killed mid-step ---------------------------------------------------------------------------------------
KILLED_ONCE = multiprocessing.get_context("fork").Value("i", 0)


class KillsItsWorker(Counting):
    """Trial 1's second step SIGKILLs its own worker process, once (its retry runs through)."""

    def step(self) -> dict[str, Any]:
        if self.ctx.trial_id == 1 and self.t == 1 and not KILLED_ONCE.value:
            KILLED_ONCE.value = os.getpid()
            os.kill(os.getpid(), signal.SIGKILL)
        return super().step()


@pytest.mark.parametrize("checkpoint", [None, {"every": 1}], ids=["no-checkpoints", "checkpoints"])
def test_a_worker_killed_mid_step_charges_only_the_trial_whose_step_it_ran(tmp_path: Path, checkpoint: Any) -> None:
    KILLED_ONCE.value = 0
    with time_limit(60):
        result = nasplat.run(trainer=KillsItsWorker, space={"x": Float(0.0, 1.0)}, metric="score",
                             executor="processes", concurrency=3, executor_options={"processes": 1}, max_trials=3,
                             max_steps=4, max_failures=1, seed=0, storage=tmp_path, name="kill",
                             checkpoint=checkpoint)
    rows, pid = result.rows, KILLED_ONCE.value
    retried = [r for r in rows if r["status"] == "retried" and r["error"]]  # the failed step's own row
    assert [(r["trial_id"], r["step"], r["attempt"]) for r in retried] == [(1, 2, 0)]
    assert f"worker process {pid} died" in retried[0]["error"] and "trial 1's step" in retried[0]["error"]
    void = [(r["trial_id"], r["step"], r["attempt"]) for r in rows if r["status"] == "retried" and not r["error"]]
    first_again = next(r["step"] for r in rows if r["trial_id"] == 1 and r["attempt"] == 1)
    assert void == [(1, s, 0) for s in range(first_again, 2)]  # the first attempt's rows its retry went back over
    assert result.counts() == {"completed": 3}
    for trial in (0, 2):  # hosted by the killed worker too: relaunched uncharged, where they stood
        mine = [r for r in rows if r["trial_id"] == trial]
        assert [(r["step"], r["attempt"], r["t"]) for r in mine] == [(s, 0, s) for s in range(1, 5)]
        assert {r["pid"] for r in mine} - {pid}  # some of their steps ran on the replacement
    again = [r for r in rows if r["trial_id"] == 1 and r["attempt"] == 1]
    assert again[-1]["step"] == 4 and all(r["t"] == r["step"] for r in again)
    assert Counter((r["trial_id"], r["step"], r["attempt"]) for r in rows).most_common(1)[0][1] == 1
    assert json.loads(json.dumps(ExperimentResult.load(tmp_path / "kill").rows)) == json.loads(json.dumps(rows))


def test_a_worker_killed_between_steps_charges_nobody() -> None:
    """Three trials on one worker, all between steps (no step of theirs running) when it is killed: their next
    steps run on a new worker from where they stood, none fails."""
    executor = ProcessExecutor(3, processes=1)
    executor.open(Counting, "idle-kill")
    try:
        for trial_id in range(3):
            executor.launch(trial_id, {}, seed=trial_id)
        seen = _steps(executor, 3)
        assert {t: e.metrics["t"] for t, e in seen.items()} == {0: 1, 1: 1, 2: 1}
        first = executor.pool.workers[0].process
        os.kill(first.pid, signal.SIGKILL)
        first.join(timeout=30)
        for _ in range(2):
            for trial_id in range(3):
                executor.step(trial_id)
            seen = _steps(executor, 3)
        assert {t: (e.error, (e.metrics or {}).get("t")) for t, e in seen.items()} == {t: (None, 3) for t in range(3)}
        assert {e.pid for e in seen.values()} == {executor.pool.workers[0].process.pid} != {first.pid}
    finally:
        executor.close()


def _steps(executor: ProcessExecutor, n: int) -> dict[int, Any]:
    """The next `n` step events (metrics or error), by trial."""
    seen: dict[int, Any] = {}
    with time_limit(60):
        while len(seen) < n:
            seen.update({e.trial_id: e for e in executor.wait() if e.metrics is not None or e.error})
    return seen


def test_wait_with_a_timeout_returns_nothing_while_a_step_hangs() -> None:
    executor = ProcessExecutor(1)
    executor.open(HangsInTrialOne, "wait-timeout")
    try:
        executor.launch(1, {}, seed=0)
        assert [e.metrics["t"] for e in executor.wait(timeout=30)] == [1]
        executor.step(1)
        assert executor.wait(timeout=0.3) == []
    finally:
        executor.close()  # kills the worker of the abandoned step at once
