"""The `processes` driver's I/O with one worker: its pipe (pickled messages) and its `ActivitySlot` (shared memory).

Everything here reads or writes bytes and returns what it read: messages, the activity running past a time limit.
Nothing here changes a trial's record; the intake (`nasplat.executors.processes.intake`) decides what each
message means.
"""

from __future__ import annotations

import pickle
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from nasplat.executors.processes.child import REPLAY, STEP, Activity, ActivitySlot
from nasplat.executors.processes.messages import Crash, Event, Message, Request

RECHECK_S = 0.5
"""With `step_timeout_s`, how often (at most) the driver reads its workers' slots while it waits: a step that starts
sends no message."""


class WorkerGone(Exception):
    """The worker's pipe is at end of file or broken (the worker died), or it sent `Crash` (its `error`)."""

    def __init__(self, error: str | None = None) -> None:
        super().__init__(error or "worker gone")
        self.error = error


@dataclass(eq=False)
class WorkerProcess:
    """One forked worker process, the trials it hosts, and the answers it owes to the driver's questions."""

    process: BaseProcess
    conn: Connection
    slot: ActivitySlot
    trials: set[int] = field(default_factory=set)
    alive: bool = True
    asks: deque[Callable[[Any], None]] = field(default_factory=deque)  # who gets each reply, in request order
    giving: bool = False  # a `Give` was sent and its reply has not come


def send(worker: WorkerProcess, requests: list[Request]) -> bool:
    """Pickle `requests` to the worker in one write (it handles them in order); False where its pipe is broken (it
    died)."""
    try:
        worker.conn.send_bytes(pickle.dumps(requests, protocol=pickle.HIGHEST_PROTOCOL))
    except OSError:
        return False
    return True


def receive(worker: WorkerProcess) -> Message:
    """The worker's next message (blocking); `WorkerGone` at end of file, on a broken pipe or for a `Crash`."""
    try:
        message: Message = pickle.loads(worker.conn.recv_bytes())
    except (EOFError, OSError):
        raise WorkerGone from None
    if isinstance(message, Crash):
        raise WorkerGone(message.error)
    return message


def has_message(worker: WorkerProcess, timeout: float | None = 0.0) -> bool:
    """Whether a message (or end of file) is there to read, waiting up to `timeout` seconds (None: forever)."""
    try:
        return worker.conn.poll(timeout)
    except (EOFError, OSError):
        return True


def last_words(worker: WorkerProcess) -> tuple[list[Message], set[int], str | None]:
    """What a dead worker sent before it died: its messages, the trials whose steps it reported, and the error of its
    `Crash` (None: it sent none)."""
    messages: list[Message] = []
    stepped: set[int] = set()
    crash = None
    while True:
        try:
            if not worker.conn.poll():
                break
            message: Message = pickle.loads(worker.conn.recv_bytes())
        except (EOFError, OSError):
            break
        if isinstance(message, Crash):
            crash = message.error
            continue
        if isinstance(message, Event) and (message.event.metrics is not None or message.event.error is not None):
            stepped.add(message.event.trial_id)
        messages.append(message)
    return messages, stepped, crash


def wake_in(worker: WorkerProcess, limit: float | None, now: float) -> float | None:
    """How long to wait on the worker before its slot is read again (None: no step timeout, no need)."""
    if limit is None:
        return None
    recheck = min(RECHECK_S, limit / 2)
    activity = worker.slot.read()
    return recheck if activity is None else max(0.0, min(recheck, activity.since + limit - now))


def overdue(worker: WorkerProcess, limit: float | None, now: float) -> Activity | None:
    """The user code the worker runs past `limit` seconds, or None."""
    if limit is None or not worker.alive:
        return None
    activity = worker.slot.read()
    return activity if activity is not None and now >= activity.since + limit else None


def running_user_step(worker: WorkerProcess) -> bool:
    """Whether the worker runs a step (at close: the engine left it)."""
    activity = worker.slot.read()
    return activity is not None and activity.what in (STEP, REPLAY)
