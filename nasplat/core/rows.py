"""The record's schema: the keys every row carries besides the trainer's metrics, and the statuses of a trial."""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import Any

RESERVED = ("trial_id", "step", "attempt", "status", "config", "parent_id", "donor_id", "start", "end", "node", "pid",
            "error", "checkpoint", "checkpoint_error", "rung",
            "cached_from")
"""Row keys that bookkeeping owns; a trainer's metric of the same name is refused. `checkpoint_error`: the row's
checkpoint was due and could not be written (why), so the row names none."""


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


def retried_steps(rows: Sequence[dict[str, Any]]) -> set[int]:
    """The indices of rows that a retry went back over: a row of attempt `a` at step `s` is void once a later
    attempt of its trial records a row at step `s` or before (it went on from an earlier state, so its step `s` is
    recorded again). Readers mark them `retried`, like the failed step's own row: each step of a trial's final
    attempt then has one live row. Rows without an integer step and attempt are left alone."""

    def key(row: dict[str, Any]) -> tuple[Any, int, int] | None:
        attempt, step = row.get("attempt", 0), row.get("step")
        return (row.get("trial_id"), attempt, step) if isinstance(attempt, int) and isinstance(step, int) else None

    first: dict[Any, dict[int, int]] = {}  # trial -> attempt -> the step of its first row
    for row in rows:
        if (found := key(row)) is not None:
            first.setdefault(found[0], {}).setdefault(found[1], found[2])
    redone: dict[tuple[Any, int], int] = {}  # (trial, attempt) -> the earliest step a later attempt recorded
    for trial, attempts in first.items():
        lowest = None
        for attempt in sorted(attempts, reverse=True):
            if lowest is not None:
                redone[(trial, attempt)] = lowest
            lowest = attempts[attempt] if lowest is None else min(lowest, attempts[attempt])
    return {index for index, row in enumerate(rows) if (found := key(row)) is not None
            and (found[0], found[1]) in redone and found[2] >= redone[(found[0], found[1])]}


def mark_retried(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """`rows` with those of `retried_steps` (copied) marked `retried`; the others as they are."""
    void = retried_steps(rows)
    return [{**row, "status": Status.RETRIED} if index in void and row.get("status") != Status.RETRIED else row
            for index, row in enumerate(rows)]
