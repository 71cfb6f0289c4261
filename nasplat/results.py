"""The results store (one JSON line per trial step) and the experiment's result object."""

from __future__ import annotations

import json
import math
import os
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import pandas as pd

ROWS_FILE, STATE_FILE, SPEC_FILE = "results.jsonl", "state.pkl", "experiment.pkl"
RESERVED = ("trial_id", "step", "attempt", "status", "config", "parent_id", "donor_id", "start", "end", "node", "pid",
            "error")


class ResultStore:
    """Rows kept in memory and, with a folder, appended to `results.jsonl` as each arrives (flushed)."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        self.rows: list[dict[str, Any]] = []
        self.file = None
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / ROWS_FILE
            if path.exists():
                self.rows = read_rows(path)
            self.file = open(path, "a", encoding="utf-8")

    def append(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if self.file is not None:
            self.file.write(json.dumps(row, default=_json_default, allow_nan=True) + "\n")
            self.file.flush()

    def offset(self) -> int:
        """Bytes written so far: where a consistent snapshot of the experiment ends."""
        return self.file.tell() if self.file is not None else len(self.rows)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def read_rows(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.endswith("\n")]


def truncate_rows(folder: Path, offset: int, drop_trials: set[int]) -> None:
    """Keep the rows written before `offset`, minus those of `drop_trials` (atomically)."""
    path = folder / ROWS_FILE
    if not path.exists():
        return
    with open(path, "rb") as f:
        head = f.read(offset).decode("utf-8")
    kept = [line for line in head.splitlines(keepends=True) if json.loads(line)["trial_id"] not in drop_trials]
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(kept)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_atomic(path: Path, payload: bytes) -> None:
    """Write `payload` to a temp file and rename it over `path`: a reader sees the old or the new file."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_pickle(path: Path) -> Any:
    with open(path, "rb") as f:
        return pickle.load(f)


@dataclass
class ExperimentResult:
    """The rows of a finished (or loaded) experiment, and its best trial by `metric`."""

    rows: list[dict[str, Any]]
    metric: str
    mode: Literal["max", "min"] = "max"
    path: Path | None = None
    trials: dict[int, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, folder: str | Path) -> ExperimentResult:
        """Read an experiment folder written by `nasplat.run(storage=...)`."""
        folder = Path(folder)
        if not (folder / ROWS_FILE).exists():
            raise FileNotFoundError(f"{folder} is not an experiment folder: no {ROWS_FILE} in it")
        meta = json.loads((folder / "meta.json").read_text()) if (folder / "meta.json").exists() else {}
        return cls(read_rows(folder / ROWS_FILE), meta.get("metric", ""), meta.get("mode", "max"), folder)

    def dataframe(self, *, flatten_config: bool = False) -> pd.DataFrame:
        """One row per trial step: trial id, step, status, config, metrics, parent/donor id, times, node, pid.

        `flatten_config=True` replaces the `config` column by one column per decision, `config.<path>`
        (`config.depth.n`, ...); a decision absent from a row's config (a branch not taken) is missing (NaN) there.
        """
        import pandas as pd  # imported here: trial workers never pay for it

        frame = pd.DataFrame(self.rows)
        for column in RESERVED:
            if column not in frame:
                frame[column] = None
        if flatten_config:
            configs = pd.DataFrame([flat_config(c) for c in frame["config"]], index=frame.index)
            at = frame.columns.get_loc("config")
            frame = pd.concat([frame.iloc[:, :at], configs, frame.iloc[:, at + 1:]], axis=1)
        return frame

    def ranked(self) -> list[dict[str, Any]]:
        """The best row of each trial, best trial first (failed rows and missing metrics left out)."""
        best: dict[int, dict[str, Any]] = {}
        for row in self.rows:
            value = row.get(self.metric)
            if row.get("status") == "failed" or not isinstance(value, (int, float)) or not math.isfinite(value):
                continue
            current = best.get(row["trial_id"])
            if current is None or better(value, current[self.metric], self.mode):
                best[row["trial_id"]] = row
        sign = -1 if self.mode == "max" else 1
        return sorted(best.values(), key=lambda r: (sign * r[self.metric], r["trial_id"]))

    @property
    def best(self) -> dict[str, Any] | None:
        """The row with the best `metric` over every trial step, or None if nothing succeeded."""
        ranked = self.ranked()
        return ranked[0] if ranked else None

    def final_status(self) -> dict[int, str]:
        """Each trial's status after its latest row."""
        return {row["trial_id"]: row.get("status", "running") for row in self.rows}

    def counts(self) -> dict[str, int]:
        """Trials per final status."""
        out: dict[str, int] = {}
        for status in self.final_status().values():
            out[status] = out.get(status, 0) + 1
        return out


def flat_config(config: Any, prefix: str = "config.") -> dict[str, Any]:
    """`{"depth": {"n": 2}}` -> `{"config.depth.n": 2}`: one key per decision, nested dicts joined by dots."""
    if not isinstance(config, dict):
        return {prefix.rstrip("."): config}
    out: dict[str, Any] = {}
    for key, value in config.items():
        out.update(flat_config(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


def better(a: float, b: float, mode: str) -> bool:
    """Whether `a` beats `b` under `mode`."""
    return a > b if mode == "max" else a < b


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    return repr(value)
