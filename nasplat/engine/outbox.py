"""The way out for rows and journal entries: in the order the controller saw them, each row after its checkpoint.

A row whose step is being checkpointed waits (and every later entry with it) until the executor reports the
checkpoint durable or failed. So what reaches the folder is always a prefix of what happened, and a running trial's
last recorded step always has its checkpoint: `nasplat resume` can replay the folder exactly.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from nasplat.storage import ExperimentFolder

Key = tuple[int, int]  # (trial id, step) of a checkpoint


class Outbox:
    """Holds entries until they may go out; `rows` are those recorded, in order. `on_row(row)` is called for each
    row as it goes out (best so far, listeners, progress)."""

    def __init__(self, folder: ExperimentFolder | None, on_row: Callable[[dict[str, Any]], None]) -> None:
        self.folder, self.on_row = folder, on_row
        self.rows: list[dict[str, Any]] = []
        self.waiting: set[Key] = set()  # checkpoints requested and not yet reported
        self.queue: deque[tuple[str, dict[str, Any], Key | None]] = deque()

    def ask(self, entry: dict[str, Any]) -> None:
        """A journal entry: a trial proposed (`ask`) or resumed (`resume`); it records the rows before it."""
        self._put("ask", entry, None)

    def row(self, row: dict[str, Any], wait: Key | None = None) -> None:
        """A row; with `wait`, it goes out once that checkpoint is reported."""
        if wait is not None:
            self.waiting.add(wait)
        self._put("row", row, wait)

    def saved(self, key: Key, uri: str | None, error: str | None = None) -> None:
        """The checkpoint `key` is durable at `uri` (None: its write failed, for the reason `error` if one is
        given): the row waiting for it notes the uri (or `checkpoint_error`) and goes out with everything behind it
        that may."""
        self.waiting.discard(key)
        for kind, item, wait in self.queue:
            if wait == key and uri is not None:
                item["checkpoint"] = uri
            elif wait == key and error is not None:
                item["checkpoint_error"] = error
        self.flush()

    def forget(self, trial_id: int | None = None) -> None:
        """Stop waiting for the checkpoints of `trial_id` (its attempt failed), or for all (the run is closing)."""
        self.waiting = {key for key in self.waiting if trial_id is not None and key[0] != trial_id}
        self.flush()

    def replayed(self, row: dict[str, Any]) -> None:
        """A row recorded before a resume, read back from the folder: counted in `rows`, not written again, no
        `on_row`."""
        self.rows.append(row)

    def flush(self) -> None:
        """Record every entry up to the first that waits for a checkpoint not yet reported."""
        while self.queue and (self.queue[0][2] is None or self.queue[0][2] not in self.waiting):
            kind, item, _ = self.queue.popleft()
            if kind == "ask":
                item["rows"] = len(self.rows)
                if self.folder is not None:
                    self.folder.append_journal(item)
            else:
                self.rows.append(item)
                if self.folder is not None:
                    self.folder.append_row(item)
                self.on_row(item)

    def _put(self, kind: str, item: dict[str, Any], wait: Key | None) -> None:
        self.queue.append((kind, item, wait))
        self.flush()
