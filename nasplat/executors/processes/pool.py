"""The `processes` driver's workers: forked, replaced when dead, buried, closed; the requests queued for each (written
together by `flush`) and, for every question asked, who gets the reply.

`WorkerPool` changes no trial's record: what it learns of a worker (a broken pipe, what a dead one sent before it
died) it returns, and the executor (`nasplat.executors.processes.executor`) decides what that means.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nasplat.executors.processes.child import ActivitySlot
from nasplat.executors.processes.messages import Close, Message, Request
from nasplat.executors.processes.pipes import WorkerProcess, last_words, running_user_step, send
from nasplat.executors.processes.worker import serve
from nasplat.storage import Storage


@dataclass(frozen=True)
class Burial:
    """What a dead worker left: the messages it sent before it died, the trials whose steps it reported among them,
    the error of its `Crash` (None: it sent none), its process id and exit code."""

    messages: list[Message]
    stepped: set[int]
    crash: str | None
    pid: int | None
    exitcode: int | None


class WorkerPool:
    """`size` forked workers with `threads` torch threads each (`workers`, in the order forked; a dead one stays
    listed until `replace_dead`), and what the driver queued for them (`outgoing`)."""

    def __init__(self, size: int, threads: int) -> None:
        self.size, self.threads = size, threads
        self.workers: list[WorkerProcess] = []
        self.outgoing: dict[WorkerProcess, list[Request]] = {}  # requests not yet written, by worker (`flush`)
        self.trainer_cls: type | None = None
        self.checkpoints: Storage | None = None
        self.t0 = 0.0
        self.closing = False  # `close_all` was called: a dead worker is not replaced

    def open(self, trainer_cls: type, checkpoints: Storage | None, t0: float) -> None:
        """Fork the workers for `trainer_cls` trials (checkpoints written to `checkpoints`, clocks read from `t0`)."""
        self.trainer_cls, self.checkpoints, self.t0, self.closing = trainer_cls, checkpoints, t0, False
        self.replace_dead()

    def live(self) -> list[WorkerProcess]:
        """The workers alive, in the order forked."""
        return [w for w in self.workers if w.alive]

    def full(self) -> bool:
        """Whether `size` workers are there and alive."""
        return len(self.workers) == self.size and all(w.alive for w in self.workers)

    def replace_dead(self) -> None:
        """Drop the dead workers and fork new ones in their place."""
        self.workers = self.live()
        while len(self.workers) < self.size:
            self.workers.append(self._fork())

    def _fork(self) -> WorkerProcess:
        """A new worker; it lets go of the driver's ends of every pipe (its own and the live workers')."""
        driver_end, worker_end = multiprocessing.Pipe()
        slot = ActivitySlot()
        inherited = [driver_end.fileno()] + [w.conn.fileno() for w in self.workers if not w.conn.closed]
        process = multiprocessing.get_context("fork").Process(
            target=serve, name="nasplat-worker", daemon=True,
            args=(worker_end, self.trainer_cls, self.checkpoints, self.t0, self.threads, slot, os.getpid(),
                  tuple(inherited)))
        process.start()
        worker_end.close()
        return WorkerProcess(process, driver_end, slot)

    def least_loaded(self) -> WorkerProcess:
        """The live worker hosting the fewest trials (the first forked among equals)."""
        return min(self.live(), key=lambda w: len(w.trials))

    # -- requests and replies ----------------------------------------------------------------------------
    def write(self, worker: WorkerProcess, message: Request) -> None:
        """Queue `message` for a live worker; `flush` writes it."""
        if worker.alive:
            self.outgoing.setdefault(worker, []).append(message)

    def flush(self) -> list[WorkerProcess]:
        """Write every queued request, one write per worker; returns the workers whose pipe is broken (dead: the
        caller buries them)."""
        broken = []
        while self.outgoing:
            worker, messages = self.outgoing.popitem()
            if worker.alive and not send(worker, messages):
                broken.append(worker)
        return broken

    def ask_later(self, worker: WorkerProcess, message: Request, answer: Callable[[Any], None]) -> None:
        """Queue `message`; `answer` gets the worker's reply when it comes (`answer`), None at once if the worker is
        dead, or once it dies first (`give_up_asks`)."""
        if not worker.alive:
            answer(None)
            return
        worker.asks.append(answer)
        self.write(worker, message)

    @staticmethod
    def answer(worker: WorkerProcess, value: Any) -> None:
        """A reply came from `worker`: whoever asked first and has no reply yet gets `value`."""
        if worker.asks:
            worker.asks.popleft()(value)

    @staticmethod
    def give_up_asks(worker: WorkerProcess) -> None:
        """`worker` is gone: every question it has not answered gets None."""
        while worker.asks:
            worker.asks.popleft()(None)

    def close_all(self) -> None:
        """Queue `Close` for every live worker: it ends once it has read it. The pool is closing."""
        self.closing = True
        for worker in self.live():
            self.write(worker, Close())

    # -- deaths and the end ----------------------------------------------------------------------------------
    @staticmethod
    def kill(worker: WorkerProcess) -> int:
        """SIGKILL the worker's process (its death is taken in by `bury`); returns its process id."""
        pid = worker.process.pid
        assert pid is not None  # a worker is started when made
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return pid

    @staticmethod
    def bury(worker: WorkerProcess) -> Burial:
        """Mark a dead worker (or one whose pipe broke: killed now) dead, read what it sent before it died, and let
        go of its process and pipe. Its unanswered questions stay for the caller (`give_up_asks`), after it took
        in the replies among those messages."""
        worker.alive = False
        messages, stepped, crash = last_words(worker)
        process = worker.process
        process.join(timeout=5)
        if process.is_alive():  # its pipe broke but it lives on: it hosts nothing the driver can reach
            process.kill()
            process.join()
        worker.conn.close()
        return Burial(messages, stepped, crash, process.pid, process.exitcode)

    def end(self) -> None:
        """Wait for every worker to end once its `Close` was written (`close_all`), killing one still running a step
        (abandoned) or slow to end; questions still unanswered get None. The pool is empty after."""
        end = time.monotonic() + 10
        for worker in self.workers:
            if running_user_step(worker):
                worker.process.kill()
            worker.process.join(timeout=max(0.0, end - time.monotonic()))
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()
            worker.conn.close()
            worker.alive = False
            self.give_up_asks(worker)
        self.workers = []
