"""The worker side of the `processes` executor: the loop each forked worker runs around a `LocalExecutor`.

A worker reads every request that has come, then runs one queued step, and so on: it runs one piece of user code
at a time (a setup, a step, a state copy), each written into its `ActivitySlot` while it runs, so that the driver
can time it out and, if the worker dies, charge that trial alone.
"""

from __future__ import annotations

import pickle
import queue
import sys
import threading
import traceback
from collections.abc import Callable, Iterable
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any

from nasplat.executors.local import LocalExecutor
from nasplat.executors.processes.child import COPY, EXPLOIT, REPLAY, SETUP, STEP, ActivitySlot, detach
from nasplat.executors.processes.messages import (
    ASKS,
    Adopt,
    Close,
    Crash,
    End,
    Event,
    ExploitState,
    Give,
    Given,
    Keep,
    Launch,
    Message,
    Relaunch,
    Reply,
    Request,
    Snapshot,
    Step,
)
from nasplat.storage import Storage


def serve(conn: Connection, trainer_cls: type, checkpoints: Storage | None, t0: float, threads: int,
          slot: ActivitySlot, driver_pid: int, inherited: Iterable[int] = ()) -> None:
    """A worker's loop: read every message that has come, then run one queued step and send its event. It ends on
    `Close`, or at end of file (the driver is gone); it dies with the driver in any case (`detach`)."""
    detach(driver_pid, conn.fileno(), inherited)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)
    outgoing: queue.SimpleQueue[Message | None] = queue.SimpleQueue()  # a sender thread: replies never block reading

    def send() -> None:
        while (message := outgoing.get()) is not None:
            try:
                conn.send_bytes(_dumps(message))
            except OSError:  # the driver is gone
                return

    sender = threading.Thread(target=send, name="nasplat-worker-sender", daemon=True)
    sender.start()
    local = LocalExecutor(1, t0=t0)
    try:
        local.open(trainer_cls, "worker", checkpoints)
        setups: dict[int, float] = {}  # trial id -> how long its launch's setup took (its first step's clock)
        while True:
            while local.idle() or conn.poll():
                requests: list[Request] = pickle.loads(conn.recv_bytes())  # one write of the driver
                for request in requests:
                    if isinstance(request, Close):
                        return
                    begin = local.now()
                    _serve_request(local, request, slot, outgoing.put)
                    if isinstance(request, Launch):
                        setups[request.trial_id] = local.now() - begin
            trial_id = local.next_step()  # the step `wait` runs (None: it reports an ended trial's saves)
            if trial_id is not None:  # a launch's setup and first step count as one step (waiting in between does not)
                now = local.now()
                slot.enter(trial_id, STEP, now - setups.pop(trial_id, 0.0))
            events = local.wait()
            slot.leave()
            for event in events:
                outgoing.put(Event(event))
    except (EOFError, KeyboardInterrupt):
        return
    except BaseException:  # noqa: BLE001 (a `sys.exit` in a step: the slot names the trial whose code broke the loop)
        outgoing.put(Crash(traceback.format_exc()))
    finally:
        local.close()
        outgoing.put(None)
        sender.join(timeout=30)


def _serve_request(local: LocalExecutor, request: Request, slot: ActivitySlot, put: Callable[[Message], None]) -> None:
    """Handle one request, its user code marked in `slot`; put its reply (or the snapshot it took) to be sent."""
    activity = _activity(request)
    if activity is not None:
        slot.enter(*activity, local.now())
    if isinstance(request, ASKS):
        try:
            reply = _handle(local, request, slot)
        except Exception:  # noqa: BLE001 (e.g. a trainer without `state_dict`: the receiver loads the fallback)
            reply = None
        put(Reply(reply))
    elif isinstance(request, Relaunch):
        _relaunch(local, request, slot, put)
    else:
        _handle(local, request, slot)
    slot.leave()
    then = request.then if isinstance(request, Relaunch) else request
    if isinstance(then, Step) and then.snapshot:  # the driver holds snapshots, as on Ray
        put(Snapshot(then.trial_id, local.take_snapshot(then.trial_id)))


def _activity(request: Request) -> tuple[int, int] | None:
    """Whose user code handling `request` runs, and which (the trial, an `ActivitySlot` code); None where it runs
    none."""
    if isinstance(request, Launch | Relaunch):
        return request.trial_id, SETUP
    if isinstance(request, Adopt):
        return request.trial_id, EXPLOIT
    if isinstance(request, Keep | ExploitState) or isinstance(request, Step | End) and request.save is not None \
            or isinstance(request, Step) and request.snapshot:
        return request.trial_id, COPY
    return None


def _relaunch(local: LocalExecutor, request: Relaunch, slot: ActivitySlot, put: Callable[[Message], None]) -> None:
    """Build the trial from the driver's state, replay the steps it had made since then (their events dropped, a
    failure kept as the error of its next step), then handle the step it owes."""
    trial_id = request.trial_id
    local.build(trial_id, request.config, request.seed, request.state, request.inherit)
    for index in range(request.replay):  # the replay and `then` decide what runs
        if local.setup_failed(trial_id):
            break
        slot.enter(trial_id, REPLAY, local.now())
        event = local.run_step(trial_id)
        if event.error is not None:
            local.fail_next_step(trial_id, f"replaying step {index + 1} of {request.replay} to relaunch the trial "
                                           f"after its worker process died failed:\n{event.error}")
        if event.saved:
            put(Event(replace(event, metrics=None, error=None)))
    if request.then is not None:
        activity = _activity(request.then)
        if activity is not None:
            slot.enter(*activity, local.now())
        _handle(local, request.then, slot)


def _dumps(message: Message) -> bytes:
    """A worker's message pickled (tensors by value, like `torch.save`: no shared memory to track); a step event whose
    metrics cannot be pickled becomes that step's error, a state that cannot be becomes None (the fallback)."""
    try:
        return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # noqa: BLE001 (whatever pickling raises: the step's error, or no state)
        if isinstance(message, Event):
            error = f"the step's metrics could not be sent from the worker process: {type(exc).__name__}: {exc}"
            message = Event(replace(message.event, metrics=None, error=error))
        elif isinstance(message, Reply):
            message = Reply(None)
        elif isinstance(message, Snapshot):
            message = Snapshot(message.trial_id, None)
        return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def _handle(local: LocalExecutor, request: Request, slot: ActivitySlot) -> Any:
    """Apply one driver request to the worker's `LocalExecutor`; the reply where the driver waits for one."""
    if isinstance(request, Launch):
        local.launch(request.trial_id, request.config, request.seed, request.state, request.inherit)
    elif isinstance(request, Step):
        local.step(request.trial_id, request.snapshot, request.save)
    elif isinstance(request, Adopt):
        local.adopt(request.trial_id, request.state, request.config, request.save, request.fallback)
    elif isinstance(request, End):
        local.stop(request.trial_id, save=request.save)
    elif isinstance(request, ExploitState):
        return local.exploit_state(request.trial_id, request.fallback)
    elif isinstance(request, Keep):
        local.stop(request.trial_id, keep_state=True, save=request.save)
        return local.take_kept(request.trial_id)
    elif isinstance(request, Give):
        return _give(local, request.candidates, slot)
    else:
        raise TypeError(f"unknown request {request!r}")
    return None


def _give(local: LocalExecutor, candidates: tuple[int, ...], slot: ActivitySlot) -> Given | None:
    """Hand over the candidate whose queued step would run last here (its config, seed and a copy of its state), the
    trial stopped here without its step; None where no candidate waits here with a state that can be copied."""
    for trial_id in local.waiting():
        if trial_id not in candidates or not local.movable(trial_id):
            continue
        slot.enter(trial_id, COPY, local.now())
        try:
            state = local.copy_state(trial_id)
        except Exception:  # noqa: BLE001, S112 (e.g. a trainer without `state_dict`: it stays)
            continue
        finally:
            slot.leave()
        config, seed = local.withdraw(trial_id)
        return Given(trial_id, config, seed, state)
    return None
