"""What a forked worker of the `processes` executor does to itself first, and how it tells the driver what it runs.

`detach` cuts a new worker loose from what it inherited: it dies with its driver (a parent-death signal), and it
drops the driver's ends of every worker's pipe (so that it sees end of file once the driver is gone) and the
driver's open files it must not hold (the experiment folder's `lock`, its rows, TensorBoard's event files).

`ActivitySlot` is a few bytes of memory shared by the driver and one worker: the worker writes there, without a
message, which trial's user code (setup, step, state copy) it runs and since when. The driver reads it to time out a
step that runs too long and, once the worker died, to know whose code was running then: only that trial is charged.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import signal
import stat
from collections.abc import Iterable
from dataclasses import dataclass

# What a worker runs (the codes `ActivitySlot` stores, and the words errors use for them)
STEP, REPLAY, SETUP, COPY, EXPLOIT = 1, 2, 3, 4, 5
ACTIVITIES = {STEP: "step", REPLAY: "replayed step", SETUP: "setup", COPY: "state copy", EXPLOIT: "exploit"}
PR_SET_PDEATHSIG = 1  # linux/prctl.h


@dataclass(frozen=True)
class Activity:
    """The user code a worker runs: trial `trial_id`'s `what` (an `ACTIVITIES` code), since `since` (seconds on the
    executor's clock)."""

    trial_id: int
    what: int
    since: float

    @property
    def name(self) -> str:
        return ACTIVITIES.get(self.what, "step")


class ActivitySlot:
    """One worker's activity, in an anonymous shared mapping made before the fork (so no file descriptor): the
    worker `enter`s and `leave`s, the driver `read`s. A sequence number, odd while the worker writes, keeps the
    driver from reading half an update."""

    def __init__(self) -> None:
        self._memory = mmap.mmap(-1, 32)
        self._cells = memoryview(self._memory).cast("d")  # sequence, trial id (-1: none), what, since
        self._cells[1] = -1

    def enter(self, trial_id: int, what: int, since: float) -> None:
        """The worker starts running trial `trial_id`'s `what`, at `since`."""
        cells = self._cells
        cells[0] += 1
        cells[1], cells[2], cells[3] = trial_id, what, since
        cells[0] += 1

    def leave(self) -> None:
        """The worker runs no user code now."""
        cells = self._cells
        cells[0] += 1
        cells[1] = -1
        cells[0] += 1

    def read(self) -> Activity | None:
        """What the worker runs now (None: nothing). A worker that died while writing leaves what it was writing."""
        cells = self._cells
        for _ in range(1000):
            sequence = cells[0]
            trial_id, what, since = cells[1], cells[2], cells[3]
            if sequence == cells[0] and sequence % 2 == 0:
                break
        return None if trial_id < 0 else Activity(int(trial_id), int(what), since)


def detach(driver_pid: int, keep: int, inherited: Iterable[int]) -> None:
    """Run first in a forked worker: die with the driver, then let go of the driver's descriptors it inherited.

    A parent-death signal (Linux `prctl(PR_SET_PDEATHSIG, SIGKILL)`) kills the worker when the driver's thread that
    forked it ends, whatever killed the driver; a driver that died before the signal was set is caught by its pid.
    The `inherited` descriptors (the driver's ends of every worker's pipe) and every inherited regular file that is
    open for writing or holds a lock (the experiment's `lock`, rows, journal, event files) are replaced by
    `/dev/null`: the numbers stay taken, so Python objects that hold them stay harmless, and a later driver takes
    the folder's lock over as soon as this one is gone. Descriptors 0, 1 and 2, the worker's own end `keep`, and
    files open read-only without a lock (a dataset read through a file the driver opened) are kept."""
    set_parent_death_signal()
    if os.getppid() != driver_pid:  # the driver died before the signal was set: nobody will read this worker
        os._exit(0)
    drop = {fd for fd in inherited if fd > 2 and fd != keep} | {fd for fd in written_files() if fd != keep}
    if not drop:
        return
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for fd in sorted(drop - {null}):
            try:
                os.dup2(null, fd)
            except OSError:  # closed meanwhile
                pass
    finally:
        os.close(null)


def set_parent_death_signal() -> bool:
    """Ask the kernel to SIGKILL this process when its parent (thread) ends; False where that cannot be asked."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux
        return False


def written_files() -> list[int]:
    """This process's descriptors (above 2) of regular files open for writing or holding a lock (flock or POSIX),
    read from `/proc/self/fdinfo` ([] without it)."""
    found = []
    try:
        numbers = [int(name) for name in os.listdir("/proc/self/fdinfo")]
    except OSError:
        return []
    for fd in numbers:
        if fd <= 2:
            continue
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            with open(f"/proc/self/fdinfo/{fd}", encoding="ascii") as info:
                fields = info.read()
        except OSError:  # the descriptor of the listing itself, gone by now
            continue
        flags = next((int(line.split()[1], 8) for line in fields.splitlines() if line.startswith("flags:")), 0)
        if flags & os.O_ACCMODE != os.O_RDONLY or "\nlock:" in f"\n{fields}":
            found.append(fd)
    return found
