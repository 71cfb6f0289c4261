"""What the engine prints to the console: the progress line (at most once a second), messages about the run, and
errors cut to their last line."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from nasplat.core.rows import Status


def progress_line(name: str, counts: Mapping[str, int], best: Mapping[str, Any] | None, metric: str,
                  now: float) -> str:
    """One line: trials done, running, paused and failed (`counts` by status), the best `metric` so far, the clock."""
    best_text = f"best {metric}={best[metric]:.4g} (trial {best['trial_id']})" if best else "no result yet"
    return (f"[nasplat {name}] {counts[Status.COMPLETED] + counts[Status.STOPPED]} done · "
            f"{counts[Status.RUNNING]} running · {counts[Status.PAUSED]} paused · {counts[Status.FAILED]} failed · "
            f"{best_text} · {now:.1f}s")


class ProgressPrinter:
    """Prints the progress line `line()` to stderr at most once a second, and the final one always; on a terminal
    each line overwrites the one before. With `line` None it prints nothing."""

    def __init__(self, line: Callable[[], str] | None) -> None:
        self.line = line
        self.last = 0.0  # `time.monotonic()` of the latest line printed

    def print(self, final: bool = False) -> None:
        """Print the line if a second has passed since the latest (or `final`)."""
        now = time.monotonic()
        if self.line is not None and (final or now - self.last >= 1.0):
            self.last = now
            end = "\n" if final or not sys.stderr.isatty() else "\r"
            print(self.line(), end=end, file=sys.stderr, flush=True)


def last_line(text: str) -> str:
    """The last non-blank line of `text` (an error's traceback: its message), stripped; `text` if it has none."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else text


def say(name: str, message: str) -> None:
    """Print a message about the experiment `name` to stderr, on a line of its own."""
    print(f"[nasplat {name}] {message}", file=sys.stderr, flush=True)
