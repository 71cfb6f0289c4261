"""`nasplat export DIR --format parquet|csv`: an experiment's rows as a flat table, one column per decision."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

from nasplat.engine.result import ExperimentResult

if TYPE_CHECKING:
    import pandas as pd

FORMATS = ("parquet", "csv")


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


def export_rows(folder: str | Path, fmt: str = "parquet", output: str | Path | None = None) -> Path:
    """Write the rows of the experiment in `folder` as `fmt` to `output` (default `<folder>/results.<fmt>`)."""
    if fmt not in FORMATS:
        raise ValueError(f"export format must be one of {list(FORMATS)}, got {fmt!r}")
    result = ExperimentResult.load(folder)
    path = Path(output) if output is not None else Path(folder) / f"results.{fmt}"
    frame = table(result)
    if fmt == "parquet":
        frame.to_parquet(path, index=False)
    else:
        frame.to_csv(path, index=False)
    return path
