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
from nasplat.space import Config
from nasplat.storage import Storage

REPLIES = ("exploit_state", "keep", "give")  # messages the driver waits on: the worker replies to each


def serve(conn: Connection, trainer_cls: type, checkpoints: Storage | None, t0: float, threads: int) -> None:
    """A worker's loop: read every message that has come, then run one queued step and send its event."""
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)
    outgoing: queue.SimpleQueue[Any] = queue.SimpleQueue()  # a sender thread: a large reply never blocks reading

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
                message = pickle.loads(conn.recv_bytes())
                if message[0] == "close":
                    return
                if message[0] in REPLIES:
                    try:
                        reply = _handle(local, message)
                    except Exception:  # e.g. a trainer without `state_dict`: the receiver loads the fallback
                        reply = None
                    outgoing.put(("reply", reply))
                else:
                    _handle(local, message)
                if message[0] == "step" and message[2]:  # the driver holds snapshots, as on Ray (None: none taken)
                    outgoing.put(("snapshot", message[1], local.snapshots.pop(message[1], None)))
            for event in local.wait():
                outgoing.put(("event", event))
    except (EOFError, KeyboardInterrupt):
        return
    except BaseException:
        outgoing.put(("crash", traceback.format_exc()))
    finally:
        local.close()
        outgoing.put(None)
        sender.join(timeout=30)


def _dumps(message: tuple[Any, ...]) -> bytes:
    """A worker's message pickled (tensors by value, like `torch.save`: no shared memory to track); a step event whose
    metrics cannot be pickled becomes that step's error, a state that cannot be becomes None (the fallback)."""
    try:
        return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        if message[0] != "event":
            return pickle.dumps(message[:-1] + (None,), protocol=pickle.HIGHEST_PROTOCOL)
        event = message[1]
        error = f"the step's metrics could not be sent from the worker process: {type(exc).__name__}: {exc}"
        return pickle.dumps(("event", replace(event, metrics=None, error=error)), protocol=pickle.HIGHEST_PROTOCOL)


def _handle(local: LocalExecutor, message: tuple[Any, ...]) -> Any:
    """Apply one driver message to the worker's `LocalExecutor`; the reply where the driver waits for one."""
    if message[0] == "give":
        return _give(local, message[1])
    kind, trial_id, *args = message
    if kind == "launch":
        local.launch(trial_id, *args)
    elif kind == "step":
        local.step(trial_id, *args)
    elif kind == "adopt":
        local.adopt(trial_id, *args)
    elif kind == "exploit_state":
        return local.exploit_state(trial_id, *args)
    elif kind == "stop":
        local.stop(trial_id, save=args[0])
    elif kind == "keep":
        local.stop(trial_id, keep_state=True, save=args[0])
        return local.kept.pop(trial_id, None)
    else:
        raise ValueError(f"unknown message {kind!r}")
    return None


def _give(local: LocalExecutor, candidates: list[int]) -> tuple[int, Config, int, Any] | None:
    """Hand over the candidate whose queued step would run last here: (trial id, config, seed, a copy of its state),
    the trial stopped here without its step; None where no candidate waits here with a state that can be copied."""
    for index in range(len(local.queue) - 1, -1, -1):
        kind, trial_id = local.queue[index]
        host = local.hosts.get(trial_id)
        if kind != "step" or trial_id not in candidates or host is None or host.trainer is None \
                or trial_id in local.failed_setup or local.unreported[trial_id]:
            continue
        try:
            state = host.copy()
        except Exception:  # e.g. a trainer without `state_dict`: it stays
            continue
        del local.queue[index]
        local.stop(trial_id)
        return trial_id, host.config, host.trainer.ctx.seed, state
    return None
