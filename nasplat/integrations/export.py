"""`nasplat export DIR --format parquet|csv|pt`: an experiment's rows as a flat table, one column per decision, or
a trial's weights; every export is written atomically, never into an experiment folder, never over a file unasked."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from nasplat.engine.result import ExperimentResult
from nasplat.storage import ROWS_FILE, write_atomic

if TYPE_CHECKING:
    import pandas as pd

FORMATS = ("parquet", "csv")
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
"""A CSV cell starting with one of these is a formula to a spreadsheet (OWASP's CSV injection): it is written
with a single quote in front."""


def table(result: ExperimentResult) -> pd.DataFrame:
    """`result.dataframe(flatten_config=True)` with every column storable as one Parquet type: a column of
    strings, booleans or numbers stays as it is, any other (lists, dicts, mixed types) becomes JSON text."""
    frame = result.dataframe(flatten_config=True)
    for column in frame.columns[frame.dtypes == object]:
        kinds = {type(v) for v in frame[column] if not _missing(v)}
        if len(kinds) > 1 or not kinds <= {str, bool, int, float}:
            frame[column] = [None if _missing(v) else json.dumps(v, default=repr) for v in frame[column]]
    return frame


def _missing(value: object) -> bool:
    """None, or the NaN pandas puts where a row lacks the column (a decision of a branch not taken)."""
    return value is None or isinstance(value, float) and math.isnan(value)


def formula_safe(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy of `frame` for CSV: each text cell and column name that a spreadsheet would run as a formula (it
    starts with `=`, `+`, `-`, `@`, a tab or a carriage return) gets a `'` in front."""

    def safe(value: Any) -> Any:
        return "'" + value if isinstance(value, str) and value.startswith(FORMULA_STARTS) else value

    from pandas.api.types import is_numeric_dtype

    frame = frame.rename(columns=safe)
    for column in frame.columns:
        if not is_numeric_dtype(frame[column]):
            frame[column] = [safe(v) for v in frame[column]]
    return frame


def check_output(output: str | Path, *, force: bool = False) -> Path:
    """`output` if an export may go there: not inside an experiment folder (its rows, journal and checkpoints are
    the experiment's own), and not over an existing file unless `force`; else one-line `ValueError` or
    `FileExistsError`."""
    path = Path(output).expanduser()
    for folder in (path.parent.resolve(), *path.parent.resolve().parents):
        if (folder / ROWS_FILE).exists():
            raise ValueError(f"export output {output} is inside the experiment folder {folder}: nasplat never writes "
                             "an export there; name a file elsewhere with -o")
    if path.is_dir():
        raise IsADirectoryError(f"export output {output} is a folder; name a file with -o")
    if not force and (path.exists() or path.is_symlink()):
        raise FileExistsError(f"export output {output} exists already; pass --force (force=True) to replace it")
    return path


def write_output(output: str | Path, payload: bytes | Callable[[BinaryIO], Any], *, force: bool = False) -> Path:
    """Write an export to `output` (checked by `check_output`) through a temp file beside it and a rename: an
    existing file stays whole if the write fails (a full disk: `StorageError` naming ENOSPC and the path)."""
    path = check_output(output, force=force)
    write_atomic(path, payload, replace=force)
    return path


def export_rows(folder: str | Path, fmt: str = "parquet", output: str | Path | None = None, *,
                force: bool = False) -> Path:
    """Write the rows of the experiment in `folder` as `fmt` to `output` (default `<experiment name>.<fmt>` in the
    current folder); an existing `output` is replaced only with `force`. CSV cells that a spreadsheet would run as
    formulas are escaped (`formula_safe`)."""
    if fmt not in FORMATS:
        raise ValueError(f"export format must be one of {list(FORMATS)}, got {fmt!r}")
    name = Path(str(folder).rstrip("/")).name or "results"
    path = check_output(output if output is not None else f"{name}.{fmt}", force=force)
    frame = table(ExperimentResult.load(folder))
    if fmt == "parquet":
        return write_output(path, lambda f: frame.to_parquet(f, index=False), force=force)
    text = formula_safe(frame).to_csv(index=False, lineterminator="\r\n")  # RFC 4180: a CR in a cell is quoted
    return write_output(path, text.encode("utf-8"), force=force)
