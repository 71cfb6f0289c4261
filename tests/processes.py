"""Process helpers for tests: tidying up after tests that start whole Ray clusters in a process session of their
own; the children of a process, and waiting (by pid) for processes to end."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

DIE_AFTER_ROWS = """
import os, signal, sys
import nasplat
from nasplat.storage import files

rows, kill_after = [0], int(os.environ["KILL_AFTER"])
append = files.RowLog.append

def append_then_die(self, item):
    append(self, item)
    if "step" in item:
        rows[0] += 1
        if rows[0] == kill_after:
            os.kill(os.getpid(), signal.SIGKILL)

files.RowLog.append = append_then_die
"""
"""The start of a driver script that SIGKILLs itself right after the $KILL_AFTER-th row reached results.jsonl (0:
never); the script goes on with its `nasplat.run` or `nasplat.resume`."""


def session_pids(sid: int) -> list[int]:
    """The live (non-zombie) pids in process session `sid`; Ray's processes stay in the session that started them."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and os.getsid(int(entry.name)) == sid and \
                    (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                pids.append(int(entry.name))
        except (OSError, IndexError):
            pass
    return pids


def kill_session(sid: int, timeout: float = 30) -> None:
    """SIGKILL whatever is left in session `sid` until none is left (or `timeout` seconds passed)."""
    deadline = time.monotonic() + timeout
    while (left := session_pids(sid)) and time.monotonic() < deadline:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)


def children(pid: int) -> list[int]:
    """The pids whose parent is `pid` now (read from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            pass
    return found


def still_running(pids: list[int], timeout: float) -> list[int]:
    """Those of `pids` whose processes have not exited within `timeout` seconds (a zombie has exited), watched by
    pidfd: woken by each exit, no polling."""
    import select

    watched: dict[int, int] = {}  # pidfd -> pid
    for pid in pids:
        try:
            watched[os.pidfd_open(pid)] = pid
        except ProcessLookupError:  # gone already
            pass
    poller = select.poll()
    for fd in watched:
        poller.register(fd, select.POLLIN)
    deadline = time.monotonic() + timeout
    try:
        left = set(watched)
        while left and (remaining := deadline - time.monotonic()) > 0:
            for fd, _ in poller.poll(remaining * 1000):
                left.discard(fd)
                poller.unregister(fd)
        return sorted(watched[fd] for fd in left)
    finally:
        for fd in watched:
            os.close(fd)
