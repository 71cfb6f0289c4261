"""Tidying up after tests that start whole Ray clusters in a process session of their own."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


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
