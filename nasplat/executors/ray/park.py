"""Idle one-rank gangs kept between the experiments of this driver, so that the next experiment starts warm.

A Ray actor costs a worker process, its imports and the trainer class's arrival: a few hundred milliseconds on an
idle machine, seconds on a busy one, where a no-op trial costs about a millisecond. `RayExecutor.close` therefore
parks its healthy one-rank gangs here (their trainer dropped, their logical CPUs still held), and the next
`RayExecutor.open` in this process adopts those whose resources match. Parked gangs are killed `park_s` seconds
after they were parked, when an executor needs other resources, or by `release_parked`. A gang parked under one Ray
session is never handed out under another (after `ray.shutdown` and `ray.init` it is gone with its session).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import ray


@dataclass
class _Parked:
    key: str  # the resources and backend the gang was made with
    session: str  # the Ray job that owns its actors
    gang: Any  # a one-rank `nasplat.executors.ray.gang.Gang`


_lock = threading.Lock()
_parked: list[_Parked] = []
_timer: threading.Timer | None = None


def session() -> str:
    """This driver's Ray job: actors it made live as long as it does."""
    return ray.get_runtime_context().get_job_id() if ray.is_initialized() else ""


def park(gangs: list[Any], key: str, park_s: float) -> None:
    """Keep `gangs` (one-rank, healthy, idle) for a later experiment with the same `key`, for `park_s` seconds."""
    global _timer
    if not gangs:
        return
    current = session()
    for gang in gangs:
        gang.park()
    with _lock:
        _parked.extend(_Parked(key, current, gang) for gang in gangs)
        if _timer is not None:
            _timer.cancel()
        _timer = threading.Timer(park_s, release_parked)
        _timer.daemon = True
        _timer.start()


def adopt(key: str, count: int) -> list[Any]:
    """Up to `count` parked gangs made with `key` under this Ray session; every other parked gang is killed (it holds
    resources the caller may need)."""
    current = session()
    with _lock:
        taken = [p for p in _parked if p.key == key and p.session == current][:count]
        rest = [p for p in _parked if p not in taken]
        _parked.clear()
    _kill(rest)
    return [p.gang for p in taken]


def release_parked() -> None:
    """Kill every parked gang now, giving its resources back to Ray."""
    with _lock:
        gone = list(_parked)
        _parked.clear()
    _kill(gone)


def wait_for_release(timeout: float | None = None) -> bool:
    """Wait until the release due `park_s` after the last park has run (at most `timeout` seconds); whether it has
    (True also where none is due)."""
    with _lock:
        timer = _timer
    if timer is None:
        return True
    timer.join(timeout)
    return not timer.is_alive()


def parked_count() -> int:
    """How many gangs are parked."""
    with _lock:
        return len(_parked)


def _kill(parked: list[_Parked]) -> None:
    current = session()
    for entry in parked:
        if entry.session == current:  # one of an earlier session died with it
            try:
                entry.gang.kill()
            except Exception:  # noqa: BLE001, S110 (Ray is shutting down: the actor goes with it)
                pass
