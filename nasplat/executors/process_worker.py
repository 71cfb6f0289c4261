"""The worker side of the `processes` executor: the loop each forked worker runs around a `LocalExecutor`."""

from __future__ import annotations

import pickle
import queue
import sys
import threading
import traceback
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any

from nasplat.executors.local import LocalExecutor
from nasplat.executors.messages import (
    ASKS,
    Adopt,
    Close,
    Crash,
    Event,
    ExploitState,
    Give,
    Given,
    Keep,
    Launch,
    Message,
    Reply,
    Request,
    Snapshot,
    Step,
    Stop,
)
from nasplat.storage import Storage


def serve(conn: Connection, trainer_cls: type, checkpoints: Storage | None, t0: float, threads: int) -> None:
    """A worker's loop: read every message that has come, then run one queued step and send its event."""
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)
    outgoing: queue.SimpleQueue[Message | None] = queue.SimpleQueue()  # a sender thread: replies never block reading

    def send() -> None:
        while (message := outgoing.get()) is not None:
            conn.send_bytes(_dumps(message))

    sender = threading.Thread(target=send, name="nasplat-worker-sender", daemon=True)
    sender.start()
    local = LocalExecutor(1)
    try:
        local.open(trainer_cls, "worker", checkpoints)
        local.t0 = t0
        while True:
            while not local.queue or conn.poll():
                request: Request = pickle.loads(conn.recv_bytes())
                if isinstance(request, Close):
                    return
                if isinstance(request, ASKS):
                    try:
                        reply = _handle(local, request)
                    except Exception:  # e.g. a trainer without `state_dict`: the receiver loads the fallback
                        reply = None
                    outgoing.put(Reply(reply))
                else:
                    _handle(local, request)
                if isinstance(request, Step) and request.snapshot:  # the driver holds snapshots, as on Ray
                    outgoing.put(Snapshot(request.trial_id, local.snapshots.pop(request.trial_id, None)))
            for event in local.wait():
                outgoing.put(Event(event))
    except (EOFError, KeyboardInterrupt):
        return
    except BaseException:
        outgoing.put(Crash(traceback.format_exc()))
    finally:
        local.close()
        outgoing.put(None)
        sender.join(timeout=30)


def _dumps(message: Message) -> bytes:
    """A worker's message pickled (tensors by value, like `torch.save`: no shared memory to track); a step event whose
    metrics cannot be pickled becomes that step's error, a state that cannot be becomes None (the fallback)."""
    try:
        return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        if isinstance(message, Event):
            error = f"the step's metrics could not be sent from the worker process: {type(exc).__name__}: {exc}"
            message = Event(replace(message.event, metrics=None, error=error))
        elif isinstance(message, Reply):
            message = Reply(None)
        elif isinstance(message, Snapshot):
            message = Snapshot(message.trial_id, None)
        return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def _handle(local: LocalExecutor, request: Request) -> Any:
    """Apply one driver request to the worker's `LocalExecutor`; the reply where the driver waits for one."""
    if isinstance(request, Launch):
        local.launch(request.trial_id, request.config, request.seed, request.state, request.inherit)
    elif isinstance(request, Step):
        local.step(request.trial_id, request.snapshot, request.save)
    elif isinstance(request, Adopt):
        local.adopt(request.trial_id, request.state, request.config, request.save, request.fallback)
    elif isinstance(request, Stop):
        local.stop(request.trial_id, save=request.save)
    elif isinstance(request, ExploitState):
        return local.exploit_state(request.trial_id, request.fallback)
    elif isinstance(request, Keep):
        local.stop(request.trial_id, keep_state=True, save=request.save)
        return local.take_kept(request.trial_id)
    elif isinstance(request, Give):
        return _give(local, request.candidates)
    else:
        raise TypeError(f"unknown request {request!r}")
    return None


def _give(local: LocalExecutor, candidates: tuple[int, ...]) -> Given | None:
    """Hand over the candidate whose queued step would run last here (its config, seed and a copy of its state), the
    trial stopped here without its step; None where no candidate waits here with a state that can be copied."""
    for index in range(len(local.queue) - 1, -1, -1):
        kind, trial_id = local.queue[index]
        host = local.hosts.get(trial_id)
        if kind != "step" or trial_id not in candidates or host is None or host.trainer is None \
                or trial_id in local.failed_setup or local.saves.owes(trial_id):
            continue
        try:
            state = host.copy()
        except Exception:  # e.g. a trainer without `state_dict`: it stays
            continue
        del local.queue[index]
        local.stop(trial_id)
        return Given(trial_id, host.config, host.trainer.ctx.seed, state)
    return None
