"""The record's schema: the keys every row carries besides the trainer's metrics, and the statuses of a trial."""

from __future__ import annotations

from enum import Enum

RESERVED = ("trial_id", "step", "attempt", "status", "config", "parent_id", "donor_id", "start", "end", "node", "pid",
            "error", "checkpoint", "rung")
"""Row keys that bookkeeping owns; a trainer's metric of the same name is refused."""


class Status(str, Enum):
    """A trial's status, and the `status` of the row that recorded it. Members are strings (`Status.FAILED ==
    "failed"`), so rows written and read as JSON compare with them directly."""

    RUNNING = "running"  # it goes on to its next step
    PAUSED = "paused"  # it gave its slot back; a scheduler may promote it later
    COMPLETED = "completed"  # it trained `max_steps` (or reported `done`)
    STOPPED = "stopped"  # the controller or scheduler stopped it early
    FAILED = "failed"  # its last attempt failed and no retry is left
    RETRIED = "retried"  # a failed attempt that is retried (a row only, never a trial's status)

    def __str__(self) -> str:
        return self.value

    def __format__(self, format_spec: str) -> str:
        return format(self.value, format_spec)

    @property
    def ended(self) -> bool:
        """Whether a trial with this status is over (completed, stopped or failed)."""
        return self in (Status.COMPLETED, Status.STOPPED, Status.FAILED)
